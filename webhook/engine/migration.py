"""Rewrite of legacy GPU extended resources (`nvidia.com/gpu`, `nvidia.com/mig-*`) into DRA claims.

Pure: takes a workload object and the class mappings of a MigrationPolicy and returns an RFC 6902
patch against the object as sent, the rewritten object, and the ResourceClaimTemplates the
rewritten workload references. Used by the `migrate/legacy-gpu` rule (admission mutation) and by
`draguard migrate` (file rewrite).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonpatch  # pure library: applies RFC 6902 patches to plain data

from ..core.findings import JsonPatch
from ..core.frozen import one_call_init
from ..dra.objects import (
    ClaimSpec,
    Constraint,
    DeviceRequest,
    DeviceSubRequest,
    Selector,
    as_map,
    claim_template,
    esc,
)
from ..dra.workloads import pod_spec_of
from ..policy.model import MigrationPolicy, ResourceMapping

LEGACY_GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
DEFAULT_CLAIM_API_VERSION = "resource.k8s.io/v1"
_DNS_LABEL_MAX = 63
_DNS_SUBDOMAIN_MAX = 253


def is_legacy_resource(name: str) -> bool:
    """True for the device-plugin resources this migration replaces."""
    return name == LEGACY_GPU_RESOURCE or (
        name.startswith(MIG_RESOURCE_PREFIX) and len(name) > len(MIG_RESOURCE_PREFIX)
    )


def mig_profile_of(resource: str) -> str | None:
    """`nvidia.com/mig-3g.20gb` -> `3g.20gb`; None for anything that is not a MIG resource."""
    if resource.startswith(MIG_RESOURCE_PREFIX):
        return resource[len(MIG_RESOURCE_PREFIX):] or None
    return None


def dns_label(text: str, max_len: int = _DNS_LABEL_MAX) -> str:
    """Deterministic DNS label (lowercase alphanumerics and '-') derived from `text`.

    Over-long results keep a readable prefix and end in a short hash of the full text, so two
    long inputs that share a prefix still get different names.
    """
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"
    if len(base) <= max_len:
        return base
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{base[: max_len - 9].rstrip('-')}-{digest}"


def copy_data(value: Any) -> Any:
    """A deep copy of JSON-like data (mappings, lists, scalars) without recursion.

    `copy.deepcopy` recurses once per level, so a hostile 900-deep annotation exhausts the stack;
    this walks an explicit stack instead. Objects reached twice (YAML aliases) are copied once and
    stay shared, so an alias bomb costs its node count, not its expansion.
    """
    memo: dict[int, Any] = {}

    def fresh(v: Any) -> tuple[Any, bool]:
        if isinstance(v, Mapping):
            new: Any = {}
        elif isinstance(v, list | tuple):
            new = []
        else:
            return v, False
        done = memo.get(id(v))
        if done is not None:
            return done, False
        memo[id(v)] = new
        return new, True

    root, todo = fresh(value)
    if not todo:
        return root
    stack: list[tuple[Any, Any]] = [(value, root)]
    while stack:
        src, dst = stack.pop()
        if isinstance(dst, dict):
            for k, v in src.items():
                dst[k], more = fresh(v)
                if more:
                    stack.append((v, dst[k]))
        else:
            for v in src:
                item, more = fresh(v)
                dst.append(item)
                if more:
                    stack.append((v, item))
    return root


def template_name(device_class: str, count: int) -> str:
    """Name of the generated ResourceClaimTemplate: `draguard-<class-sanitized>-<count>`."""
    return dns_label(f"draguard-{device_class}-{count}", _DNS_SUBDOMAIN_MAX)


@one_call_init
@dataclass(frozen=True, slots=True)
class LegacyUse:
    """One legacy extended resource in one container."""

    section: str  # "containers" | "initContainers"
    index: int
    container: str
    resource: str
    count: int
    pointer: str  # JSON pointer of the container
    in_limits: bool
    in_requests: bool
    bad_count: str | None = None  # the value as written when it is not a positive integer


def _dotted(pointer: str) -> str:
    return ".".join(t.replace("~1", "/").replace("~0", "~") for t in pointer.strip("/").split("/"))


def use_label(use: LegacyUse) -> str:
    """How messages name a use's container: `containers[app]`, or a one-container form by its field
    (`spec.predictor.tensorflow`), which is what the user wrote."""
    if use.pointer.endswith(f"/{use.section}/{use.index}"):
        return f"{use.section}[{use.container}]"
    return _dotted(use.pointer)


@one_call_init
@dataclass(frozen=True, slots=True)
class ClaimEdit:
    """How one LegacyUse becomes DRA: the container references `refs`; `claim_name` (when set) is
    the pod claim this edit adds, backed by `template` with `count` devices."""

    use: LegacyUse
    device_class: str
    claim_name: str | None
    template: str | None
    refs: tuple[str, ...] = ()
    count: int = 0


@dataclass(slots=True)
class MigrationPlan:
    """Everything the rewrite decided for one workload."""

    pod_spec_pointer: str
    uses: list[LegacyUse]
    edits: list[ClaimEdit]
    unmapped: list[LegacyUse]
    patch: JsonPatch
    templates: list[dict[str, Any]]
    source: Mapping[str, Any] = field(default_factory=dict, repr=False)
    template_names: list[str] = field(default_factory=list)
    # Uses the rewrite leaves alone, each with why: a claim would not give the pod what it runs with
    # today (see refusal()).
    refused: list[tuple[LegacyUse, str]] = field(default_factory=list)
    _rewritten: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def rewritten(self) -> dict[str, Any]:
        """The object with the patch applied (built on first use: admission needs only the patch)."""
        if self._rewritten is None:
            base = copy_data(self.source)
            self._rewritten = jsonpatch.apply_patch(base, self.patch, in_place=True) if self.patch else base
        return self._rewritten

    def describe(self) -> str:
        """One line per container change, for finding messages and CLI output."""
        parts = []
        # A pod spec hosting a one-container form (KServe's component) is named by its place.
        forms = any(not e.use.pointer.endswith(f"/{e.use.section}/{e.use.index}") for e in self.edits)
        claims_at = f"{_dotted(self.pod_spec_pointer)}.resourceClaims" if forms else "spec.resourceClaims"
        for e in self.edits:
            text = (
                f"{use_label(e.use)}: {e.use.resource}: {e.use.count} -> resources.claims "
                f"[{', '.join(e.refs)}]"
            )
            if e.claim_name:
                text += (
                    f" with {claims_at} {{name: {e.claim_name}, resourceClaimTemplateName: "
                    f"{e.template}}} ({e.count} x DeviceClass {e.device_class})"
                )
            if e.use.section == "initContainers" and (not e.claim_name or len(e.refs) > 1):
                text += " (an init container reuses the app containers' devices, as the device plugin did)"
            parts.append(text)
        return "; ".join(parts)


def _parse_count(value: Any) -> int | None:
    """Extended resources are whole numbers; accept ints and integer quantity strings."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        n = int(value.strip())
        return n if n > 0 else None
    return None


