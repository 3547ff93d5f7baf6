"""Build, validate and publish the node's ResourceSlices.

Writers exist for resource.k8s.io/v1 (and v1beta2, same shape) and v1beta1 (each device wrapped in
`basic`). Slices are checked locally against the API server's limits before anything is sent, so
a bad attribute shows up as a clear local error instead of a rejected pool. The publisher talks to
the API through the `kubernetes` client's ApiClient with plain dicts, discovers which versions the
server offers, and retries with backoff while the server is unavailable.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .devices import DriverDevice, is_strict_semver
from .kube import KubeHTTPError
from .kube import request as kube_request

log = logging.getLogger("draguard.driver.slices")

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1")  # preference order
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_WITH_COUNTERS = 64  # a slice whose devices consume counters holds at most this many
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_ATTRS_PER_DEVICE = 32
MAX_VALUE_LEN = 64
MANAGED_BY = {"app.kubernetes.io/managed-by": "draguard"}
SIMULATED_ANNOTATION = "draguard.io/simulated-nvml"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?$")


def format_quantity(n: int) -> str:
    """An integer as a Kubernetes BinarySI quantity: 85899345920 → `80Gi`, 42 → `42`."""
    if n == 0:
        return "0"
    for suffix, power in (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n % (1 << power) == 0:
            return f"{n >> power}{suffix}"
    return str(n)


def _attr_value(kind: str, value: Any) -> dict[str, Any]:
    return {kind: value}


def device_to_api(dev: DriverDevice, version: str) -> dict[str, Any]:
    """One device in the wire form of `version`."""
    body: dict[str, Any] = {
        "attributes": {k: _attr_value(kind, v) for k, (kind, v) in sorted(dev.attributes.items())},
        "capacity": {k: {"value": format_quantity(v)} for k, v in sorted(dev.capacity.items())},
    }
    policy = dev.memory_policy()
    if policy is not None:  # shared by consumable capacity (KEP-5075): several claims, each its share
        body["allowMultipleAllocations"] = True
        body["capacity"]["memory"]["requestPolicy"] = _quantities(policy)
    if dev.counter_set is not None:  # dynamic MIG (KEP-4815): what the device takes of its GPU
        use = {"counterSet": dev.counter_set, "counters": _counter_values(dev.consumes)}
        body["consumesCounters"] = [use]
    if dev.taints:
        body["taints"] = [dict(t) for t in dev.taints]
    if version == "v1beta1":
        return {"name": dev.name, "basic": body}
    return {"name": dev.name, **body}


def _quantities(policy: dict[str, Any]) -> dict[str, Any]:
    """A request policy with its byte counts written as quantities (nested maps kept)."""
    return {k: _quantities(v) if isinstance(v, dict) else format_quantity(int(v)) for k, v in policy.items()}


def _counter_values(counters: Sequence[tuple[str, int]]) -> dict[str, dict[str, str]]:
    return {k: {"value": format_quantity(v)} for k, v in counters}


def counter_sets(devices: Sequence[DriverDevice]) -> list[dict[str, Any]]:
    """The counter sets of the dynamic-MIG GPUs: each full GPU consumes exactly its set's totals."""
    return [
        {"name": d.counter_set, "counters": _counter_values(d.consumes)}
        for d in devices
        if d.type == "gpu" and d.counter_set is not None
    ]


