"""Where the pod spec lives in each workload kind, and how many pods a workload asks for."""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.frozen import one_call_init
from .objects import as_int, as_list, as_map, as_str, read_once

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

# kind -> path (as keys) from the object root to the PodSpec.
POD_SPEC_PATHS: Mapping[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}

@dataclass(frozen=True, slots=True)
class TemplatePath:
    """Where one pod template of a workload CRD lives, and how many pods it runs.

    `path` is keys from the object root; `*` stands for every item of a list (or value of a map).
    `replicas` multiplies paths (each defaulting to 1): a leading `./` is relative to the element
    the last `*` matched, else from the root; a trailing `-1` subtracts one (LeaderWorkerSet workers).
    `container`: the path holds one container-like object (Kubeflow TrainJob's trainer, a KServe
    framework or model spec), not a PodSpec; such a template is read, never rewritten.
    """

    path: str
    replicas: tuple[str, ...] = ()
    container: bool = False
    # The name a container template's one container is shown by (the controller's own name for it).
    name: str = "trainer"


# Kubeflow Training Operator v1 job kinds and their replica-spec maps.
KUBEFLOW_V1_JOBS: Mapping[str, str] = {
    "PyTorchJob": "pytorchReplicaSpecs",
    "TFJob": "tfReplicaSpecs",
    "PaddleJob": "paddleReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
}


def _ray(prefix: str) -> tuple[TemplatePath, ...]:
    return (
        TemplatePath(f"{prefix}/headGroupSpec/template/spec"),
        TemplatePath(f"{prefix}/workerGroupSpecs/*/template/spec", ("./replicas",)),
    )


# KServe v1beta1 PredictorSpec (pkg/apis/serving/v1beta1/predictor.go): exactly one of these framework
# fields, each a PredictorExtensionSpec that inlines a corev1.Container (image, args, resources), or
# `model` (ModelSpec, the same container plus modelFormat/runtime). The controller names the
# container it builds from them `kserve-container`.
KSERVE_FRAMEWORKS: tuple[str, ...] = (
    "sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx", "huggingface", "pmml", "lightgbm",
    "paddle", "model",
)


def _kserve() -> tuple[TemplatePath, ...]:
    # PredictorSpec, TransformerSpec and ExplainerSpec inline a PodSpec (`containers`, ...) and
    # ComponentExtensionSpec (`minReplicas`, default 1). `predictor.workerSpec` (WorkerSpec: an inline
    # PodSpec with pipelineParallelSize/tensorParallelSize) is the multi-node workers' template: at
    # least one worker pod per predictor replica. ExplainerSpec's `art` is a container like the
    # framework forms.
    pred = ("spec/predictor/minReplicas",)
    return (
        TemplatePath("spec/predictor", pred),
        *(TemplatePath(f"spec/predictor/{f}", pred, container=True, name="kserve-container")
          for f in KSERVE_FRAMEWORKS),
        TemplatePath("spec/predictor/workerSpec", pred),
        TemplatePath("spec/transformer", ("spec/transformer/minReplicas",)),
        TemplatePath("spec/explainer", ("spec/explainer/minReplicas",)),
        TemplatePath("spec/explainer/art", ("spec/explainer/minReplicas",), container=True,
                     name="kserve-container"),
    )  # fmt: skip


def _llm_isvc() -> tuple[TemplatePath, ...]:
    # KServe LLMInferenceService (serving.kserve.io/v1alpha1, llm_inference_service_types.go):
    # WorkloadSpec is inlined at `spec` (decode, or the only workload) and again at `spec.prefill`
    # (disaggregated prefill); each has `replicas`, `template` (the head or only pod, a PodSpec) and
    # `worker` (the multi-node workers' PodSpec).
    return tuple(
        TemplatePath(f"{w}/{part}", (f"{w}/replicas",))
        for w in ("spec", "spec/prefill")
        for part in ("template", "worker")
    )