def find_legacy(
    podspec: Mapping[str, Any], pointer: str, at: Mapping[int, str] | None = None
) -> list[LegacyUse]:
    """Every legacy GPU resource in init containers and containers (limits or requests).

    The count is the limit (the device plugin allocates by limit); a request alone counts too,
    since it is what the user asked for, although the API server requires the limit. `at` gives the
    pointer of a `containers` item that sits elsewhere in the object (see `with_forms`).
    """
    found: list[LegacyUse] = []
    for section in ("initContainers", "containers"):
        containers = podspec.get(section)
        if not isinstance(containers, list):
            continue
        for i, c in enumerate(containers):
            if type(c) is not dict and not isinstance(c, Mapping):
                continue
            res = c.get("resources")
            if type(res) is not dict and not isinstance(res, Mapping):
                continue
            # as_map: parsed JSON's dicts without the ABC check (most pods have limits only).
            limits, requests = as_map(res.get("limits")), as_map(res.get("requests"))
            names = [n for n in dict.fromkeys([*limits, *requests]) if isinstance(n, str)]
            for name in names:
                if not is_legacy_resource(name):
                    continue
                raw = limits[name] if name in limits else requests[name]
                if raw == 0 or raw == "0":
                    continue  # asks for no device: nothing to migrate
                count = _parse_count(raw)
                found.append(
                    LegacyUse(
                        section=section,
                        index=i,
                        container=str(c.get("name") or f"{section}-{i}"),
                        resource=name,
                        count=count or 0,
                        pointer=f"{pointer}/{section}/{i}" if section != "containers" or not at
                        else at.get(i, f"{pointer}/{section}/{i}"),
                        in_limits=name in limits,
                        in_requests=name in requests,
                        bad_count=None if count is not None else str(raw),
                    )
                )
    return found


# KServe (serving.kserve.io/v1beta1, pkg/apis/serving/v1beta1/predictor.go, explainer.go): a
# PredictorSpec or ExplainerSpec inlines a PodSpec beside its one-container forms (`tensorflow`,
# `pytorch`, `huggingface`, `model`, ..., `art`), each inlining a corev1.Container. The controller
# builds the pod from that PodSpec (merged over the ServingRuntime's) and the form's container
# (`kserve-container`), so the form's claims go in the component's `resourceClaims` and its
# container names them in `resources.claims`.
KSERVE_ISVC = ("serving.kserve.io", "InferenceService")
# KServe's pod mutator (pkg/webhook/admission/pod/accelerator_injector.go) adds the node selector
# `cloud.google.com/gke-accelerator: <value>` to a pod with an nvidia.com/gpu limit that carries this
# annotation (the InferenceService's or the component's annotations reach the pod).
KSERVE_GKE_ACCELERATOR = "serving.kserve.io/gke-accelerator"


def _is_kserve_isvc(obj: Mapping[str, Any]) -> bool:
    api = obj.get("apiVersion")
    return isinstance(api, str) and (api.rpartition("/")[0], obj.get("kind")) == KSERVE_ISVC


Forms = Sequence[tuple[str, Mapping[str, Any]]]


def hosted_forms(obj: Mapping[str, Any], templates: Sequence[Any]) -> dict[str, Forms]:
    """host pod spec pointer -> [(pointer, container)] of the one-container templates (`container`
    set, `pointer` and `spec` as `pod_templates_of` gives them) whose pod that pod spec is: KServe's
    component forms. Other container templates (a TrainJob's trainer) have no host and are absent."""
    if not _is_kserve_isvc(obj):
        return {}
    hosts = {t.pointer for t in templates if not t.container}
    out: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for t in templates:
        parent = t.pointer.rpartition("/")[0]
        if t.container and parent in hosts:
            container = as_map(t.spec).get("containers")
            if isinstance(container, list) and container and isinstance(container[0], Mapping):
                out.setdefault(parent, []).append((t.pointer, container[0]))
    return {host: tuple(found) for host, found in out.items()}


def with_forms(
    podspec: Mapping[str, Any], forms: Sequence[tuple[str, Mapping[str, Any]]]
) -> tuple[Mapping[str, Any], dict[int, str]]:
    """The pod spec with the hosted forms' containers appended to `containers`, as the pod runs them,
    and the pointer of each appended container (its place in the object, not in the pod spec)."""
    if not forms:
        return podspec, {}
    own = podspec.get("containers")
    base = list(own) if isinstance(own, list) else []
    at = {len(base) + i: ptr for i, (ptr, _c) in enumerate(forms)}
    return {**podspec, "containers": [*base, *(c for _p, c in forms)]}, at