def slice_devices(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Devices of a slice in the flat (v1) form, whatever version it was written in."""
    out = []
    for d in (obj.get("spec") or {}).get("devices") or []:
        if "basic" in d:
            out.append({"name": d.get("name"), **(d.get("basic") or {})})
        else:
            out.append(dict(d))
    return out


def build_slices(
    devices: Sequence[DriverDevice],
    *,
    node_name: str,
    driver_name: str,
    generation: int,
    version: str = "v1",
    owner: dict[str, Any] | None = None,
    max_per_slice: int = MAX_DEVICES_PER_SLICE,
    simulated_source: str | None = None,
) -> list[dict[str, Any]]:
    """Split the devices into slices of at most `max_per_slice`; pool name = node name."""
    if version not in VERSIONS:
        raise ValueError(f"unknown resource.k8s.io version {version!r} (known: {', '.join(VERSIONS)})")
    sets = counter_sets(devices)
    if sets and version == "v1beta1":
        raise ValueError(
            "dynamic MIG publishes counter sets in slices of their own, which needs resource.k8s.io v1 or "
            "v1beta2 (Kubernetes 1.35 or later); use --api-version v1"
        )
    if sets:
        max_per_slice = min(max_per_slice, MAX_DEVICES_WITH_COUNTERS)
    # Kubernetes 1.35+: a slice holds counters or devices, never both; the counter sets come first.
    per = MAX_COUNTER_SETS_PER_SLICE
    groups = [sets[i : i + per] for i in range(0, len(sets), per)]
    chunks = [list(devices[i : i + max_per_slice]) for i in range(0, len(devices), max_per_slice)]
    total = len(groups) + len(chunks)
    out = []
    for group in groups:
        cmeta: dict[str, Any] = {"generateName": f"{node_name}-{driver_name}-", "labels": dict(MANAGED_BY)}
        if owner:
            cmeta["ownerReferences"] = [owner]
        out.append(
            {
                "apiVersion": f"{GROUP}/{version}",
                "kind": "ResourceSlice",
                "metadata": cmeta,
                "spec": {
                    "driver": driver_name,
                    "nodeName": node_name,
                    "pool": {"name": node_name, "generation": generation, "resourceSliceCount": total},
                    "sharedCounters": group,
                },
            }
        )
    for chunk in chunks:
        meta: dict[str, Any] = {"generateName": f"{node_name}-{driver_name}-", "labels": dict(MANAGED_BY)}
        if owner:
            meta["ownerReferences"] = [owner]
        if simulated_source:
            meta["annotations"] = {SIMULATED_ANNOTATION: simulated_source[-200:]}
        out.append(
            {
                "apiVersion": f"{GROUP}/{version}",
                "kind": "ResourceSlice",
                "metadata": meta,
                "spec": {
                    "driver": driver_name,
                    "nodeName": node_name,
                    "pool": {"name": node_name, "generation": generation, "resourceSliceCount": total},
                    "devices": [device_to_api(d, version) for d in chunk],
                },
            }
        )
    return out


class SliceValidationError(ValueError):
    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("ResourceSlice would be rejected: " + "; ".join(errors))


def _check_key(key: str, where: str, errs: list[str]) -> None:
    domain, sep, ident = key.rpartition("/")
    if sep and (len(domain) > 63 or not _DNS_SUBDOMAIN.match(domain)):
        errs.append(f"{where}: domain {domain!r} must be a DNS subdomain of at most 63 characters")
    if len(ident) > 32 or not _C_IDENT.match(ident):
        errs.append(f"{where}: name {ident!r} must be a C identifier of at most 32 characters")


def validate_slice(obj: dict[str, Any]) -> list[str]:
    """The API server's ResourceSlice rules that a driver can break; returns readable problems."""
    errs: list[str] = []
    spec = obj.get("spec") or {}
    driver = spec.get("driver", "")
    if not isinstance(driver, str) or len(driver) > 63 or not _DNS_SUBDOMAIN.match(driver):
        errs.append(f"spec.driver {driver!r}: must be a DNS subdomain of at most 63 characters")
    pool = spec.get("pool") or {}
    pname = pool.get("name", "")
    if (
        not isinstance(pname, str)
        or not pname
        or len(pname) > 253
        or not all(_DNS_SUBDOMAIN.match(p) for p in pname.split("/"))
    ):
        errs.append(f"spec.pool.name {pname!r}: must be '/'-separated DNS subdomains, at most 253 characters")
    if not isinstance(pool.get("generation"), int) or pool["generation"] < 0:
        errs.append("spec.pool.generation: must be an integer >= 0")
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
        errs.append("spec.pool.resourceSliceCount: must be > 0")
    if not spec.get("nodeName"):
        errs.append("spec.nodeName: required for a node-local pool")
    devices = slice_devices(obj)
    if len(devices) > MAX_DEVICES_PER_SLICE:
        errs.append(f"spec.devices: {len(devices)} devices, at most {MAX_DEVICES_PER_SLICE} per slice")
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        name = dev.get("name") or ""
        where = f"spec.devices[{i}] ({name})"
        if len(name) > 63 or not _DNS_LABEL.match(name):
            errs.append(f"{where}: device name must be a DNS label (lowercase a-z, 0-9, '-', at most 63)")
        if name in seen:
            errs.append(f"{where}: duplicate device name")
        seen.add(name)
        attrs = dev.get("attributes") or {}
        cap = dev.get("capacity") or {}
        if len(attrs) + len(cap) > MAX_ATTRS_PER_DEVICE:
            errs.append(
                f"{where}: {len(attrs) + len(cap)} attributes + capacities, at most {MAX_ATTRS_PER_DEVICE}"
            )
        for key, val in attrs.items():
            aw = f"{where}.attributes[{key}]"
            _check_key(key, aw, errs)
            if not isinstance(val, dict) or len(val) != 1:
                errs.append(f"{aw}: exactly one of string, int, bool, version must be set")
                continue
            ((kind, v),) = val.items()
            if kind in ("string", "version"):
                if not isinstance(v, str) or len(v) > MAX_VALUE_LEN:
                    errs.append(f"{aw}: {kind} value must be at most {MAX_VALUE_LEN} characters")
                elif kind == "version" and not is_strict_semver(v):
                    errs.append(f"{aw}: {v!r} is not strict semver (X.Y.Z, no leading zeros)")
            elif kind == "int":
                if not isinstance(v, int) or isinstance(v, bool):
                    errs.append(f"{aw}: int value must be an integer")
            elif kind == "bool":
                if not isinstance(v, bool):
                    errs.append(f"{aw}: bool value must be true or false")
            else:
                errs.append(f"{aw}: unknown value type {kind!r}")
        for key, val in cap.items():
            cw = f"{where}.capacity[{key}]"
            _check_key(key, cw, errs)
            q = val.get("value") if isinstance(val, dict) else None
            if not isinstance(q, str) or not _QUANTITY.match(q):
                errs.append(f"{cw}: value must be a quantity string, got {q!r}")
            elif isinstance(val, dict) and "requestPolicy" in val:
                if dev.get("allowMultipleAllocations") is not True:
                    errs.append(f"{cw}.requestPolicy: only allowed with allowMultipleAllocations: true")
                _check_policy(val["requestPolicy"], q, cw, errs)
    return errs


def _check_policy(policy: Any, value: str, where: str, errs: list[str]) -> None:
    """The API server's rules for a capacity's request policy (a default within a valid range)."""
    from .sharing import QuantityError, parse_quantity

    pw = f"{where}.requestPolicy"
    rng = policy.get("validRange") if isinstance(policy, dict) else None
    if not isinstance(rng, dict) or "default" not in policy:
        errs.append(f"{pw}: this driver publishes a default and a validRange")
        return
    try:
        total = parse_quantity(value)
        default, low = parse_quantity(policy["default"]), parse_quantity(rng.get("min"))
        high = parse_quantity(rng["max"]) if "max" in rng else total
        step = parse_quantity(rng["step"]) if "step" in rng else None
    except QuantityError as exc:
        errs.append(f"{pw}: {exc}")
        return
    if not low <= high <= total:
        errs.append(f"{pw}.validRange: needs min <= max <= the capacity's value ({value})")
    if not low <= default <= high:
        errs.append(f"{pw}.default: must lie within validRange")
    for name, amount in (("default", default), ("validRange.max", high)):
        if step is not None and (step <= 0 or (amount - low) % step):
            errs.append(f"{pw}.{name}: must be validRange.min plus a whole number of steps")


def validate_slices(slices: Sequence[dict[str, Any]]) -> None:
    errs: list[str] = []
    for i, s in enumerate(slices):
        errs.extend(f"slice {i}: {e}" for e in validate_slice(s))
    if errs:
        raise SliceValidationError(errs)


def _device_key(obj: dict[str, Any]) -> str:
    return json.dumps(sorted(slice_devices(obj), key=lambda d: str(d.get("name"))), sort_keys=True)


@dataclass(frozen=True)
class PublishPlan:
    generation: int
    create: list[dict[str, Any]]
    update: list[dict[str, Any]]
    delete: list[str]
    unchanged: bool


def plan_publish(
    existing: Sequence[dict[str, Any]],
    desired_devices: list[dict[str, Any]],
    build: Callable[[int], list[dict[str, Any]]],
) -> PublishPlan:
    """Decide what to create, replace and delete so the pool holds exactly the desired devices.

    `existing` are this pool's slices as the server has them; `desired_devices` the flat device
    list; `build(generation)` renders the slices. Unchanged content keeps the generation; any
    change bumps it past every existing slice's, so the scheduler ignores the stale ones meanwhile.
    """
    gens = [int(((s.get("spec") or {}).get("pool") or {}).get("generation", 0)) for s in existing]
    have = sorted((d for s in existing for d in slice_devices(s)), key=lambda d: str(d.get("name")))
    want = sorted(desired_devices, key=lambda d: str(d.get("name")))
    counts = {((s.get("spec") or {}).get("pool") or {}).get("resourceSliceCount") for s in existing}
    if (
        existing
        and json.dumps(have, sort_keys=True) == json.dumps(want, sort_keys=True)
        and len(set(gens)) == 1
    ):
        first = build(gens[0])
        if counts == {len(first)} and len(existing) == len(first):
            return PublishPlan(gens[0], [], [], [], True)
    generation = max(gens) + 1 if gens else 0
    slices = build(generation)
    reuse = [s for s in existing if (s.get("metadata") or {}).get("name")]
    update, create = [], []
    for i, obj in enumerate(slices):
        if i < len(reuse):
            meta = dict(obj["metadata"])
            meta.pop("generateName", None)
            meta["name"] = reuse[i]["metadata"]["name"]
            if reuse[i]["metadata"].get("resourceVersion"):
                meta["resourceVersion"] = reuse[i]["metadata"]["resourceVersion"]
            update.append({**obj, "metadata": meta})
        else:
            create.append(obj)
    delete = [s["metadata"]["name"] for s in reuse[len(slices) :]]
    return PublishPlan(generation, create, update, delete, False)


class SlicePublishError(RuntimeError):
    """Publishing failed for a reason retrying will not fix (e.g. the server rejected the slice)."""


@dataclass
class PublishResult:
    version: str
    generation: int
    slices: int
    created: int
    updated: int
    deleted: int
    unchanged: bool


_RETRY_STATUS = {0, 408, 429, 500, 502, 503, 504}


class SlicePublisher:
    """Publishes one node's pool through a `kubernetes.client.ApiClient`.

    Build it with `SlicePublisher.from_kubeconfig(path)` (or in-cluster config when path is None).
    """

    def __init__(
        self,
        api_client: Any,
        node_name: str,
        driver_name: str,
        *,
        version: str | None = None,
        simulated_source: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        max_backoff_s: float = 30.0,
        max_attempts: int | None = None,
    ) -> None:
        self.api = api_client
        self.node_name = node_name
        self.driver_name = driver_name
        self.version = version
        self.simulated_source = simulated_source
        self.sleep = sleep
        self.max_backoff_s = max_backoff_s
        self.max_attempts = max_attempts

    @classmethod
    def from_kubeconfig(
        cls, kubeconfig: str | None, node_name: str, driver_name: str, **kw: Any
    ) -> SlicePublisher:
        from kubernetes import client, config

        if kubeconfig:
            cfg = client.Configuration()
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cls(client.ApiClient(cfg), node_name, driver_name, **kw)

    # --- transport -------------------------------------------------------------------------------
    def _request(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None
    ) -> Any:
        return kube_request(self.api, method, path, body, query)

    def _retrying(self, what: str, fn: Callable[[], Any]) -> Any:
        delay, attempt = 0.5, 0
        while True:
            attempt += 1
            try:
                return fn()
            except KubeHTTPError as exc:
                if exc.status not in _RETRY_STATUS:
                    raise SlicePublishError(f"{what}: API server answered {exc}") from None
                err = f"HTTP {exc.status}"
            except (OSError, ConnectionError) as exc:  # urllib3 errors derive from these or from HTTPError
                err = str(exc)
            except Exception as exc:
                if type(exc).__module__.split(".")[0] != "urllib3":
                    raise
                err = str(exc)
            if self.max_attempts is not None and attempt >= self.max_attempts:
                raise SlicePublishError(f"{what}: API server unavailable after {attempt} attempts ({err})")
            log.warning("%s: API server unavailable (%s); retrying in %.1fs", what, err, delay)
            self.sleep(delay)
            delay = min(delay * 2, self.max_backoff_s)

    # --- API -------------------------------------------------------------------------------------
    def served_versions(self) -> list[str]:
        data = self._retrying("discovery", lambda: self._request("GET", f"/apis/{GROUP}"))
        served = [v.get("version") for v in (data or {}).get("versions", [])]
        return [v for v in VERSIONS if v in served]

    def choose_version(self) -> str:
        if self.version:
            return self.version
        served = self.served_versions()
        if not served:
            raise SlicePublishError(
                f"the API server serves no {GROUP} version this driver can write "
                f"({', '.join(VERSIONS)}); is DynamicResourceAllocation enabled?"
            )
        self.version = served[0]
        return self.version

    def node_owner(self) -> dict[str, Any] | None:
        try:
            node = self._retrying(
                "read node", lambda: self._request("GET", f"/api/v1/nodes/{self.node_name}")
            )
        except SlicePublishError as exc:
            log.warning("slices get no owner reference: %s", exc)
            return None
        uid = ((node or {}).get("metadata") or {}).get("uid")
        if not uid:
            return None
        return {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": uid, "controller": True}

    def existing(self, version: str) -> list[dict[str, Any]]:
        query = [("fieldSelector", f"spec.nodeName={self.node_name}")]
        data = self._retrying(
            "list slices",
            lambda: self._request("GET", f"/apis/{GROUP}/{version}/resourceslices", query=query),
        )
        items = (data or {}).get("items") or []
        return [
            s
            for s in items
            if (s.get("spec") or {}).get("driver") == self.driver_name
            and ((s.get("spec") or {}).get("pool") or {}).get("name") == self.node_name
        ]

    def publish(self, devices: Sequence[DriverDevice]) -> PublishResult:
        """Make the pool match `devices`: validate locally, then create/replace/delete slices."""
        version = self.choose_version()
        owner = self.node_owner()

        def build(gen: int) -> list[dict[str, Any]]:
            return build_slices(
                devices,
                node_name=self.node_name,
                driver_name=self.driver_name,
                generation=gen,
                version=version,
                owner=owner,
                simulated_source=self.simulated_source,
            )

        validate_slices(build(0))
        desired = [d for s in build(0) for d in slice_devices(s)]
        plan = plan_publish(self.existing(version), desired, build)
        base = f"/apis/{GROUP}/{version}/resourceslices"
        for obj in plan.update:
            self._put(f"{base}/{obj['metadata']['name']}", obj)
        for obj in plan.create:
            self._post(base, obj)
        for name in plan.delete:
            self._delete(f"{base}/{name}")
        n = len(plan.update) + len(plan.create)
        if not plan.unchanged:
            log.info(
                "published %d slice(s) for pool %s, generation %d (%s/%s)",
                n,
                self.node_name,
                plan.generation,
                GROUP,
                version,
            )
        return PublishResult(
            version,
            plan.generation,
            n if not plan.unchanged else len(build(plan.generation)),
            len(plan.create),
            len(plan.update),
            len(plan.delete),
            plan.unchanged,
        )

    def _put(self, path: str, obj: dict[str, Any]) -> None:
        def put() -> Any:
            return self._request("PUT", path, obj)

        self._retrying(f"update {path}", put)

    def _post(self, path: str, obj: dict[str, Any]) -> None:
        def post() -> Any:
            return self._request("POST", path, obj)

        self._retrying(f"create in {path}", post)

    def _delete(self, path: str) -> None:
        try:
            self._retrying("delete slice", lambda: self._request("DELETE", path))
        except SlicePublishError as exc:
            if "HTTP 404" not in str(exc):
                raise

    def unpublish(self) -> int:
        """Delete every slice of this pool (driver shutdown on a node being drained)."""
        version = self.choose_version()
        names = [s["metadata"]["name"] for s in self.existing(version)]
        for name in names:
            self._delete(f"/apis/{GROUP}/{version}/resourceslices/{name}")
        return len(names)