def _training_runtime() -> tuple[TemplatePath, ...]:
    # Kubeflow Trainer (ClusterTrainingRuntime / TrainingRuntime, trainer.kubeflow.org/v1alpha1):
    # `spec.template` is a JobSetTemplateSpec, so its pods are the JobSet's
    # `replicatedJobs[].template.spec.template.spec`.
    return (
        TemplatePath(
            "spec/template/spec/replicatedJobs/*/template/spec/template/spec",
            ("./replicas", "./template/spec/parallelism"),
        ),
    )


# (API group, kind) -> pod templates: the workload CRDs GPU jobs commonly come as. Review, admission
# and migration all read pod specs through this table (pod_templates_of).
CRD_POD_TEMPLATES: Mapping[tuple[str, str], tuple[TemplatePath, ...]] = {
    # Kubeflow Training Operator v1 (kubeflow.org/v1, pkg/apis/kubeflow.org/v1): each job kind keeps
    # a map of replica type (Master, Worker, Chief, PS, ...) to ReplicaSpec {replicas, template}.
    **{("kubeflow.org", kind): (TemplatePath(f"spec/{field}/*/template/spec", ("./replicas",)),)
       for kind, field in KUBEFLOW_V1_JOBS.items()},
    # Kubeflow MPIJob: the MPI Operator's kubeflow.org/v2beta1 (and the Training Operator's older
    # kubeflow.org/v1) keep `mpiReplicaSpecs` {Launcher, Worker} -> ReplicaSpec {replicas, template}.
    ("kubeflow.org", "MPIJob"): (TemplatePath("spec/mpiReplicaSpecs/*/template/spec", ("./replicas",)),),
    # Volcano Job (batch.volcano.sh/v1alpha1, pkg/apis/batch/v1alpha1/job.go): `tasks[]` each have
    # `replicas` and a PodTemplateSpec `template`.
    ("batch.volcano.sh", "Job"): (TemplatePath("spec/tasks/*/template/spec", ("./replicas",)),),
    ("trainer.kubeflow.org", "TrainingRuntime"): _training_runtime(),
    ("trainer.kubeflow.org", "ClusterTrainingRuntime"): _training_runtime(),
    ("serving.kserve.io", "LLMInferenceService"): _llm_isvc(),
    ("jobset.x-k8s.io", "JobSet"): (
        TemplatePath(
            "spec/replicatedJobs/*/template/spec/template/spec", ("./replicas", "./template/spec/parallelism")
        ),
    ),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): (
        TemplatePath("spec/leaderWorkerTemplate/leaderTemplate/spec", ("spec/replicas",)),
        TemplatePath(
            "spec/leaderWorkerTemplate/workerTemplate/spec",
            ("spec/replicas", "spec/leaderWorkerTemplate/size-1"),
        ),
    ),
    ("ray.io", "RayCluster"): _ray("spec"),
    ("ray.io", "RayJob"): _ray("spec/rayClusterSpec"),
    ("ray.io", "RayService"): _ray("spec/rayClusterConfig"),
    ("trainer.kubeflow.org", "TrainJob"): (
        TemplatePath("spec/trainer", ("spec/trainer/numNodes",), container=True),
    ),
    ("serving.kserve.io", "InferenceService"): _kserve(),
}
CrdTable = Mapping[tuple[str, str], tuple[TemplatePath, ...]]