def implied_node_labels(obj: Mapping[str, Any], podspec: Mapping[str, Any]) -> dict[str, str]:
    """Node labels a controller adds to the pods beyond what the pod spec says: KServe's
    gke-accelerator annotation (on the InferenceService or the component)."""
    if not _is_kserve_isvc(obj):
        return {}
    notes = {**as_map(as_map(obj.get("metadata")).get("annotations")), **as_map(podspec.get("annotations"))}
    value = notes.get(KSERVE_GKE_ACCELERATOR)
    if isinstance(value, str) and 0 < len(value) <= 63:
        return {"cloud.google.com/gke-accelerator": value}
    return {}


def node_labels_of(podspec: Mapping[str, Any]) -> dict[str, str]:
    """Node labels the pod pins: `nodeSelector` plus single-value `In` terms of required affinity."""
    labels: dict[str, str] = {}
    terms: Any = None
    affinity = podspec.get("affinity")
    if affinity is not None and isinstance(affinity, Mapping):
        node_aff = affinity.get("nodeAffinity")
        if isinstance(node_aff, Mapping):
            req = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution")
            if isinstance(req, Mapping):
                terms = req.get("nodeSelectorTerms")
    # Terms are ORed: only a single term pins labels for certain.
    if isinstance(terms, list) and len(terms) == 1 and isinstance(terms[0], Mapping):
        for expr in terms[0].get("matchExpressions") or []:
            if (
                isinstance(expr, Mapping)
                and expr.get("operator") == "In"
                and isinstance(expr.get("values"), list)
                and len(expr["values"]) == 1
                and isinstance(expr.get("key"), str)
            ):
                labels[expr["key"]] = str(expr["values"][0])
    sel = podspec.get("nodeSelector")
    if sel is not None and isinstance(sel, Mapping):
        labels.update({str(k): str(v) for k, v in sel.items()})
    return labels


def choose_mapping(
    policy: MigrationPolicy, resource: str, node_labels: Mapping[str, str],
    allowed: Callable[[str], bool] | None = None,
) -> ResourceMapping | None:
    """The mapping a rewrite uses: the most specific one for the pod's node labels, unless the tier
    policy forbids its class for this workload (`allowed`). Then the most specific allowed mapping
    for those labels, else an allowed mapping whose node selector the pod does not contradict (the
    claim's class, not a node label, places a DRA pod); None of those: the usual choice, which the
    tier rule then reports."""
    best = policy.mapping_for(resource, node_labels)
    if allowed is None or best is None or allowed(best.device_class):
        return best
    candidates = [m for m in policy.mappings if m.resource == resource and allowed(m.device_class)]
    matching = [m for m in candidates if m.matches(resource, node_labels)]
    if matching:
        return max(matching, key=lambda m: len(m.node_selector))
    compatible = [
        m for m in candidates if all(node_labels.get(k, v) == v for k, v in m.node_selector.items())
    ]
    return min(compatible, key=lambda m: len(m.node_selector)) if compatible else best


def template_name_for(mapping: ResourceMapping, count: int) -> str:
    """Deterministic template name; mappings that add selectors get a hash of them appended so
    that two mappings onto the same class never share a template."""
    if not mapping.selectors:
        return template_name(mapping.device_class, count)
    digest = hashlib.sha256("\n".join(mapping.selectors).encode()).hexdigest()[:6]
    return dns_label(f"draguard-{mapping.device_class}-{count}-{digest}", _DNS_SUBDOMAIN_MAX)


def claim_template_for(
    name: str, namespace: str | None, mapping: ResourceMapping, count: int, resource: str,
    api_version: str = DEFAULT_CLAIM_API_VERSION, interconnect: str | None = None, required: bool = True,
) -> dict[str, Any]:
    """A ResourceClaimTemplate asking for exactly `count` devices of the mapping's DeviceClass.

    With `interconnect` (an attribute GPUs joined by NVLink share) the devices are joined by a
    matchAttribute constraint: always when `required`; otherwise as a preference, a `firstAvailable`
    list whose first choice (`nvlink`) carries the constraint and whose second (`any`) is any `count`
    devices, as the device plugin gave. The scheduler tries the choices in order on each node."""
    selectors = tuple(Selector(e) for e in mapping.selectors)
    short = "mig" if mig_profile_of(resource) else "gpu"
    joined: tuple[Constraint, ...]
    if interconnect and not required:
        choices = tuple(
            DeviceSubRequest(name=sub, device_class=mapping.device_class, selectors=selectors, count=count)
            for sub in (PREFERRED_CHOICE, FALLBACK_CHOICE)
        )
        request = DeviceRequest(name=short, device_class=None, first_available=choices)
        joined = (Constraint(requests=(f"{short}/{PREFERRED_CHOICE}",), match_attribute=interconnect),)
    else:
        request = DeviceRequest(
            name=short, device_class=mapping.device_class, selectors=selectors, count=count
        )
        joined = (Constraint(requests=(short,), match_attribute=interconnect),) if interconnect else ()
    spec = ClaimSpec(requests=(request,), constraints=joined)
    return claim_template(name, namespace, spec, api_version)


NVLINK_ATTRIBUTE = ("gpu.nvidia.com", "nvlinkDomain")
# The subrequests of a template that prefers GPUs joined by NVLink (DNS labels).
PREFERRED_CHOICE, FALLBACK_CHOICE = "nvlink", "any"
# firstAvailable is on by default from the release that serves resource.k8s.io/v1 (1.34; GA 1.36);
# an older cluster may drop the field, leaving a request with no class.
_PRIORITIZED_LIST_VERSIONS = frozenset({"v1"})


