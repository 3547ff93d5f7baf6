"""One internal form for `resource.k8s.io` v1 / v1beta2 / v1beta1 claims, classes and slices.

Readers are lenient: a field of the wrong type is treated as absent, never raised on, so that the
engine can report what it understands about a malformed object. Writers produce the shape of the
API version the user sent, so that patches apply to the object as sent.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..core.frozen import one_call_init
from .capacity import RequestPolicy, read_policy
from .device import AttrValue, CounterConsumption, Device, Version
from .taints import DeviceToleration, read_taints, read_tolerations

GROUP = "resource.k8s.io"
VERSIONS: tuple[str, ...] = ("v1", "v1beta2", "v1beta1")
DRA_KINDS: frozenset[str] = frozenset(
    {"DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice"}
)

EXACT_COUNT = "ExactCount"
ALL = "All"

# Fields of a request we do not model but must carry through a rewrite unchanged.
# tolerations and capacity are also read (below); derivedAttributes (alpha) is only carried.
_PASSTHROUGH_REQUEST_FIELDS = ("tolerations", "capacity", "derivedAttributes")


# -- reading an object once per evaluation ------------------------------------------------------

# (what, id(object)) -> (object, what was read): held so that the id is not reused while cached.
_MEMO: contextvars.ContextVar[dict[tuple[str, int], tuple[Any, Any]] | None] = contextvars.ContextVar(
    "object_memo", default=None
)


class reading_once:
    """Within the block (one evaluation), each reader wrapped by `read_once` reads an object once.

    Several rules ask the same object for its pod templates or claim spec; the objects do not
    change during an evaluation, and the memo ends with it (nothing is kept across requests).
    A class, not contextlib.contextmanager: it is entered once per review, on the hot path.
    """

    __slots__ = ("_token",)

    def __init__(self) -> None:
        self._token: contextvars.Token[dict[tuple[str, int], tuple[Any, Any]] | None] | None = None

    def __enter__(self) -> None:
        self._token = _MEMO.set({})

    def __exit__(self, *_exc: object) -> None:
        if self._token is not None:
            _MEMO.reset(self._token)
            self._token = None


def read_once(what: str, obj: Any, read: Callable[[Any], Any]) -> Any:
    """`read(obj)`, remembered for `obj` inside `reading_once()` (read each time outside it)."""
    memo = _MEMO.get()
    if memo is None:
        return read(obj)
    key = (what, id(obj))
    hit = memo.get(key)
    if hit is not None and hit[0] is obj:
        return hit[1]
    value = read(obj)
    memo[key] = (obj, value)
    return value


# -- lenient accessors -------------------------------------------------------------------------

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def as_map(value: object) -> Mapping[str, Any]:
    """`value` if it is a mapping, else an empty one."""
    if type(value) is dict:  # the common case, without the slow ABC check
        return value
    if value is None:  # an absent field: the next most common case, also without it
        return _EMPTY
    return value if isinstance(value, Mapping) else _EMPTY


def as_list(value: object) -> Sequence[Any]:
    """`value` if it is a list, else an empty one."""
    if type(value) is list:
        return value
    if value is None:
        return ()
    return value if isinstance(value, list | tuple) else ()


def as_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    return value if isinstance(value, int) else None


def esc(token: str) -> str:
    """Escape one JSON pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def split_api_version(api_version: object) -> tuple[str, str]:
    """("resource.k8s.io", "v1beta1") from "resource.k8s.io/v1beta1"; ("", "v1") for the core group."""
    text = as_str(api_version) or ""
    group, sep, version = text.rpartition("/")
    return (group, version) if sep else ("", text)


_DRA_API_VERSIONS: dict[str, str] = {f"{GROUP}/{v}": v for v in VERSIONS}


def dra_version(api_version: object) -> str | None:
    """The `resource.k8s.io` version ("v1", "v1beta2", "v1beta1") or None for anything else."""
    # Exactly the three texts split_api_version would take apart into this group and a version.
    return _DRA_API_VERSIONS.get(api_version) if isinstance(api_version, str) else None