# The resource (plural) and versions each CRD is served as: what the shipped webhook configurations
# route (kustomize/base/admission, checked against this table by tests/kustomize).
CRD_RESOURCES: Mapping[tuple[str, str], tuple[str, tuple[str, ...]]] = {
    **{("kubeflow.org", kind): (f"{kind.lower()}s", ("v1",)) for kind in KUBEFLOW_V1_JOBS},
    ("kubeflow.org", "MPIJob"): ("mpijobs", ("v1", "v2beta1")),
    ("jobset.x-k8s.io", "JobSet"): ("jobsets", ("v1alpha2",)),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): ("leaderworkersets", ("v1",)),
    ("ray.io", "RayCluster"): ("rayclusters", ("v1",)),
    ("ray.io", "RayJob"): ("rayjobs", ("v1",)),
    ("ray.io", "RayService"): ("rayservices", ("v1",)),
    ("trainer.kubeflow.org", "TrainJob"): ("trainjobs", ("v1alpha1",)),
    ("serving.kserve.io", "InferenceService"): ("inferenceservices", ("v1beta1",)),
    ("serving.kserve.io", "LLMInferenceService"): ("llminferenceservices", ("v1alpha1", "v1alpha2")),
    ("batch.volcano.sh", "Job"): ("jobs", ("v1alpha1",)),
    ("trainer.kubeflow.org", "TrainingRuntime"): ("trainingruntimes", ("v1alpha1",)),
    ("trainer.kubeflow.org", "ClusterTrainingRuntime"): ("clustertrainingruntimes", ("v1alpha1",)),
}
CRD_KINDS: frozenset[str] = frozenset(kind for _group, kind in CRD_POD_TEMPLATES)
WORKLOAD_KINDS: frozenset[str] = frozenset(POD_SPEC_PATHS) | CRD_KINDS

# The table in force: the built-in one, or the built-in one extended by WorkloadKindPolicy documents
# (PolicySet.crd_table). Set around one evaluation with `using_crd_table`; a context variable is local
# to its thread and asyncio task, so one request's policies never decide another's table.
_CRD_TABLE: contextvars.ContextVar[CrdTable] = contextvars.ContextVar("crd_table", default=CRD_POD_TEMPLATES)


def crd_table() -> CrdTable:
    """The workload CRD table in force."""
    return _CRD_TABLE.get()


class using_crd_table:
    """Read workload CRDs through `table` (None: the built-in one) within the block.

    A class rather than contextlib.contextmanager: it is entered twice per admission request, and a
    generator-based manager costs several times more than two methods."""

    __slots__ = ("_table", "_token")

    def __init__(self, table: CrdTable | None) -> None:
        self._table = table if table is not None else CRD_POD_TEMPLATES
        self._token: contextvars.Token[CrdTable] | None = None

    def __enter__(self) -> None:
        self._token = _CRD_TABLE.set(self._table)

    def __exit__(self, *_exc: object) -> None:
        if self._token is not None:
            _CRD_TABLE.reset(self._token)
            self._token = None


def is_workload_kind(kind: str) -> bool:
    """A kind whose pod templates draguard reads (built-in, or a CRD of the table in force)."""
    if kind in WORKLOAD_KINDS:
        return True
    table = _CRD_TABLE.get()
    return table is not CRD_POD_TEMPLATES and any(k == kind for _g, k in table)


def is_workload_crd(group: str, kind: str) -> bool:
    """A workload CRD of the table in force."""
    return (group, kind) in _CRD_TABLE.get()


@one_call_init
@dataclass(frozen=True, slots=True)
class PodTemplate:
    """One pod template of a workload: its JSON pointer, the PodSpec, and the pods it runs."""

    pointer: str
    spec: Mapping[str, Any]
    replicas: int = 1
    container: bool = False