def _joined_everywhere(
    device_class: str, count: int, classes: Mapping[str, Any] | None, inventory: Any, attribute: str
) -> bool:
    """True when the inventory has a node with `count` devices of the class and every such node has
    `count` of them sharing one value of `attribute`; False when some does not, or the inventory
    cannot tell (none given, a class it cannot match, no node with that many such devices)."""
    if inventory is None or not classes or device_class not in classes:
        return False
    from ..cel.match import match_devices

    domain, _, name = attribute.rpartition("/")
    exprs = [str(getattr(sel, "expression", "")) for sel in getattr(classes[device_class], "selectors", ())]
    by_node = inventory.devices_by_node() if hasattr(inventory, "devices_by_node") else {}
    placed = False
    for devices in by_node.values():
        try:
            matched = match_devices(exprs, devices).matched if exprs else list(devices)
        except Exception:  # a selector that does not compile: the class is reported elsewhere
            return False
        if len(matched) < count:
            continue
        groups: dict[str, int] = {}
        for d in matched:
            value = d.attributes.get(domain, {}).get(name)
            if value is not None:
                groups[str(value)] = groups.get(str(value), 0) + 1
        if max(groups.values(), default=0) < count:
            return False
        placed = True
    return placed


def interconnect_for(
    device_class: str, count: int, classes: Mapping[str, Any] | None, inventory: Any,
    attribute: str = "/".join(NVLINK_ATTRIBUTE),
) -> str | None:
    """`attribute` (by default `gpu.nvidia.com/nvlinkDomain`) when a claim for `count` devices of the
    class can require it without losing a node: every node of the inventory with `count` such devices
    has `count` of them in one NVLink domain. None otherwise (a constraint on GPUs without NVLink would
    never be satisfied)."""
    if count < 2:
        return None
    return attribute if _joined_everywhere(device_class, count, classes, inventory, attribute) else None


def interconnect_plan(
    device_class: str, count: int, resource: str, classes: Mapping[str, Any] | None, inventory: Any,
    api_version: str, attribute: str = "/".join(NVLINK_ATTRIBUTE), prefer: bool = True,
) -> tuple[str, bool] | None:
    """How a template for `count` whole GPUs joins them by NVLink: (attribute, required).

    Required when the inventory shows every node able to hold the claim can meet it. Preferred when
    no inventory is known (review of files, `draguard migrate`) and `prefer`: the device plugin gave
    any `count` GPUs of a node, so the claim must still take any, but it asks for joined ones first.
    None otherwise: the inventory shows nodes where the GPUs are not joined, or none with that many
    (the interconnect or unsatisfiable finding then tells the true state), MIG slices (never joined),
    one device, a claim version without `firstAvailable`, or `prefer` is off (admission: the webhook
    bounds what it creates by the requests' exact counts)."""
    if count < 2 or resource != LEGACY_GPU_RESOURCE:
        return None
    if _joined_everywhere(device_class, count, classes, inventory, attribute):
        return attribute, True
    known = inventory is not None and bool(getattr(inventory, "devices", ()))
    if known or not prefer or api_version.rpartition("/")[2] not in _PRIORITIZED_LIST_VERSIONS:
        return None
    return attribute, False


# -- what a rewrite cannot do right -------------------------------------------------------------

# HAMi's vGPU resources (Project-HAMi charts/hami values.yaml: resourceMem, resourceMemPercentage,
# resourceCores): beside nvidia.com/gpu they ask for a share of one GPU, which a claim for whole
# devices does not express.
HAMI_RESOURCES = ("nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores")
# HAMi's pod annotations (Project-HAMi docs/config.md and examples/nvidia): which cards a vGPU may or
# may not land on (`use-gputype`, `nouse-gputype`, `use-gpuuuid`, `nouse-gpuuuid`), the vGPU mode
# (`vgpu-mode`), and everything under `hami.io/` (scheduler policies, the scheduler's own bindings).
# On a pod that carries them, nvidia.com/gpu counts HAMi vGPUs that HAMi places and limits, not
# whole GPUs the device plugin hands over.
HAMI_ANNOTATIONS = (
    "nvidia.com/use-gputype",
    "nvidia.com/nouse-gputype",
    "nvidia.com/use-gpuuuid",
    "nvidia.com/nouse-gpuuuid",
    "nvidia.com/vgpu-mode",
)
HAMI_ANNOTATION_PREFIX = "hami.io/"
# Cluster-scoped kinds carrying pod templates: their pods run in the namespaces of the objects that
# use them (a TrainJob names its ClusterTrainingRuntime), while a ResourceClaimTemplate is namespaced.
CLUSTER_SCOPED_TEMPLATES = frozenset({("trainer.kubeflow.org", "ClusterTrainingRuntime")})
# Kueue's queue label: Kueue admits the workload against its ClusterQueue's quota.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Node labels that name a GPU model: GPU Feature Discovery's product (NVML's name with spaces as
# `-`, `-SHARED` appended when time-sliced, `-MIG-<profile>` under the mixed strategy), GKE's
# accelerator, Karpenter's on EKS.
GPU_MODEL_LABELS = (
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "karpenter.k8s.aws/instance-gpu-name",
)
# GPU Feature Discovery's labels on nodes whose GPUs the device plugin shares (time-slicing, MPS).
SHARING_LABELS = ("nvidia.com/gpu.sharing-strategy", "nvidia.com/gpu.replicas")
_PRODUCT_LITERAL = re.compile(r"productName\s*(?:==\s*|\.startsWith\(\s*)[\"']([^\"']{1,100})[\"']")
_MODEL_TOKEN = re.compile(r"[a-z]{1,3}[0-9]{1,4}[a-z]?")
_MEMORY = re.compile(r"[0-9]{1,4}gb")


def _model_words(text: str) -> tuple[str, ...]:
    """A GPU model as words, vendor dropped: `NVIDIA-A100-SXM4-40GB-SHARED` -> (a100, sxm4, 40gb)."""
    words = [w for w in re.split(r"[^a-z0-9]+", text.lower()) if w]
    while words and words[0] in ("nvidia", "tesla"):
        words.pop(0)
    for stop in ("shared", "mig"):
        if stop in words:
            words = words[: words.index(stop)]
    return tuple(words)