def is_flat(api_version: object) -> bool:
    """v1beta1 has flat requests (no `exactly`) and the `basic` wrapper on slice devices."""
    return dra_version(api_version) == "v1beta1"


# -- internal form -----------------------------------------------------------------------------


@one_call_init
@dataclass(frozen=True, slots=True)
class Selector:
    expression: str
    pointer: str = ""


@dataclass(frozen=True, slots=True)
class DeviceSubRequest:
    name: str
    device_class: str | None
    selectors: tuple[Selector, ...] = ()
    allocation_mode: str = EXACT_COUNT
    count: int = 1
    pointer: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Whether `count` was written out (so a rewrite keeps the user's spelling).
    count_explicit: bool = True
    tolerations: tuple[DeviceToleration, ...] = ()
    # capacity.requests: qualified capacity name -> quantity text, as written.
    capacity_requests: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """A request; either a single choice (device_class/selectors/count) or `first_available`."""

    name: str
    device_class: str | None
    selectors: tuple[Selector, ...] = ()
    allocation_mode: str = EXACT_COUNT
    count: int = 1
    admin_access: bool = False
    first_available: tuple[DeviceSubRequest, ...] = ()
    pointer: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    count_explicit: bool = True
    tolerations: tuple[DeviceToleration, ...] = ()
    capacity_requests: Mapping[str, str] = field(default_factory=dict)

    def alternatives(self) -> tuple[tuple[str | None, tuple[Selector, ...], str, int, str], ...]:
        """(device_class, selectors, allocation_mode, count, pointer) for each way it can be satisfied."""
        if self.first_available:
            return tuple(
                (s.device_class, s.selectors, s.allocation_mode, s.count, s.pointer)
                for s in self.first_available
            )
        return ((self.device_class, self.selectors, self.allocation_mode, self.count, self.pointer),)

    def device_classes(self) -> tuple[str, ...]:
        return tuple(c for c, *_ in self.alternatives() if c)


@dataclass(frozen=True, slots=True)
class Constraint:
    requests: tuple[str, ...] = ()
    match_attribute: str | None = None
    pointer: str = ""
    distinct_attribute: str | None = None


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    requests: tuple[str, ...]
    driver: str | None
    parameters: Mapping[str, Any]
    pointer: str = ""


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    config: tuple[OpaqueConfig, ...] = ()
    pointer: str = ""

    def request(self, name: str) -> DeviceRequest | None:
        for r in self.requests:
            if r.name == name:
                return r
        return None

    def covers(self, constraint_requests: Sequence[str]) -> tuple[DeviceRequest, ...]:
        """Requests a constraint/config applies to (all when its list is empty)."""
        if not constraint_requests:
            return self.requests
        wanted = {r.split("/", 1)[0] for r in constraint_requests}
        return tuple(r for r in self.requests if r.name in wanted)


@one_call_init
@dataclass(frozen=True, slots=True)
class DeviceClassSpec:
    name: str
    selectors: tuple[Selector, ...] = ()
    config: tuple[OpaqueConfig, ...] = ()
    extended_resource_name: str | None = None
    api_version: str = f"{GROUP}/v1"


# -- readers -----------------------------------------------------------------------------------


def _read_selectors(raw: object, pointer: str) -> tuple[Selector, ...]:
    out: list[Selector] = []
    for i, sel in enumerate(as_list(raw)):
        expr = as_str(as_map(as_map(sel).get("cel")).get("expression"))
        if expr is not None:
            out.append(Selector(expr, f"{pointer}/{i}/cel/expression"))
    return tuple(out)


def _count(raw: Mapping[str, Any], mode: str) -> int:
    count = as_int(raw.get("count"))
    if count is None or (count == 0 and mode == EXACT_COUNT):
        # 0 is the unset value: the API server defaults an ExactCount request to 1 device.
        return 0 if mode == ALL else 1
    return count


def _extra(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: raw[k] for k in _PASSTHROUGH_REQUEST_FIELDS if k in raw}


def _capacity_requests(raw: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, q in as_map(as_map(raw.get("capacity")).get("requests")).items():
        if isinstance(q, int | float) and not isinstance(q, bool):
            q = str(q)
        if isinstance(key, str) and isinstance(q, str):
            out[key] = q
    return out


def _read_subrequests(raw: object, pointer: str) -> tuple[DeviceSubRequest, ...]:
    out: list[DeviceSubRequest] = []
    for i, item in enumerate(as_list(raw)):
        sub = as_map(item)
        p = f"{pointer}/{i}"
        mode = as_str(sub.get("allocationMode")) or EXACT_COUNT
        out.append(
            DeviceSubRequest(
                name=as_str(sub.get("name")) or "",
                device_class=as_str(sub.get("deviceClassName")),
                selectors=_read_selectors(sub.get("selectors"), f"{p}/selectors"),
                allocation_mode=mode,
                count=_count(sub, mode),
                pointer=p,
                extra=_extra(sub),
                count_explicit="count" in sub,
                tolerations=read_tolerations(sub.get("tolerations")),
                capacity_requests=_capacity_requests(sub),
            )
        )
    return tuple(out)


def _read_request(raw: Mapping[str, Any], flat: bool, p: str) -> DeviceRequest:
    name = as_str(raw.get("name")) or ""
    if "firstAvailable" in raw:
        return DeviceRequest(
            name=name,
            device_class=None,
            first_available=_read_subrequests(raw.get("firstAvailable"), f"{p}/firstAvailable"),
            pointer=p,
        )
    # v1/v1beta2 put the single choice under `exactly`; accept the flat form there too (it is what
    # v1beta1 users paste), so the engine still sees the request.
    body: Mapping[str, Any]
    bp: str
    if not flat and isinstance(raw.get("exactly"), Mapping):
        body, bp = raw["exactly"], f"{p}/exactly"
    else:
        body, bp = raw, p
    mode = as_str(body.get("allocationMode")) or EXACT_COUNT
    return DeviceRequest(
        name=name,
        device_class=as_str(body.get("deviceClassName")),
        selectors=_read_selectors(body.get("selectors"), f"{bp}/selectors"),
        allocation_mode=mode,
        count=_count(body, mode),
        admin_access=body.get("adminAccess") is True,
        pointer=bp,
        extra=_extra(body),
        count_explicit="count" in body,
        tolerations=read_tolerations(body.get("tolerations")),
        capacity_requests=_capacity_requests(body),
    )


def _read_configs(raw: object, pointer: str) -> tuple[OpaqueConfig, ...]:
    out: list[OpaqueConfig] = []
    for i, item in enumerate(as_list(raw)):
        cfg = as_map(item)
        opaque = cfg.get("opaque")
        if not isinstance(opaque, Mapping):
            continue
        out.append(
            OpaqueConfig(
                requests=tuple(r for r in as_list(cfg.get("requests")) if isinstance(r, str)),
                driver=as_str(opaque.get("driver")),
                parameters=as_map(opaque.get("parameters")),
                pointer=f"{pointer}/{i}/opaque",
            )
        )
    return tuple(out)


def read_claim_spec(spec: object, api_version: object, pointer_prefix: str = "/spec") -> ClaimSpec:
    """Read a ResourceClaimSpec (`{devices: {...}}`) of any served version."""
    flat = is_flat(api_version)
    devices = as_map(as_map(spec).get("devices"))
    dp = f"{pointer_prefix}/devices"
    requests = tuple(
        _read_request(as_map(r), flat, f"{dp}/requests/{i}")
        for i, r in enumerate(as_list(devices.get("requests")))
    )
    constraints: list[Constraint] = []
    for i, item in enumerate(as_list(devices.get("constraints"))):
        c = as_map(item)
        constraints.append(
            Constraint(
                requests=tuple(r for r in as_list(c.get("requests")) if isinstance(r, str)),
                match_attribute=as_str(c.get("matchAttribute")),
                pointer=f"{dp}/constraints/{i}",
                distinct_attribute=as_str(c.get("distinctAttribute")),
            )
        )
    return ClaimSpec(
        requests=requests,
        constraints=tuple(constraints),
        config=_read_configs(devices.get("config"), f"{dp}/config"),
        pointer=pointer_prefix,
    )


def claim_spec_of(obj: Mapping[str, Any]) -> tuple[ClaimSpec, str] | None:
    """The claim spec of a ResourceClaim or ResourceClaimTemplate, with its pointer; None otherwise."""
    found: tuple[ClaimSpec, str] | None = read_once("claim_spec", obj, _claim_spec_of)
    return found


def _claim_spec_of(obj: Mapping[str, Any]) -> tuple[ClaimSpec, str] | None:
    kind = obj.get("kind")
    if dra_version(obj.get("apiVersion")) is None:
        return None
    if kind == "ResourceClaim":
        return read_claim_spec(obj.get("spec"), obj.get("apiVersion"), "/spec"), "/spec"
    if kind == "ResourceClaimTemplate":
        inner = as_map(obj.get("spec")).get("spec")
        return read_claim_spec(inner, obj.get("apiVersion"), "/spec/spec"), "/spec/spec"
    return None


def read_device_class(obj: Mapping[str, Any]) -> DeviceClassSpec:
    """Read a DeviceClass of any served version (once per evaluation: see `reading_once`)."""
    found: DeviceClassSpec = read_once("device_class", obj, _read_device_class)
    return found


def _read_device_class(obj: Mapping[str, Any]) -> DeviceClassSpec:
    spec = as_map(obj.get("spec"))
    return DeviceClassSpec(
        name=as_str(as_map(obj.get("metadata")).get("name")) or "",
        selectors=_read_selectors(spec.get("selectors"), "/spec/selectors"),
        config=_read_configs(spec.get("config"), "/spec/config"),
        extended_resource_name=as_str(spec.get("extendedResourceName")),
        api_version=as_str(obj.get("apiVersion")) or f"{GROUP}/v1",
    )


_ATTR_KEYS: tuple[tuple[str, str], ...] = (
    ("string", "string"),
    ("int", "int"),
    ("bool", "bool"),
    ("version", "version"),
    # The pre-1.31 spelling some tools still print (and the seed's jq examples use).
    ("stringValue", "string"),
    ("intValue", "int"),
    ("boolValue", "bool"),
    ("versionValue", "version"),
)


def _attr_value(raw: object) -> AttrValue | None:
    m = as_map(raw)
    for key, typ in _ATTR_KEYS:
        if key not in m:
            continue
        v = m[key]
        if typ == "string" and isinstance(v, str):
            return v
        if typ == "int" and as_int(v) is not None:
            return int(v)
        if typ == "bool" and isinstance(v, bool):
            return v
        if typ == "version" and isinstance(v, str):
            return Version(v)
    return None


def qualify(key: str, driver: str) -> tuple[str, str]:
    """(domain, name) of an attribute key; a key without a domain belongs to the driver."""
    domain, sep, name = key.rpartition("/")
    return (domain, name) if sep else (driver, key)


_LIST_ATTR_KEYS: tuple[tuple[str, str], ...] = (
    ("strings", "string"),
    ("ints", "int"),
    ("bools", "bool"),
    ("versions", "version"),
)


def _list_attr_value(raw: object) -> tuple[AttrValue, ...] | None:
    """A list-typed attribute (KEP-5491); None when `raw` is not one."""
    m = as_map(raw)
    for key, typ in _LIST_ATTR_KEYS:
        if key not in m:
            continue
        out = [_attr_value({typ: v}) for v in as_list(m[key])]
        return tuple(v for v in out if v is not None)
    return None


def _quantity_text(raw: object) -> str | None:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return str(raw)
    return raw if isinstance(raw, str) else None


def _counters(raw: object) -> dict[str, str]:
    """{counter: quantity text} from a `counters` map of `{value: q}` entries."""
    out: dict[str, str] = {}
    for name, entry in as_map(raw).items():
        q = _quantity_text(as_map(entry).get("value"))
        if isinstance(name, str) and q is not None:
            out[name] = q
    return out


def read_slice_counters(obj: Mapping[str, Any]) -> tuple[str, str, dict[str, dict[str, str]]]:
    """(driver, pool, {counter set: {counter: quantity}}) of a ResourceSlice's `sharedCounters`.

    Since 1.35 counters are published in slices of their own; the devices of other slices of the
    same pool consume them, so sets are keyed by (driver, pool, set name).
    """
    spec = as_map(obj.get("spec"))
    sets: dict[str, dict[str, str]] = {}
    for item in as_list(spec.get("sharedCounters")):
        entry = as_map(item)
        name = as_str(entry.get("name"))
        if name:
            sets[name] = _counters(entry.get("counters"))
    return as_str(spec.get("driver")) or "", as_str(as_map(spec.get("pool")).get("name")) or "", sets


def read_slice_devices(obj: Mapping[str, Any]) -> list[Device]:
    """Devices of a ResourceSlice of any served version (v1beta1 `basic` wrapper included)."""
    spec = as_map(obj.get("spec"))
    driver = as_str(spec.get("driver")) or ""
    pool = as_str(as_map(spec.get("pool")).get("name")) or ""
    slice_node = as_str(spec.get("nodeName"))
    slice_selector = spec.get("nodeSelector") if isinstance(spec.get("nodeSelector"), Mapping) else None
    slice_all = spec.get("allNodes") is True
    out: list[Device] = []
    for item in as_list(spec.get("devices")):
        entry = as_map(item)
        body = as_map(entry.get("basic")) if "basic" in entry else entry
        attributes: dict[str, dict[str, AttrValue]] = {}
        lists: dict[str, dict[str, tuple[AttrValue, ...]]] = {}
        for key, raw in as_map(body.get("attributes")).items():
            if not isinstance(key, str):
                continue
            domain, name = qualify(key, driver)
            value = _attr_value(raw)
            if value is not None:
                attributes.setdefault(domain, {})[name] = value
                continue
            values = _list_attr_value(raw)
            if values is not None:
                lists.setdefault(domain, {})[name] = values
        capacity: dict[str, dict[str, str]] = {}
        policies: dict[str, dict[str, RequestPolicy]] = {}
        for key, raw in as_map(body.get("capacity")).items():
            if not isinstance(key, str):
                continue
            # {value: q} since v1beta1; a bare quantity in v1alpha3-era output.
            q = _quantity_text(raw.get("value") if isinstance(raw, Mapping) else raw)
            if q is None:
                continue
            domain, name = qualify(key, driver)
            capacity.setdefault(domain, {})[name] = q
            policy = read_policy(as_map(raw).get("requestPolicy"))
            if policy is not None:
                policies.setdefault(domain, {})[name] = policy
        consumes = tuple(
            CounterConsumption(
                as_str(as_map(c).get("counterSet")) or "", _counters(as_map(c).get("counters"))
            )
            for c in as_list(body.get("consumesCounters"))
        )
        # The slice's node scope, or (perDeviceNodeSelection) the device's own.
        node = slice_node if slice_node is not None else as_str(body.get("nodeName"))
        selector = body.get("nodeSelector") if isinstance(body.get("nodeSelector"), Mapping) else None
        out.append(
            Device(
                driver=driver,
                pool=pool,
                name=as_str(entry.get("name")) or "",
                node=node,
                attributes=attributes,
                capacity=capacity,
                allow_multiple_allocations=body.get("allowMultipleAllocations") is True,
                consumes_counters=consumes,
                taints=read_taints(body.get("taints")),
                capacity_policy=policies,
                node_selector=slice_selector if slice_selector is not None else selector,
                all_nodes=slice_all or body.get("allNodes") is True,
                binds_to_node=body.get("bindsToNode") is True,
                binding_conditions=tuple(
                    c for c in as_list(body.get("bindingConditions")) if isinstance(c, str)
                ),
                binding_failure_conditions=tuple(
                    c for c in as_list(body.get("bindingFailureConditions")) if isinstance(c, str)
                ),
                list_attributes=lists,
                raw=entry,
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One entry of a claim's `status.allocation.devices.results`."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)


def read_allocation(obj: Mapping[str, Any]) -> tuple[AllocatedDevice, ...]:
    """The devices a ResourceClaim's status says are allocated to it (empty when not allocated)."""
    alloc = as_map(as_map(obj.get("status")).get("allocation"))
    out: list[AllocatedDevice] = []
    for item in as_list(as_map(alloc.get("devices")).get("results")):
        r = as_map(item)
        consumed: dict[str, str] = {}
        for key, q in as_map(r.get("consumedCapacity")).items():
            text = _quantity_text(q)
            if isinstance(key, str) and text is not None:
                consumed[key] = text
        out.append(
            AllocatedDevice(
                request=as_str(r.get("request")) or "",
                driver=as_str(r.get("driver")) or "",
                pool=as_str(r.get("pool")) or "",
                device=as_str(r.get("device")) or "",
                admin_access=r.get("adminAccess") is True,
                share_id=as_str(r.get("shareID")),
                consumed_capacity=consumed,
            )
        )
    return tuple(out)


# -- writers -----------------------------------------------------------------------------------


def _write_selectors(selectors: Sequence[Selector]) -> list[dict[str, Any]]:
    return [{"cel": {"expression": s.expression}} for s in selectors]


def _write_choice(
    device_class: str | None,
    selectors: Sequence[Selector],
    mode: str,
    count: int,
    extra: Mapping[str, Any],
    count_explicit: bool = True,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if device_class is not None:
        out["deviceClassName"] = device_class
    if selectors:
        out["selectors"] = _write_selectors(selectors)
    if mode != EXACT_COUNT:
        out["allocationMode"] = mode
    if mode == EXACT_COUNT and (count_explicit or count != 1):
        out["count"] = count
    out.update(extra)
    return out


def write_request(req: DeviceRequest, api_version: str) -> dict[str, Any]:
    flat = is_flat(api_version)
    out: dict[str, Any] = {"name": req.name}
    if req.first_available:
        subs = []
        for s in req.first_available:
            sub = {"name": s.name}
            sub.update(
                _write_choice(
                    s.device_class, s.selectors, s.allocation_mode, s.count, s.extra, s.count_explicit
                )
            )
            subs.append(sub)
        out["firstAvailable"] = subs
        return out
    body = _write_choice(
        req.device_class, req.selectors, req.allocation_mode, req.count, req.extra, req.count_explicit
    )
    if req.admin_access:
        body["adminAccess"] = True
    if flat:
        out.update(body)
    else:
        out["exactly"] = body
    return out


def write_claim_spec(spec: ClaimSpec, api_version: str) -> dict[str, Any]:
    """A ResourceClaimSpec dict (`{devices: {...}}`) in the shape of `api_version`."""
    devices: dict[str, Any] = {"requests": [write_request(r, api_version) for r in spec.requests]}
    if spec.constraints:
        cons = []
        for c in spec.constraints:
            entry: dict[str, Any] = {}
            if c.requests:
                entry["requests"] = list(c.requests)
            if c.match_attribute is not None:
                entry["matchAttribute"] = c.match_attribute
            if c.distinct_attribute is not None:
                entry["distinctAttribute"] = c.distinct_attribute
            cons.append(entry)
        devices["constraints"] = cons
    if spec.config:
        cfgs = []
        for cfg in spec.config:
            e: dict[str, Any] = {}
            if cfg.requests:
                e["requests"] = list(cfg.requests)
            e["opaque"] = {"driver": cfg.driver, "parameters": dict(cfg.parameters)}
            cfgs.append(e)
        devices["config"] = cfgs
    return {"devices": devices}


def claim_template(
    name: str,
    namespace: str | None,
    spec: ClaimSpec,
    api_version: str,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A complete ResourceClaimTemplate object in `api_version`."""
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = {"app.kubernetes.io/managed-by": "draguard", **(labels or {})}
    return {
        "apiVersion": api_version,
        "kind": "ResourceClaimTemplate",
        "metadata": meta,
        "spec": {"spec": write_claim_spec(spec, api_version)},
    }


def convert_claim_spec(raw_spec: object, from_version: str, to_version: str) -> dict[str, Any]:
    """Rewrite a raw ResourceClaimSpec from one served version's shape to another's."""
    return write_claim_spec(read_claim_spec(raw_spec, from_version, ""), to_version)


# -- what the API server rejects ---------------------------------------------------------------

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MAX_REQUESTS = 32
# Request-level fields of the other shape: v1/v1beta2 keep these under `exactly`.
_EXACT_FIELDS = ("deviceClassName", "count", "allocationMode", "selectors", "adminAccess")


@dataclass(frozen=True, slots=True)
class SpecProblem:
    """One reason the API server rejects a claim spec: the field as the API server names it
    (`spec.devices.requests[0].exactly.count`), its JSON pointer, and why."""

    field: str
    pointer: str
    message: str


def _dotted(pointer: str) -> str:
    out = ""
    for part in pointer.strip("/").split("/"):
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


def _add(out: list[SpecProblem], pointer: str, message: str) -> None:
    out.append(SpecProblem(_dotted(pointer), pointer, message))


def _check_name(name: object, ptr: str, what: str, seen: set[str], out: list[SpecProblem]) -> None:
    if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.match(name):
        label = "a lowercase RFC 1123 label (a-z, 0-9, '-', <= 63)"
        _add(out, f"{ptr}/name", f"{what} name {name!r} is not {label}")
    elif name in seen:
        _add(out, ptr, f"{what} name {name!r} is used twice; names must be unique")
    else:
        seen.add(name)


def _check_exact(body: Mapping[str, Any], ptr: str, out: list[SpecProblem]) -> None:
    if not as_str(body.get("deviceClassName")):
        _add(out, f"{ptr}/deviceClassName", "deviceClassName is required")
    mode = body.get("allocationMode")
    count = body.get("count")
    if mode not in (None, "", EXACT_COUNT, ALL):
        _add(out, f"{ptr}/allocationMode", f"allocationMode {mode!r} is not supported: use ExactCount or All")
    elif mode == ALL and count not in (None, 0):
        _add(out, f"{ptr}/count", f"count {count!r} must not be set when allocationMode is All")
    elif isinstance(count, int) and not isinstance(count, bool) and count < 0:
        # 0 is the unset value: the API server defaults it to 1.
        _add(out, f"{ptr}/count", f"count {count} must be greater than zero")
    for k, sel in enumerate(as_list(body.get("selectors"))):
        sp = f"{ptr}/selectors/{k}"
        cel = as_map(sel).get("cel")
        if not isinstance(cel, Mapping):
            stray = "expression" in as_map(sel)
            _add(out, f"{sp}/cel", "cel is required: a selector is `cel: {expression: <CEL>}`"
                 + ("; `expression` sits beside `cel:` here: indent it under `cel:`" if stray else ""))
        elif cel.get("expression") is None or cel.get("expression") == "":
            # A value of another type is a decoding error (structure/schema names the type).
            _add(out, f"{sp}/cel/expression", "expression is required: a CEL expression that selects devices")


def claim_spec_problems(
    spec: object, api_version: object, pointer_prefix: str = "/spec"
) -> list[SpecProblem]:
    """What the API server's validation (and kubectl's strict field check) rejects in a claim spec.

    Checked against kube-apiserver v1.37 dry-runs (tests/e2e/test_rejected_shapes.py): the v1
    request shape in v1beta1 and the reverse, a missing deviceClassName, counts below zero or set
    with All, unknown allocation modes, invalid or duplicate request and subrequest names, more than
    32 requests, and constraints naming a request the claim does not have.
    """
    out: list[SpecProblem] = []
    version = dra_version(api_version)
    if version is None:
        return out
    flat = version == "v1beta1"
    devices = as_map(as_map(spec).get("devices"))
    dp = f"{pointer_prefix}/devices"
    raw_requests = as_list(devices.get("requests"))
    if len(raw_requests) > _MAX_REQUESTS:
        _add(out, f"{dp}/requests", f"{len(raw_requests)} requests: at most {_MAX_REQUESTS} are allowed")
    seen: set[str] = set()
    subs_of: dict[str, set[str]] = {}
    for i, item in enumerate(raw_requests):
        ptr = f"{dp}/requests/{i}"
        raw = as_map(item)
        _check_name(raw.get("name"), ptr, "request", seen, out)
        subs = subs_of.setdefault(str(raw.get("name")), set())
        if flat and "exactly" in raw:
            _add(out, f"{ptr}/exactly", f"`exactly` is not a field of {GROUP}/v1beta1: put deviceClassName, "
                 f"count and selectors directly in the request, or use apiVersion {GROUP}/v1")  # fmt: skip
            continue
        if not flat:
            stray = [k for k in _EXACT_FIELDS if k in raw]
            if stray:
                _add(out, f"{ptr}/{stray[0]}", f"{', '.join(stray)} belong under `exactly:` in "
                     f"{GROUP}/{version} (this is the {GROUP}/v1beta1 request shape)")  # fmt: skip
                continue
            if ("exactly" in raw) == ("firstAvailable" in raw):
                both = "exactly" in raw
                _add(out, ptr, "exactly one of `exactly` or `firstAvailable` is "
                     + ("allowed, both are set" if both else "required"))  # fmt: skip
                continue
        if "firstAvailable" in raw:
            sub_seen: set[str] = set()
            for j, sub_item in enumerate(as_list(raw.get("firstAvailable"))):
                sp = f"{ptr}/firstAvailable/{j}"
                sub = as_map(sub_item)
                _check_name(sub.get("name"), sp, "subrequest", sub_seen, out)
                _check_exact(sub, sp, out)
            subs.update(sub_seen)
            continue
        _check_exact(raw if flat else as_map(raw.get("exactly")), ptr if flat else f"{ptr}/exactly", out)
    for i, item in enumerate(as_list(devices.get("constraints"))):
        for j, ref in enumerate(as_list(as_map(item).get("requests"))):
            top, _, subname = str(ref).partition("/")
            if top not in seen or (subname and subname not in subs_of.get(top, set())):
                cp = f"{dp}/constraints/{i}/requests/{j}"
                _add(out, cp, f"{ref!r} is not a request (or request/subrequest) of this claim")
    return out


def claim_problems(obj: Mapping[str, Any]) -> list[SpecProblem]:
    """`claim_spec_problems` of a ResourceClaim or ResourceClaimTemplate object; [] for other objects."""
    kind = obj.get("kind")
    if kind == "ResourceClaim":
        return claim_spec_problems(obj.get("spec"), obj.get("apiVersion"), "/spec")
    if kind == "ResourceClaimTemplate":
        return claim_spec_problems(as_map(obj.get("spec")).get("spec"), obj.get("apiVersion"), "/spec/spec")
    return []