def _esc(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _expand(node: Any, parts: list[str], ptr: str, star: Any) -> Iterator[tuple[str, Any, Any]]:
    if not parts:
        yield ptr, node, star
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        if isinstance(node, list):
            for i, v in enumerate(node):
                yield from _expand(v, rest, f"{ptr}/{i}", v)
        elif isinstance(node, Mapping):
            for k, v in node.items():
                yield from _expand(v, rest, f"{ptr}/{_esc(str(k))}", v)
        return
    if isinstance(node, Mapping) and head in node:
        yield from _expand(node[head], rest, f"{ptr}/{_esc(head)}", star)


def _replicas(obj: Mapping[str, Any], star: Any, paths: tuple[str, ...]) -> int:
    total = 1
    for raw in paths:
        minus = 1 if raw.endswith("-1") else 0
        path = raw[:-2] if minus else raw
        node: Any = star if path.startswith("./") else obj
        for key in path.removeprefix("./").split("/"):
            node = node.get(key) if isinstance(node, Mapping) else None
        n = as_int(node)
        total *= max((n if n is not None else 1) - minus, 0)
    return total


# KServe's Managed DRA (LLMInferenceService annotations, serving.kserve.io/v1alpha1 and v1alpha2): the
# controller creates a ResourceClaimTemplate of `count` devices of the class (and the CEL selectors)
# and references it from one container of the pod template: the first, or the one named.
KSERVE_DRA_CLASS = "serving.kserve.io/exp-dra-device-class"
KSERVE_DRA_COUNTS = ("serving.kserve.io/exp-dra-device-count", "serving.kserve.io/exp-dra-gpu-count")
KSERVE_DRA_CONTAINER = "serving.kserve.io/exp-dra-container-name"
# How a request for devices of a DeviceClass is written without a claim (KEP-5004's implicit name).
IMPLICIT_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
_MAX_DRA_COUNT = 32  # AllocationResultsMaxSize: no request gets more devices


def kserve_managed_dra(obj: Mapping[str, Any]) -> tuple[str, int, str | None] | None:
    """(DeviceClass, device count, target container or None for the first) of an LLMInferenceService
    with KServe's Managed DRA annotations; None without them or with values KServe's webhook
    rejects (a count that is not a whole number from 1, a class name that is not a DNS subdomain)."""
    notes = as_map(as_map(obj.get("metadata")).get("annotations"))
    cls = notes.get(KSERVE_DRA_CLASS)
    # Length first: the pattern backtracks, and an annotation may be 256 KiB of one tenant's text.
    if not isinstance(cls, str) or len(cls) > 253 or not _DNS_SUBDOMAIN.fullmatch(cls):
        return None
    count = 1
    for key in KSERVE_DRA_COUNTS:
        raw = notes.get(key)
        if isinstance(raw, str):
            if len(raw) > 8 or not raw.strip().isdigit() or not 1 <= int(raw.strip()) <= _MAX_DRA_COUNT:
                return None
            count = int(raw.strip())
            break
    target = notes.get(KSERVE_DRA_CONTAINER)
    return cls, count, target if isinstance(target, str) and 0 < len(target) <= 63 else None


def _with_managed_dra(spec: Mapping[str, Any], dra: tuple[str, int, str | None]) -> Mapping[str, Any]:
    """The pod spec as KServe's controller runs it: the target container asks for the devices. They
    are read as the equivalent KEP-5004 request (`deviceclass.resource.kubernetes.io/<class>: N`,
    one claim of N devices of the class per pod), so tier and quota judge them through the class."""
    cls, count, target = dra
    containers = list(as_list(spec.get("containers")))
    at = next((i for i, c in enumerate(containers)
               if isinstance(c, Mapping) and (target is None or c.get("name") == target)), None)  # fmt: skip
    if at is None:
        return spec  # KServe's webhook refuses a container name the template lacks
    c = containers[at]
    res = as_map(c.get("resources"))
    limits = {**as_map(res.get("limits")), f"{IMPLICIT_CLASS_PREFIX}{cls}": count}
    containers[at] = {**c, "resources": {**res, "limits": limits}}
    return {**spec, "containers": containers}


def crd_templates(obj: Mapping[str, Any]) -> list[PodTemplate] | None:
    """The pod templates of a workload CRD in the table; None for other kinds."""
    group = (as_str(obj.get("apiVersion")) or "").rpartition("/")[0]
    kind = as_str(obj.get("kind")) or ""
    paths = _CRD_TABLE.get().get((group, kind))
    if paths is None:
        return None
    dra = kserve_managed_dra(obj) if (group, kind) == ("serving.kserve.io", "LLMInferenceService") else None
    out: list[PodTemplate] = []
    for tp in paths:
        for ptr, node, star in _expand(obj, tp.path.split("/"), "", None):
            if not isinstance(node, Mapping):
                continue
            spec: Mapping[str, Any] = {"containers": [{"name": tp.name, **node}]} if tp.container else node
            if tp.container and "resourcesPerNode" in node:
                spec = {"containers": [{"name": tp.name, **node, "resources": node["resourcesPerNode"]}]}
            if dra is not None and ptr.endswith("/template"):
                spec = _with_managed_dra(spec, dra)
            out.append(PodTemplate(ptr, spec, _replicas(obj, star, tp.replicas), tp.container))
    if dra is not None and not any(t.pointer.endswith("/template") for t in out):
        # No template written: KServe's presets supply the pod, whose model server container
        # ("main") gets the claim.
        base = {"containers": [{"name": dra[2] or "main"}]}
        out.insert(0, PodTemplate("/spec/template", _with_managed_dra(base, dra),
                                  _replicas(obj, None, ("spec/replicas",))))
    return out


def pod_templates_of(obj: Mapping[str, Any]) -> list[PodTemplate]:
    """Every pod template of a workload (built-in kinds have one; CRDs may have several)."""
    found: list[PodTemplate] = read_once("pod_templates", obj, _pod_templates_of)
    return found


def _pod_templates_of(obj: Mapping[str, Any]) -> list[PodTemplate]:
    crd = crd_templates(obj)
    if crd is not None:
        return crd
    found = pod_spec_of(obj)
    return [PodTemplate(found[0], found[1], replicas_of(obj))] if found is not None else []


def _walk(obj: Mapping[str, Any], path: tuple[str, ...]) -> Mapping[str, Any] | None:
    cur: Any = obj
    for key in path:
        # type() first: parsed JSON is plain dicts, and the ABC check is the slow part of this walk.
        if type(cur) is not dict and not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur if type(cur) is dict or isinstance(cur, Mapping) else None


def pod_spec_of(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """(JSON pointer, PodSpec) of a workload object, or None for other kinds or a missing spec.
    For a workload CRD with several pod templates (see crd_table()): the first PodSpec."""
    found: tuple[str, Mapping[str, Any]] | None = read_once("pod_spec", obj, _pod_spec_of)
    return found


def _builtin_path(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The PodSpec path of a built-in kind; None for a CRD of the table that shares its kind name
    (Volcano's batch.volcano.sh Job is not batch/v1 Job)."""
    kind = as_str(obj.get("kind")) or ""
    path = POD_SPEC_PATHS.get(kind)
    if path is not None and kind in CRD_KINDS:
        group = (as_str(obj.get("apiVersion")) or "").rpartition("/")[0]
        if (group, kind) in _CRD_TABLE.get():
            return None
    return path


def _pod_spec_of(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    path = _builtin_path(obj)
    if path is None:
        crd = crd_templates(obj)
        first = next((t for t in crd or () if not t.container), None)
        return (first.pointer, first.spec) if first is not None else None
    spec = _walk(obj, path)
    if spec is None:
        return None
    return "/" + "/".join(path), spec


def pod_metadata_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The metadata pods of this workload get: the template's (merged over nothing) or the Pod's own."""
    path = _builtin_path(obj)
    if path is None:
        return {}
    meta = _walk(obj, (*path[:-1], "metadata"))
    return meta if meta is not None else {}


def pod_labels_and_annotations(obj: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations a workload's pods carry: the workload's own, with its pod template's
    over them (string values only), reading the template's metadata once."""
    meta = as_map(obj.get("metadata"))
    labels = {k: v for k, v in as_map(meta.get("labels")).items() if isinstance(v, str)}
    notes = {k: v for k, v in as_map(meta.get("annotations")).items() if isinstance(v, str)}
    if obj.get("kind") != "Pod":
        pod_meta = pod_metadata_of(obj)
        labels.update({k: v for k, v in as_map(pod_meta.get("labels")).items() if isinstance(v, str)})
        notes.update({k: v for k, v in as_map(pod_meta.get("annotations")).items() if isinstance(v, str)})
    return labels, notes


def replicas_of(obj: Mapping[str, Any]) -> int:
    """Pods the workload runs at once.

    replicas for Deployment/ReplicaSet/StatefulSet/ReplicationController (default 1); parallelism
    for Job and CronJob (default 1, capped by completions); DaemonSet and Pod count 1 (a DaemonSet
    runs one pod per node, which only the cluster knows: callers multiply by node count if needed).
    """
    kind = obj.get("kind") if _builtin_path(obj) is not None else None
    spec = as_map(obj.get("spec"))
    if kind in ("Deployment", "ReplicaSet", "StatefulSet", "ReplicationController"):
        n = as_int(spec.get("replicas"))
        return max(n, 0) if n is not None else 1
    if kind == "CronJob":
        spec = as_map(as_map(spec.get("jobTemplate")).get("spec"))
        kind = "Job"
    if kind == "Job":
        par = as_int(spec.get("parallelism"))
        n = max(par, 0) if par is not None else 1
        comp = as_int(spec.get("completions"))
        return min(n, max(comp, 0)) if comp is not None else n
    return 1


@dataclass(frozen=True, slots=True)
class ContainerRef:
    pointer: str
    container: Mapping[str, Any]
    init: bool


def containers_of(pod_pointer: str, spec: Mapping[str, Any]) -> Iterator[ContainerRef]:
    """initContainers then containers (the order the scheduler numbers them), with pointers."""
    for key, init in (("initContainers", True), ("containers", False)):
        for i, c in enumerate(as_list(spec.get(key))):
            if isinstance(c, Mapping):
                yield ContainerRef(f"{pod_pointer}/{key}/{i}", c, init)


def command_line(container: Mapping[str, Any]) -> list[str]:
    """command + args as strings (non-strings dropped)."""
    return [
        a for a in (*as_list(container.get("command")), *as_list(container.get("args"))) if isinstance(a, str)
    ]


def _whole(value: Any) -> int:
    """An extended-resource quantity as a whole number (extended resources allow no fractions)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return 0


def container_amounts(container: Mapping[str, Any]) -> dict[str, int]:
    """Whole-number resources a container asks for: the limit, else the request (extended resources
    must have both equal, and a device plugin allocates by the limit)."""
    res = as_map(container.get("resources"))
    limits, requests = as_map(res.get("limits")), as_map(res.get("requests"))
    out: dict[str, int] = {}
    for name in dict.fromkeys([*limits, *requests]):
        if isinstance(name, str):
            n = _whole(limits[name] if name in limits else requests[name])
            if n:
                out[name] = n
    return out


def effective_amounts(spec: Mapping[str, Any], keep: Any = None) -> dict[str, int]:
    """What a pod holds of each whole-number resource, as Kubernetes computes effective requests:
    max(sum over app containers + restartable (sidecar) init containers, each ordinary init container
    + the sidecars started before it). `keep(name)` filters resource names."""
    inits = as_list(spec.get("initContainers"))
    if not inits:  # most pods: the sum over app containers is the answer
        total: dict[str, int] = {}
        for c in as_list(spec.get("containers")):
            if type(c) is dict or isinstance(c, Mapping):
                for k, v in container_amounts(c).items():
                    if keep is None or keep(k):
                        total[k] = total.get(k, 0) + v
        return {k: v for k, v in total.items() if v > 0}
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for c in inits:
        if not isinstance(c, Mapping):
            continue
        amounts = {k: v for k, v in container_amounts(c).items() if keep is None or keep(k)}
        if c.get("restartPolicy") == "Always":
            for k, v in amounts.items():
                sidecars[k] = sidecars.get(k, 0) + v
                init_peak[k] = max(init_peak.get(k, 0), sidecars[k])
        else:
            for k in set(amounts) | set(sidecars):
                init_peak[k] = max(init_peak.get(k, 0), amounts.get(k, 0) + sidecars.get(k, 0))
    app: dict[str, int] = dict(sidecars)
    for c in as_list(spec.get("containers")):
        if type(c) is dict or isinstance(c, Mapping):
            for k, v in container_amounts(c).items():
                if keep is None or keep(k):
                    app[k] = app.get(k, 0) + v
    return {k: max(app.get(k, 0), init_peak.get(k, 0)) for k in set(app) | set(init_peak)
            if max(app.get(k, 0), init_peak.get(k, 0)) > 0}  # fmt: skip