def _model_key(words: tuple[str, ...]) -> tuple[str, frozenset[str]]:
    """(model, memory sizes): the first word with a digit (h100, l40s, t4, a6000, 4090), else the
    first word; and the `<n>gb` words. Form factors and memory kinds (sxm4, pcie, hbm3) are left out:
    GKE's `nvidia-a100-80gb` is NVML's `NVIDIA A100-SXM4-80GB`."""
    model = next((w for w in words if any(ch.isdigit() for ch in w) and not _MEMORY.fullmatch(w)), words[0])
    return model, frozenset(w for w in words if _MEMORY.fullmatch(w))


def _compatible(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Both name the same GPU model: (a100,) and (a100, sxm4, 80gb) agree, (a100, 80gb) and
    (a100, sxm4, 40gb) or (l4,) and (a100,) do not. Only a clear contradiction says no."""
    if not a or not b:
        return True
    (ma, mem_a), (mb, mem_b) = _model_key(a), _model_key(b)
    return ma == mb and (not mem_a or not mem_b or bool(mem_a & mem_b))


# The well-known node label of the machine type, and the instance families that each carry one GPU
# model, as the clouds document them (AWS "Accelerated computing instances"; Google Cloud's
# "GPU machine types"). Families with fractional or mixed GPUs are left out: they pin nothing certain.
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
INSTANCE_GPUS: tuple[tuple[str, str], ...] = (
    # AWS EC2: <family>.<size>
    ("g4dn.", "T4"), ("g5.", "A10G"), ("g6.", "L4"), ("g6e.", "L40S"), ("p3.", "V100"), ("p3dn.", "V100"),
    ("p4d.", "A100 40GB"), ("p4de.", "A100 80GB"), ("p5.", "H100 80GB"), ("p5e.", "H200"), ("p5en.", "H200"),
    ("p6-b200.", "B200"),
    # Google Cloud: <series>-<kind>-<n>g
    ("a2-highgpu-", "A100 40GB"), ("a2-megagpu-", "A100 40GB"), ("a2-ultragpu-", "A100 80GB"),
    ("a3-highgpu-", "H100 80GB"), ("a3-megagpu-", "H100 80GB"), ("a3-edgegpu-", "H100 80GB"),
    ("a3-ultragpu-", "H200"), ("a4-highgpu-", "B200"), ("g2-standard-", "L4"),
)  # fmt: skip


def instance_gpu(instance_type: str) -> str | None:
    """The GPU model of a cloud machine type (`g5.8xlarge` -> A10G); None when not known."""
    value = instance_type.strip().lower()
    return next((gpu for prefix, gpu in INSTANCE_GPUS if value.startswith(prefix)), None)


def pinned_model(node_labels: Mapping[str, str]) -> tuple[str, str, tuple[str, ...]] | None:
    """(label, value, model words) of the first GPU-model node label the pod pins, if any: a label
    naming the model, else a machine type whose GPUs are one known model. A value longer than a label
    value may be (63 characters; the API server rejects the pod) pins nothing and is never echoed."""
    for key in GPU_MODEL_LABELS:
        value = node_labels.get(key)
        if value and len(value) <= _DNS_LABEL_MAX:
            words = _model_words(value)
            if words:
                return key, value, words
    for key in INSTANCE_TYPE_LABELS:
        value = node_labels.get(key)
        gpu = instance_gpu(value) if value and len(value) <= _DNS_LABEL_MAX else None
        if value and gpu:
            return key, value, _model_words(gpu)
    return None


def _selector_text(cls: Any) -> str:
    return " ".join(str(getattr(sel, "expression", "")) for sel in getattr(cls, "selectors", ()))


def class_models(device_class: str, classes: Mapping[str, Any] | None) -> list[tuple[str, ...]] | None:
    """The GPU models a DeviceClass selects, as model words: the productName its CEL compares when
    the class is known, else a model in its name (`gpu.nvidia.com-a100` -> a100); None when
    neither says (then nothing contradicts it)."""
    known = classes.get(device_class) if classes else None
    if known is not None:
        lits = [m.group(1) for m in _PRODUCT_LITERAL.finditer(_selector_text(known))]
        if lits:
            return [_model_words(x) for x in lits]
    words = re.split(r"[^a-z0-9]+", device_class.lower())
    memory = tuple(w for w in words if _MEMORY.fullmatch(w))
    return [(w, *memory) for w in words if _MODEL_TOKEN.fullmatch(w)] or None


def contradiction(
    node_labels: Mapping[str, str], mapping: ResourceMapping, classes: Mapping[str, Any] | None
) -> str | None:
    """Why the mapping's class cannot serve a pod pinned to another GPU model; None when it can."""
    pinned = pinned_model(node_labels)
    if pinned is None:
        return None
    key, value, words = pinned
    if key in mapping.node_selector:
        return None  # the mapping was chosen for this very label
    models = class_models(mapping.device_class, classes)
    if models is None or any(_compatible(words, m) for m in models):
        return None
    gpu = instance_gpu(value) if key in INSTANCE_TYPE_LABELS else None
    return (
        f"the pod is pinned to nodes with {key}={value}{f' ({gpu} GPUs)' if gpu else ''}, but the mapped "
        f"DeviceClass {mapping.device_class} "
        f"selects {' or '.join(' '.join(m) for m in models)} GPUs, so the claim could never be allocated "
        f"there; add a mapping {{resource: {mapping.resource}, nodeSelector: {{{key}: {value}}}, "
        "deviceClass: <a class of that GPU>} to the MigrationPolicy"
    )


def matching_class(
    resource: str, node_labels: Mapping[str, str], classes: Mapping[str, Any] | None,
    allowed: Callable[[str], bool] | None,
) -> str | None:
    """A whole-GPU DeviceClass among `classes` that selects the GPU model the pod is pinned to (the
    one naming it most precisely)."""
    pinned = pinned_model(node_labels)
    if pinned is None or not classes or resource != LEGACY_GPU_RESOURCE:
        return None
    best: tuple[int, str] | None = None
    for name in sorted(classes):
        text = _selector_text(classes[name])
        if "'gpu'" not in text and '"gpu"' not in text:
            continue  # not a whole-GPU class (MIG slices, NICs)
        if allowed is not None and not allowed(name):
            continue
        for m in _PRODUCT_LITERAL.finditer(text):
            words = _model_words(m.group(1))
            if _compatible(pinned[2], words) and (best is None or len(words) > best[0]):
                best = (len(words), name)
    return best[1] if best else None


def _names(part: Any) -> set[str]:
    return {str(k) for k in part} if isinstance(part, Mapping) else set()


def _hami_annotations(obj: Mapping[str, Any]) -> list[str]:
    """`key=value` of the HAMi annotations the workload's pods carry (at most a few shown)."""
    from ..dra.workloads import pod_labels_and_annotations

    _labels, notes = pod_labels_and_annotations(obj)
    found = sorted(k for k in notes if k in HAMI_ANNOTATIONS or k.startswith(HAMI_ANNOTATION_PREFIX))
    # A hostile object may carry thousands: name a few, with values cut short.
    shown = [f"{k}={notes[k][:40]}" for k in found[:3]]
    return [*shown, f"{len(found) - 3} more"] if len(found) > 3 else shown


def refusal(obj: Mapping[str, Any], podspec: Mapping[str, Any], node_labels: Mapping[str, str]) -> str | None:
    """Why this pod spec must keep its device-plugin GPUs; None when a claim rewrite is faithful."""
    api = obj.get("apiVersion")
    if isinstance(api, str) and api.startswith("ray.io/"):
        # KubeRay passes `ray start --num-gpus` from the container's nvidia.com/gpu limit
        # (ray-operator/controllers/ray/common/pod.go): without it Ray schedules no GPU work.
        return (
            "KubeRay starts Ray with --num-gpus read from the container's nvidia.com/gpu limit, so without "
            "it Ray sees no GPUs: set rayStartParams num-gpus on the group and move the GPUs to a "
            "ResourceClaimTemplate by hand, or keep the limit and serve it through DRA (a DeviceClass with "
            "extendedResourceName: nvidia.com/gpu)"
        )
    group = api.rpartition("/")[0] if isinstance(api, str) else ""
    if (group, obj.get("kind")) in CLUSTER_SCOPED_TEMPLATES:
        return (
            f"a {obj.get('kind')} is cluster-scoped: its pods run in the namespace of each workload that "
            "uses it, and a ResourceClaimTemplate is namespaced, so no single template can serve them; "
            "create the ResourceClaimTemplate in every namespace that runs it and reference it by hand, or "
            "copy the runtime into a namespaced TrainingRuntime and migrate that"
        )
    hami_notes = _hami_annotations(obj)
    if hami_notes:
        return (
            f"the pod carries HAMi's annotations ({', '.join(hami_notes)}), so each nvidia.com/gpu is a HAMi "
            "vGPU that HAMi places by them and a claim gives whole GPUs without them: keep it on HAMi, or "
            "write a ResourceClaimTemplate by hand (a DeviceClass that shares GPUs, selectors on productName "
            "or uuid for the card choice)"
        )
    for key in ("initContainers", "containers"):
        for c in podspec.get(key) or ():
            if not isinstance(c, Mapping):
                continue
            res = c.get("resources")
            res = res if isinstance(res, Mapping) else {}
            asked = _names(res.get("limits")) | _names(res.get("requests"))
            hami = sorted(n for n in asked if n in HAMI_RESOURCES)
            if hami:
                return (
                    f"container {c.get('name')!r} asks for a HAMi vGPU share ({', '.join(hami)}) and a claim "
                    "gives whole GPUs: keep it on HAMi, or request a DeviceClass that shares GPUs (GpuConfig "
                    "sharing) in a ResourceClaimTemplate by hand"
                )
    sharing = [f"{k}={node_labels[k]}" for k in SHARING_LABELS if k in node_labels]
    product = node_labels.get("nvidia.com/gpu.product", "")
    if product.upper().endswith("-SHARED"):
        sharing.append(f"nvidia.com/gpu.product={product}")
    if sharing:
        return (
            f"the pod runs on GPUs the device plugin shares ({', '.join(sharing)}): each nvidia.com/gpu is a "
            "time-sliced replica and a claim would hold whole GPUs; request a DeviceClass with GpuConfig "
            "sharing (TimeSlicing or MPS) in a ResourceClaimTemplate by hand"
        )
    return None


def kueue_refusal(obj: Mapping[str, Any], resource: str, device_class: str) -> str | None:
    """Why a Kueue-managed workload is left alone: Kueue stops counting GPUs it cannot map."""
    from ..dra.workloads import pod_labels_and_annotations

    labels, _notes = pod_labels_and_annotations(obj)
    queue = labels.get(KUEUE_QUEUE_LABEL)
    if not queue:
        return None
    return (
        f"Kueue admits this workload (queue {queue}) against its {resource} quota, and after the rewrite "
        "counts the claim only through its Configuration's resources.deviceClassMappings: add "
        f"{{name: {resource}, deviceClassNames: [{device_class}]}} there (Kueue's DynamicResourceAllocation "
        "feature), then migrate"
    )


def _mapping_or_refusal(
    obj: Mapping[str, Any], policy: MigrationPolicy, resource: str, node_labels: Mapping[str, str],
    allowed: Callable[[str], bool] | None, classes: Mapping[str, Any] | None,
) -> tuple[ResourceMapping | None, str | None]:
    """The mapping a resource is rewritten with, or why it is not rewritten."""
    mapping = choose_mapping(policy, resource, node_labels, allowed)
    if mapping is None:
        return None, None
    problem = contradiction(node_labels, mapping, classes)
    if problem is not None:
        better = matching_class(resource, node_labels, classes, allowed)
        if better is None:
            return mapping, problem.replace("the MigrationPolicy", f"MigrationPolicy {policy.name}")
        mapping = ResourceMapping(resource, better)
    return mapping, kueue_refusal(obj, resource, mapping.device_class)


def _claim_short(resource: str) -> str:
    profile = mig_profile_of(resource)
    return f"mig-{profile}" if profile else "gpu"


def plan_pod_spec(
    obj: Mapping[str, Any],
    pod_spec_pointer: str,
    podspec: Mapping[str, Any],
    policy: MigrationPolicy,
    *,
    namespace: str | None,
    api_version: str | None = None,
    rewrite: bool = True,
    uses: list[LegacyUse] | None = None,
    allowed: Callable[[str], bool] | None = None,
    build: bool = True,
    classes: Mapping[str, Any] | None = None,
    inventory: Any = None,
    link_attribute: Callable[[int], str] | None = None,
    prefer_interconnect: bool = True,
    forms: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> MigrationPlan:
    """Plan the claim-template rewrite of one pod spec inside `obj` (located at `pod_spec_pointer`).

    `rewrite=False` leaves the rewritten object to be built on first use of `plan.rewritten`
    (admission only sends the patch); by default it is built, and checked, here. `build=False`
    plans only what describes the rewrite (edits, template names): no patch, no template objects.
    `classes` (name -> DeviceClass, as the engine's index holds them): a resource one of them serves
    as its `extendedResourceName` is DRA already and left alone (KEP-5004), and a pod pinned to a
    GPU model gets the class that selects it. Uses whose meaning a rewrite would change land in
    `plan.refused` with the reason. A template for several whole GPUs joins them by NVLink (see
    `interconnect_plan`) on `link_attribute(count)`, the attribute the driver serving the cluster
    publishes for it (default `gpu.nvidia.com/nvlinkDomain`, the bundled driver's); as a preference
    only while `prefer_interconnect`. `forms`: (pointer, container) of the one-container forms this
    pod spec hosts (KServe's `predictor.model`, see `hosted_forms`); their claims join the pod spec's.
    """
    if not build:
        rewrite = False
    podspec, at = with_forms(podspec, forms)
    uses = find_legacy(podspec, pod_spec_pointer, at) if uses is None else uses
    if classes:
        served = {getattr(c, "extended_resource_name", None) for c in classes.values()}
        uses = [u for u in uses if u.resource not in served]
    node_labels = {**node_labels_of(podspec), **implied_node_labels(obj, podspec)}
    refused: list[tuple[LegacyUse, str]] = []
    why = refusal(obj, podspec, node_labels) if uses else None
    if why is not None:
        refused = [(u, why) for u in uses]
        uses = []
    existing_claims = podspec.get("resourceClaims")
    taken: set[str] = set()
    if isinstance(existing_claims, list):
        taken = {str(c.get("name")) for c in existing_claims if isinstance(c, Mapping)}

    edits: list[ClaimEdit] = []
    unmapped: list[LegacyUse] = []
    templates: dict[str, dict[str, Any]] = {}
    # One pod has one set of node labels: each resource maps the same way in every container.
    mappings: dict[str, ResourceMapping | None] = {}
    next_suffix: dict[str, int] = {}

    def fresh_name(base: str) -> str:
        # Resume numbering where the last clash on this base stopped: containers sharing a name
        # (or a hostile 3,000 of them) must not rescan 2, 3, ... every time.
        name, n = base, next_suffix.get(base, 2)
        while name in taken:
            suffix = f"-{n}"
            name = dns_label(base[: _DNS_LABEL_MAX - len(suffix)] + suffix)
            n += 1
        next_suffix[base] = n
        taken.add(name)
        return name

    links: dict[tuple[str, int, str], tuple[str, bool] | None] = {}
    version = api_version or policy.claim_api_version

    def template_for(mapping: ResourceMapping, count: int, resource: str) -> str:
        key = (mapping.device_class, count, resource)
        if key not in links:
            attribute = link_attribute(count) if link_attribute else "/".join(NVLINK_ATTRIBUTE)
            links[key] = interconnect_plan(
                mapping.device_class, count, resource, classes, inventory, version, attribute,
                prefer_interconnect,
            )
        link = links[key]
        tname = template_name_for(mapping, count)
        if link and link[1]:
            # A required constraint makes another template than the one without it (it may not be
            # allocatable on the same nodes): never the same name for both. A preference keeps the
            # plain name: it is allocatable wherever the plain template is.
            tname = dns_label(f"{tname}-nvlink", _DNS_SUBDOMAIN_MAX)
        if tname not in templates:  # built once per distinct template, not once per container
            templates[tname] = claim_template_for(
                tname, namespace, mapping, count, resource, version,
                link[0] if link else None, link[1] if link else True,
            ) if build else {}
        return tname

    # Kubernetes' effective request: app containers (and restartable sidecar init containers, which
    # keep running) add up; an ordinary init container runs before them and reuses their devices, as
    # the device plugin's allocation did. So the app containers keep a claim each, and an init
    # container references those claims, plus one extra claim for what it needs beyond their sum.
    def ordinary_init(use: LegacyUse) -> bool:
        if use.section != "initContainers":
            return False
        c = podspec["initContainers"][use.index]
        return not (isinstance(c, Mapping) and c.get("restartPolicy") == "Always")

    mapped: list[tuple[LegacyUse, ResourceMapping]] = []
    blocked: dict[str, str | None] = {}
    for use in uses:
        if use.resource not in mappings:
            mappings[use.resource], blocked[use.resource] = _mapping_or_refusal(
                obj, policy, use.resource, node_labels, allowed, classes
            )
        mapping = mappings[use.resource]
        reason = blocked.get(use.resource)
        if reason is not None:
            refused.append((use, reason))
            continue
        if mapping is None or use.count <= 0:
            unmapped.append(use)
            continue
        mapped.append((use, mapping))
    app_claims: dict[str, list[tuple[str, int]]] = {}
    by_use: dict[int, ClaimEdit] = {}
    for i, (use, mapping) in enumerate(mapped):
        if ordinary_init(use):
            continue
        name = fresh_name(dns_label(f"{use.container}-{_claim_short(use.resource)}"))
        tname = template_for(mapping, use.count, use.resource)
        app_claims.setdefault(use.resource, []).append((name, use.count))
        by_use[i] = ClaimEdit(use, mapping.device_class, name, tname, (name,), use.count)
    extra: dict[str, str] = {}
    for i, (use, mapping) in enumerate(mapped):
        if not ordinary_init(use):
            continue
        shared = app_claims.get(use.resource, [])
        have = sum(n for _c, n in shared)
        refs = [c for c, _n in shared]
        if use.count <= have:
            # Enough devices in the app containers' claims: reuse as few of them as cover it.
            covered, chosen = 0, []
            for c, n in shared:
                chosen.append(c)
                covered += n
                if covered >= use.count:
                    break
            by_use[i] = ClaimEdit(use, mapping.device_class, None, None, tuple(chosen))
            continue
        top = max(u.count for u, _m in mapped if u.resource == use.resource and ordinary_init(u))
        new: str | None = None
        extra_tmpl: str | None = None
        if use.resource not in extra:
            new = fresh_name(dns_label(f"{use.container}-{_claim_short(use.resource)}"))
            extra[use.resource] = new
            extra_tmpl = template_for(mapping, top - have, use.resource)
        by_use[i] = ClaimEdit(use, mapping.device_class, new, extra_tmpl, (*refs, extra[use.resource]),
                              top - have if new else 0)  # fmt: skip
    edits = [by_use[i] for i in range(len(mapped))]

    plan = MigrationPlan(
        pod_spec_pointer=pod_spec_pointer,
        uses=uses,
        edits=edits,
        unmapped=unmapped,
        patch=_build_patch(podspec, pod_spec_pointer, edits) if build else [],
        templates=list(templates.values()) if build else [],
        source=obj,
        template_names=list(templates),
        refused=refused,
    )
    if rewrite:
        plan.rewritten  # noqa: B018  (built now so a patch that does not apply fails here)
    return plan


def _build_patch(podspec: Mapping[str, Any], ptr: str, edits: Sequence[ClaimEdit]) -> JsonPatch:
    """RFC 6902 operations against the original object; every path is escaped (`nvidia.com~1gpu`)."""
    if not edits:
        return []
    ops: JsonPatch = []
    pod_claims = [
        {"name": e.claim_name, "resourceClaimTemplateName": e.template} for e in edits if e.claim_name
    ]
    if isinstance(podspec.get("resourceClaims"), list):
        ops.extend({"op": "add", "path": f"{ptr}/resourceClaims/-", "value": c} for c in pod_claims)
    else:
        ops.append({"op": "add", "path": f"{ptr}/resourceClaims", "value": pod_claims})

    by_container: dict[tuple[str, int], list[ClaimEdit]] = {}
    for e in edits:
        by_container.setdefault((e.use.section, e.use.index), []).append(e)
    for (section, index), cedits in by_container.items():
        container = podspec[section][index]
        res = container["resources"]
        cptr = f"{cedits[0].use.pointer}/resources"
        refs = [{"name": r} for r in dict.fromkeys(r for e in cedits for r in e.refs)]
        if isinstance(res.get("claims"), list):
            ops.extend({"op": "add", "path": f"{cptr}/claims/-", "value": r} for r in refs)
        else:
            ops.append({"op": "add", "path": f"{cptr}/claims", "value": refs})
        for part, flag in (("limits", "in_limits"), ("requests", "in_requests")):
            removed = [e.use.resource for e in cedits if getattr(e.use, flag)]
            if not removed:
                continue
            current = res.get(part)
            assert isinstance(current, Mapping)
            if set(current) <= set(removed):
                # Leave no empty `limits: {}` behind.
                ops.append({"op": "remove", "path": f"{cptr}/{part}"})
            else:
                ops.extend({"op": "remove", "path": f"{cptr}/{part}/{esc(r)}"} for r in removed)
    return ops


def plan_workload(
    obj: Mapping[str, Any],
    policy: MigrationPolicy,
    *,
    namespace: str | None = None,
    api_version: str | None = None,
    allowed: Callable[[str], bool] | None = None,
) -> MigrationPlan | None:
    """Plan the rewrite of any workload kind; None when the object has no pod spec."""
    found = pod_spec_of(obj)
    if found is None:
        return None
    pointer, podspec = found
    if namespace is None:
        meta = obj.get("metadata")
        ns = meta.get("namespace") if isinstance(meta, Mapping) else None
        namespace = ns if isinstance(ns, str) and ns else None
    return plan_pod_spec(
        obj, pointer, podspec, policy, namespace=namespace, api_version=api_version, allowed=allowed
    )


def rewrite(
    obj: Mapping[str, Any],
    policy: MigrationPolicy,
    *,
    namespace: str | None = None,
    api_version: str | None = None,
) -> tuple[JsonPatch, dict[str, Any], list[dict[str, Any]]]:
    """(patch, rewritten object, ResourceClaimTemplates) for `draguard migrate`.

    Objects without legacy GPU resources, or whose resources no mapping covers, come back unchanged
    with an empty patch; `plan_workload` tells which resources were left unmapped.
    """
    plan = plan_workload(obj, policy, namespace=namespace, api_version=api_version)
    if plan is None:
        return [], copy_data(obj), []
    return plan.patch, plan.rewritten, plan.templates
