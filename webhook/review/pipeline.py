"""The review pipeline: read inputs, load policies and inventory, call the engine (the same one the
webhook calls), and gather what the formats need. Every failure is a `ReviewError` (exit 2)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..core.findings import Finding, ObjectRef, Report
from ..core.source import SourceObject
from ..engine.context import Context
from .formats import ReviewedObject, ReviewResult
from .inputs import InputError, Inputs, Skipped, display_path

if TYPE_CHECKING:
    from ..dra.inventory import Inventory
    from ..policy.model import PolicySet

DEFAULT_POLICIES = "policies"
PROGRESS_THRESHOLD = 200  # documents; below this a run is quick enough to need no progress


class ReviewError(Exception):
    """A usage error or unreadable input: one line, exit code 2."""


def shipped_policies() -> Path | None:
    """The default policies shipped with draguard, the bundle's own: `draguard/policies` in an installed
    package, `policies/` in the repository (the same relative place in both layouts)."""
    p = Path(__file__).resolve().parents[2] / "policies"
    return p if p.is_dir() else None


def load_policy_set(path: str | Path | None, *, required: bool) -> PolicySet:
    """Policies from a directory or file. The default directory (`policies`), when absent, means the
    policies shipped with draguard, or built-in checks only where none are shipped."""
    from ..policy.load import PolicyError, load_policies
    from ..policy.model import PolicySet

    if path is None:
        return PolicySet.empty()
    p = Path(path)
    if not p.exists():
        if required:
            raise ReviewError(f"{path}: policy directory not found (fix: pass --policies DIR)")
        shipped = shipped_policies() if str(path) == DEFAULT_POLICIES else None
        if shipped is None:
            return PolicySet.empty()
        p = shipped
    try:
        return load_policies(p)
    except PolicyError as exc:
        raise ReviewError(str(exc)) from None
    except OSError as exc:
        raise ReviewError(f"{path}: cannot read policies: {exc.strerror or exc}") from None


def load_inventory_file(path: str | None) -> Inventory:
    from ..dra.inventory import Inventory, InventoryError, load_inventory

    if not path:
        return Inventory.empty()
    p = Path(path)
    if not p.exists():
        raise ReviewError(f"{path}: inventory file not found (fix: check --inventory)")
    try:
        if p.is_dir():
            return load_inventory(p)
        # Parsed here with libyaml: a 10,000-device inventory is tens of MB of YAML, and the
        # pure-Python loader takes half a minute on it. The objects are the engine's to read.
        from .inputs import load_data, read_text

        docs = load_data(read_text(p, str(path)), str(path))
        objs = [d for d in docs if isinstance(d, Mapping)]
        if docs and not objs:
            raise ReviewError(
                f"{path}: expected Kubernetes objects (ResourceSlices, DeviceClasses); "
                "fix: pass the output of `kubectl get resourceslices,deviceclasses -o yaml`"
            )
        return Inventory.from_objects(objs)
    except InputError as exc:
        raise ReviewError(f"inventory {exc}") from None
    except InventoryError as exc:
        raise ReviewError(str(exc)) from None


def namespace_labels_of(objs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Labels of the Namespace objects among `objs` (List items included), as admission's cache has
    them, with the `kubernetes.io/metadata.name` label the API server sets on every namespace."""
    out: dict[str, dict[str, str]] = {}
    stack = list(objs)
    while stack:
        o = stack.pop()
        if not isinstance(o, Mapping):
            continue
        if isinstance(o.get("items"), list) and str(o.get("kind") or "").endswith("List"):
            stack.extend(o["items"])
            continue
        meta = o.get("metadata")
        if o.get("kind") != "Namespace" or not isinstance(meta, Mapping):
            continue
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            continue
        raw = meta.get("labels")
        labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
        labels.setdefault("kubernetes.io/metadata.name", name)
        out[name] = labels
    return out


def load_cluster_state(path: str | None) -> dict[str, dict[str, str]]:
    """Namespace labels from a cluster snapshot (`kubectl get ns -o yaml`, or any file of objects)."""
    if not path:
        return {}
    from .inputs import load_data, read_text

    p = Path(path)
    if not p.is_file():
        raise ReviewError(
            f"{path}: cluster state file not found (fix: kubectl get namespaces -o yaml > {path})"
        )
    try:
        docs = load_data(read_text(p, str(path)), str(path))
    except InputError as exc:
        raise ReviewError(f"cluster state {exc}") from None
    found = namespace_labels_of([d for d in docs if isinstance(d, Mapping)])
    if docs and not found:
        raise ReviewError(
            f"{path}: no Namespace objects in the cluster state file; fix: pass the output of "
            "`kubectl get namespaces -o yaml`"
        )
    return found


def object_ref(item: SourceObject) -> ObjectRef:
    meta = item.obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    ns = meta.get("namespace")
    # Interned: one ObjectRef is kept per object read, and these few strings repeat across them.
    return ObjectRef(
        api_version=sys.intern(str(item.obj.get("apiVersion") or "")),
        kind=sys.intern(str(item.obj.get("kind") or "")),
        namespace=sys.intern(ns) if isinstance(ns, str) and ns else None,
        name=str(meta.get("name") or meta.get("generateName") or "<unnamed>"),
    )


class Progress:
    """Progress lines on stderr for long runs; silent unless enabled."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.start = time.monotonic()

    def say(self, text: str) -> None:
        if self.enabled:
            print(f"draguard: {text}", file=self.stream, flush=True)


@dataclass(slots=True)
class Reviewed:
    """A review's result and what was read. From `review` (streamed), `inputs` holds the files and
    the skipped documents only: the objects are not kept (`result.objects` lists them)."""

    result: ReviewResult
    inputs: Inputs


def evaluate_inputs(
    inputs: Inputs,
    policies: PolicySet,
    inventory: Inventory,
    *,
    namespace: str = "default",
    progress: Progress | None = None,
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
    kubernetes_version: str | None = None,
    driver_schema: str | None = None,
) -> ReviewResult:
    """Evaluate like admission: namespace labels come from the cluster state given, with the
    Namespace objects among the inputs over them (the pull request's own labels win)."""
    from ..engine.evaluate import evaluate

    n = len(inputs.objects)
    if progress is not None and n > PROGRESS_THRESHOLD:
        progress.say(f"evaluating {n} documents from {len(set(inputs.files))} files")
    t0 = time.monotonic()
    labels = {**(namespace_labels or {}), **namespace_labels_of([o.obj for o in inputs.objects])}
    ctx = Context(default_namespace=namespace, namespace_labels=labels, kubernetes_version=kubernetes_version,
                  driver_schema=driver_schema)
    report = evaluate(inputs.objects, policies, inventory, ctx)
    schema = SchemaCheck(kubernetes_version, namespace)
    checked = {i: found for i, o in enumerate(inputs.objects) if (found := schema.findings(o))}
    if checked:
        # Each object's schema findings come before the rules' findings on it, as `review` orders them.
        owners = _Owners(namespace)
        for i, o in enumerate(inputs.objects):
            owners.add(o, i)
        by_object: dict[int, list[Finding]] = {}
        rest: list[Finding] = []
        for f in report.findings:
            seq = owners.of(f)
            (rest if seq is None else by_object.setdefault(seq, [])).append(f)
        report.findings = [
            f
            for seq in sorted(by_object.keys() | checked.keys())
            for f in (*checked.get(seq, ()), *by_object.get(seq, ()))
        ] + rest
    if progress is not None and n > PROGRESS_THRESHOLD:
        dt = time.monotonic() - t0
        progress.say(f"evaluated {n} documents in {dt:.1f}s ({n / dt if dt else n:.0f}/s)")
    return ReviewResult(
        report=report,
        files=list(dict.fromkeys(inputs.files)),
        objects=[ReviewedObject(object_ref(o), o.file, o.line) for o in inputs.objects],
        ignored=report.ignored + len(inputs.skipped),
        kubernetes_version=kubernetes_version,
    )


class SchemaCheck:
    """`structure/schema` (webhook/review/openapi.py) for the review's Kubernetes release: each
    object against the API server's schema, before and apart from the rules, which still judge
    what they can read of it."""

    def __init__(self, kubernetes_version: str | None, namespace: str) -> None:
        from .openapi import load, pick_release

        release, self.note = pick_release(kubernetes_version)
        self.schemas = load(release)
        self.namespace = namespace

    def findings(self, item: SourceObject) -> list[Finding]:
        from .openapi import findings

        return findings(item, _key(item, self.namespace)[1], self.schemas)


CHUNK = 1024
"""Objects evaluated together while streaming: enough to spread the engine's per-call set-up, few
enough that their documents are a small part of the memory."""

_CLAIM_NAME_KEYS = frozenset({"resourceClaimTemplateName", "resourceClaimName"})
_WALK_NODES = 100_000  # containers a reference scan visits in one object (hostile input is bounded)


def _referenced_claims(obj: Mapping[str, Any]) -> set[str]:
    """Names of the claims and templates a workload's pod specs name, found by key anywhere in the
    object (so every workload CRD is covered without the workload table); may name more than the
    engine resolves, never fewer."""
    found: set[str] = set()
    stack: list[Any] = [obj]
    seen = 0
    while stack and seen < _WALK_NODES:
        node = stack.pop()
        seen += 1
        if isinstance(node, Mapping):
            for k, v in node.items():
                if k in _CLAIM_NAME_KEYS and isinstance(v, str):
                    found.add(v)
                elif isinstance(v, Mapping | list):
                    stack.append(v)
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, Mapping | list))
    return found


def _owner_pods(obj: Mapping[str, Any]) -> list[str]:
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    if not isinstance(refs, list):
        return []
    return [
        r["name"] for r in refs[:64]
        if isinstance(r, Mapping) and r.get("kind") == "Pod" and isinstance(r.get("name"), str)
    ]


def _key(item: SourceObject, default_namespace: str) -> tuple[str | None, ObjectRef]:
    """What a finding on `item` carries (its file and the engine's reference to it)."""
    from ..dra.objects import as_map, as_str
    from ..engine.resolve import namespace_of

    obj = item.obj
    meta = as_map(obj.get("metadata"))
    return item.file, ObjectRef(
        api_version=as_str(obj.get("apiVersion")) or "",
        kind=as_str(obj.get("kind")) or "",
        namespace=namespace_of(obj, default_namespace),
        name=as_str(meta.get("name")) or as_str(meta.get("generateName")) or "<unnamed>",
    )


class _Owners:
    """Which object of a call a finding is on: its file and reference, and among objects that share
    both (the same object twice in a file), the one whose text holds the finding's line."""

    def __init__(self, default_namespace: str) -> None:
        self.default_namespace = default_namespace
        self.by_key: dict[tuple[str | None, ObjectRef], list[tuple[int, int]]] = {}

    def add(self, item: SourceObject, seq: int) -> None:
        self.by_key.setdefault(_key(item, self.default_namespace), []).append((item.line or 0, seq))

    def of(self, f: Finding) -> int | None:
        found = self.by_key.get((f.file, f.object))
        if not found:
            return None
        if len(found) == 1 or f.line is None:
            return found[0][1]
        best = found[0][1]
        for line, seq in sorted(found):
            if line <= f.line:
                best = seq
        return best


@dataclass(slots=True)
class _Record:
    """What is kept of every object read, once its findings are taken: where to find it again (the
    source and its place there), its namespace, and when it was judged. Pods keep their name, in
    case a claim read later names one as its owner."""

    seq: int
    source: int
    ordinal: int
    namespace: str | None
    version: int
    detection: str | None
    refs: tuple[str, ...] = ()
    pod: str | None = None


class _Stream:
    """A review read one document at a time (see `review`)."""

    def __init__(
        self,
        policies: PolicySet,
        inventory: Inventory,
        *,
        namespace: str,
        cluster_labels: Mapping[str, Mapping[str, str]],
        kubernetes_version: str | None,
        driver_schema: str | None,
        progress: Progress | None,
    ) -> None:
        self.policies = policies
        self.inventory = inventory
        self.namespace = namespace
        self.cluster_labels = cluster_labels
        self.kubernetes_version = kubernetes_version
        self.driver_setting = driver_schema
        self.progress = progress
        # Kept in full until the end: the resource.k8s.io objects (claims, templates, classes,
        # slices), which other objects' verdicts read and which are judged last, against all of
        # them; and the labels of the Namespace objects read. Everything else is judged CHUNK
        # objects at a time and dropped, keeping a `_Record` and its findings.
        self.dra: list[tuple[int, SourceObject]] = []
        self.dra_by_name: dict[tuple[str | None, str], list[SourceObject]] = {}
        self.cluster_dra: list[SourceObject] = []
        self.requested: set[str] = set()
        self.ns_labels: dict[str, dict[str, str]] = {}
        # Context versions: a judged object is judged again at the end when context that can
        # change its verdict came after it: a claim or template of its namespace under a name it
        # refers to, its namespace's labels, any cluster-scoped resource.k8s.io object (classes),
        # or a change of the driver detected.
        self.version = 0
        self.ns_version: dict[str | None, int] = {}
        self.name_version: dict[tuple[str | None, str], int] = {}
        self.cluster_version = 0
        self.pending: list[tuple[int, int, int, SourceObject]] = []  # (seq, source, ordinal, object)
        self.records: list[_Record] = []
        self.findings: dict[int, list[Finding]] = {}
        self.schema = SchemaCheck(kubernetes_version, namespace)
        self.schema_findings: dict[int, list[Finding]] = {}  # by seq; kept apart: rules judge again
        self.unattributed: list[Finding] = []
        self.reviewed: list[ReviewedObject] = []
        self.ignored = 0
        self.objects = 0
        self.seq = 0

    # -- context ---------------------------------------------------------------------------------

    def _labels(self) -> dict[str, Mapping[str, str]]:
        return {**self.cluster_labels, **self.ns_labels}

    def _detection(self) -> str | None:
        """The driver schema to judge by, worked out from all resource.k8s.io objects read so far
        (what the engine detects from one input set): chunks see only part of the set."""
        if self.driver_setting:
            return self.driver_setting
        from ..dra.drivers import detect, from_devices
        from ..dra.objects import read_device_class

        classes = dict(self.inventory.classes)
        for item in self.cluster_dra:
            if item.obj.get("kind") == "DeviceClass":
                dc = read_device_class(item.obj)
                if dc.name:
                    classes[dc.name] = dc
        evidence = self.inventory.cached(("driver-evidence",), lambda: from_devices(self.inventory.devices))
        return str(detect(None, (), classes, self.requested, evidence=evidence).schema.name)

    def _add_context(self, item: SourceObject) -> None:
        from ..dra.objects import claim_spec_of, dra_version
        from ..engine.resolve import namespace_of

        obj = item.obj
        ns = namespace_of(obj, self.namespace)
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        self.version += 1
        if ns is None:
            self.cluster_dra.append(item)
            self.cluster_version = self.version
        elif isinstance(name, str):
            self.name_version[(ns, name)] = self.version
            self.dra_by_name.setdefault((ns, name), []).append(item)
        try:
            read = claim_spec_of(obj) if dra_version(obj.get("apiVersion")) else None
        except Exception:  # the engine reports a malformed claim; here it only names no class
            read = None
        if read is not None:  # the class names claims request are evidence of the driver
            self.requested.update(c for r in read[0].requests for c in r.device_classes() if c)

    # -- reading -----------------------------------------------------------------------------------

    def add(self, source: int, ordinal: int, item: SourceObject) -> None:
        from ..dra.objects import GROUP, split_api_version

        self.objects += 1
        self.reviewed.append(ReviewedObject(object_ref(item), item.file, item.line))
        if checked := self.schema.findings(item):
            self.schema_findings[self.seq] = checked
        try:
            group = split_api_version(item.obj.get("apiVersion"))[0]
        except Exception:
            group = None
        if group == GROUP:
            self.dra.append((self.seq, item))
            self.seq += 1
            self._add_context(item)
            return
        if item.obj.get("kind") == "Namespace":
            found = namespace_labels_of([item.obj])
            for ns, labels in found.items():
                if ns not in self.ns_labels:  # the first of duplicates wins, as in namespace_labels_of
                    self.version += 1
                    self.ns_labels[ns] = labels
                    self.ns_version[ns] = self.version
        self.pending.append((self.seq, source, ordinal, item))
        self.seq += 1
        if len(self.pending) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        """Judge the objects read since the last flush."""
        from ..engine.resolve import namespace_of

        if not self.pending:
            return
        batch, self.pending = self.pending, []
        detection = self._detection()
        records: list[tuple[_Record, SourceObject]] = []
        for seq, source, ordinal, item in batch:
            ns = namespace_of(item.obj, self.namespace)
            ns = sys.intern(ns) if ns is not None else None
            pod = None
            if item.obj.get("kind") == "Pod":
                meta = item.obj.get("metadata")
                name = meta.get("name") if isinstance(meta, Mapping) else None
                pod = name if isinstance(name, str) else None
            refs = tuple(sorted(_referenced_claims(item.obj)))
            records.append((_Record(seq, source, ordinal, ns, self.version, detection, refs, pod), item))
        self._judge(records, detection)
        self.records.extend(r for r, _ in records)

    def _support(self, records: Sequence[_Record]) -> list[SourceObject]:
        """The resource.k8s.io objects read so far that `records` may resolve: every cluster-scoped
        one (classes) and the claims and templates they name in their namespace."""
        out: dict[int, SourceObject] = {id(o): o for o in self.cluster_dra}
        if self.dra_by_name:
            for rec in records:
                for name in rec.refs:
                    for o in self.dra_by_name.get((rec.namespace, name), ()):
                        out[id(o)] = o
        return list(out.values())

    def _stale(self, rec: _Record, detection: str | None) -> bool:
        return (
            rec.detection != detection
            or rec.version < self.cluster_version
            or rec.version < self.ns_version.get(rec.namespace, 0)
            or any(rec.version < self.name_version.get((rec.namespace, n), 0) for n in rec.refs)
        )

    def _judge(self, records: list[tuple[_Record, SourceObject]], detection: str | None) -> None:
        """Evaluate `records`' objects with the context they may read; keep their findings only."""
        items = [item for _, item in records]
        support = self._support([r for r, _ in records])
        report = self._evaluate([*support, *items], detection)
        mine = _Owners(self.namespace)
        for rec, item in records:
            mine.add(item, rec.seq)
            self.findings.pop(rec.seq, None)
        for f in report.findings:
            seq = mine.of(f)
            if seq is not None:
                self.findings.setdefault(seq, []).append(f)
        self.ignored += report.ignored - self._unread(support)

    def _judge_again(self, part: list[tuple[_Record, SourceObject]], detection: str | None) -> None:
        if not part:
            return
        before = self.ignored
        for r, _ in part:
            r.version, r.detection = self.version, detection
        self._judge(part, detection)
        self.ignored = before  # judged twice: the kinds no rule reads are counted once

    def _unread(self, support: Sequence[SourceObject]) -> int:
        """How many of `support` the engine counts as ignored (kinds no rule reads): they are
        counted where they are judged themselves."""
        from ..dra.workloads import is_workload_kind, using_crd_table
        from ..engine.evaluate import KNOWN_KINDS

        with using_crd_table(self.policies.crd_table):
            return sum(
                1 for o in support
                if not (isinstance(k := o.obj.get("kind"), str) and (k in KNOWN_KINDS or is_workload_kind(k)))
            )

    def _evaluate(self, objects: list[SourceObject], detection: str | None) -> Report:
        from ..engine.evaluate import evaluate

        ctx = Context(
            default_namespace=self.namespace, namespace_labels=self._labels(),
            kubernetes_version=self.kubernetes_version, driver_schema=detection,
        )
        return evaluate(objects, self.policies, self.inventory, ctx)

    # -- the end ---------------------------------------------------------------------------------

    def finish(
        self, reread: Callable[[dict[int, set[int]]], Iterator[tuple[tuple[int, int], SourceObject]]]
    ) -> Report:
        """Judge what is left: the last chunk, objects judged before context that concerns them
        came, and the resource.k8s.io objects against everything (with the pods that own claims)."""
        self.flush()
        detection = self._detection()
        stale = [r for r in self.records if self._stale(r, detection)]
        owners = {
            (ns, pod)
            for _, item in self.dra
            for pod in _owner_pods(item.obj)
            for ns in (namespace_of_item(item, self.namespace),)
        }
        owner_records = [r for r in self.records if r.pod is not None and (r.namespace, r.pod) in owners]
        wanted: dict[int, set[int]] = {}
        for r in (*stale, *owner_records):
            wanted.setdefault(r.source, set()).add(r.ordinal)
        if stale and self.progress is not None and self.progress.enabled:
            self.progress.say(f"judging {len(stale)} objects again: context they read came after them")
        by_place = {(r.source, r.ordinal): r for r in stale}
        owner_places = {(r.source, r.ordinal) for r in owner_records}
        pods: list[SourceObject] = []
        part: list[tuple[_Record, SourceObject]] = []
        # Read again in order and judged CHUNK at a time, as on the first read: memory stays bounded.
        for place, item in reread(wanted) if wanted else iter(()):
            if place in owner_places:
                pods.append(item)  # kept for the last call (pods a claim names as its owner)
            rec = by_place.get(place)
            if rec is not None:
                part.append((rec, item))
                if len(part) >= CHUNK:
                    self._judge_again(part, detection)
                    part = []
        self._judge_again(part, detection)
        # The last call: every resource.k8s.io object against all the others, the owning pods as
        # support; the findings on no object of the input (expired exceptions) come from it alone.
        dra_items = [item for _, item in self.dra]
        report = self._evaluate([*pods, *dra_items], detection)
        mine = _Owners(self.namespace)
        for seq, item in self.dra:
            mine.add(item, seq)
        pod_keys = {_key(p, self.namespace) for p in pods}
        for f in report.findings:
            owner = mine.of(f)
            if owner is not None:
                self.findings.setdefault(owner, []).append(f)
            elif (f.file, f.object) not in pod_keys:
                self.unattributed.append(f)
        self.ignored += report.ignored - self._unread(pods)
        ordered = [
            f
            for seq in sorted(self.findings.keys() | self.schema_findings.keys())
            for f in (*self.schema_findings.get(seq, ()), *self.findings.get(seq, ()))
        ]
        return Report(findings=[*ordered, *self.unattributed], objects=self.objects, ignored=self.ignored)


def namespace_of_item(item: SourceObject, default: str) -> str | None:
    from ..engine.resolve import namespace_of

    return namespace_of(item.obj, default)


def review(
    paths: Sequence[str],
    *,
    policies: str | None = DEFAULT_POLICIES,
    policies_required: bool = False,
    inventory: str | None = None,
    namespace: str = "default",
    progress: Progress | None = None,
    stdin: Any = None,
    cluster_state: str | None = None,
    kubernetes_version: str | None = None,
    driver_schema: str | None = None,
    root: str | Path | None = None,
    exclude: Sequence[str | Path] = (),
) -> Reviewed:
    """Review paths with policies and an inventory; raise `ReviewError` for anything unreadable.
    `exclude`: paths skipped when directories are walked (besides the policies and inventory).

    Streamed: files are parsed one document at a time and judged CHUNK objects at a time, so
    memory follows the largest document and the resource.k8s.io objects (kept for the rules that
    read across objects), not the input. The verdicts are those of `evaluate_inputs` on the whole
    input set: an object judged before context that concerns it was read is judged again.
    """
    import tempfile

    from .inputs import STDIN, FileSource, iter_file, sources, spool_stdin

    policy_set = load_policy_set(policies, required=policies_required)
    if policies and not Path(policies).exists():
        shipped = shipped_policies() if policies == DEFAULT_POLICIES else None
        used = (
            f"judged by the default policies shipped with draguard ({shipped})"
            if shipped and policy_set.all() else "only the built-in checks ran"
        )
        print(f"draguard review: no {policies}/ here: {used} (--policies DIR for yours)", file=sys.stderr)
    inv = load_inventory_file(inventory)
    labels = load_cluster_state(cluster_state)
    if (note := SchemaCheck(kubernetes_version, namespace).note) is not None:
        print(f"draguard review: {note}", file=sys.stderr)
    skip = [Path(p) for p in (policies, inventory, *exclude) if p]
    stream = _Stream(
        policy_set, inv, namespace=namespace, cluster_labels=labels, kubernetes_version=kubernetes_version,
        driver_schema=driver_schema, progress=progress,
    )
    # Sources read already (stdin, kustomize builds, helm renders) are kept to be found again;
    # files are read again from disk.
    held: dict[int, Inputs] = {}
    files: dict[int, FileSource] = {}
    shown: list[str] = []
    skipped: list[Skipped] = []
    ticker = _Ticker(progress)
    t0 = time.monotonic()

    def read(index: int, src: FileSource | Inputs) -> Iterator[tuple[int, SourceObject]]:
        ordinal = 0
        if isinstance(src, Inputs):
            for item in src.objects:
                yield ordinal, item
                ordinal += 1
            return
        for objs, _skips in iter_file(src.path, src.shown):
            for item in objs:
                yield ordinal, item
                ordinal += 1

    spooled = None
    try:
        stdin_file = None
        if STDIN in paths:
            spooled = tempfile.NamedTemporaryFile(prefix="draguard-stdin-", suffix=".yaml")  # noqa: SIM115
            spool_stdin(spooled, stdin)
            stdin_file = Path(spooled.name)
        found = sources(paths, exclude=skip, stdin=stdin, root=root, stdin_file=stdin_file)
        for index, src in enumerate(found):
            if isinstance(src, Inputs):
                held[index] = src
                shown.extend(src.files)
                skipped.extend(src.skipped)
                for ordinal, item in enumerate(src.objects):
                    stream.add(index, ordinal, item)
                    ticker.tick(stream.objects)
                continue
            files[index] = src
            shown.append(src.shown)
            ordinal = 0
            for objs, skips in iter_file(src.path, src.shown):
                skipped.extend(skips)
                for item in objs:
                    stream.add(index, ordinal, item)
                    ordinal += 1
                    ticker.tick(stream.objects)

        def reread(wanted: dict[int, set[int]]) -> Iterator[tuple[tuple[int, int], SourceObject]]:
            """The objects at these places, read again one document at a time, in input order."""
            for index in sorted(wanted):
                ordinals = wanted[index]
                src: FileSource | Inputs = held[index] if index in held else files[index]
                last = max(ordinals)
                for ordinal, item in read(index, src):
                    if ordinal in ordinals:
                        yield (index, ordinal), item
                    if ordinal >= last:
                        break

        if progress is not None and stream.objects > PROGRESS_THRESHOLD:
            progress.say(
                f"evaluating {stream.objects} documents from {len(set(shown))} files: all read, "
                "judging the last of them and the claims, templates and classes"
            )
        report = stream.finish(reread)
    except InputError as exc:
        raise ReviewError(str(exc)) from None
    finally:
        if spooled is not None:
            spooled.close()  # removes it
    if progress is not None and stream.objects > PROGRESS_THRESHOLD:
        dt = time.monotonic() - t0
        progress.say(f"reviewed {stream.objects} objects from {len(set(shown))} files in {dt:.1f}s")
    result = ReviewResult(
        report=report,
        files=list(dict.fromkeys(shown)),
        objects=stream.reviewed,
        ignored=report.ignored + len(skipped),
        kubernetes_version=kubernetes_version,
    )
    return Reviewed(result, Inputs([], skipped, shown))


class _Ticker:
    """A progress line every few seconds while objects are read and judged."""

    EVERY = 2.0

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress if progress is not None and progress.enabled else None
        self.start = self.last = time.monotonic()

    def tick(self, objects: int) -> None:
        if self.progress is None or objects % 64:
            return
        now = time.monotonic()
        if now - self.last >= self.EVERY:
            self.last = now
            rate = objects / (now - self.start) if now > self.start else 0.0
            self.progress.say(f"{objects} objects reviewed ({rate:.0f}/s)")


__all__ = [
    "DEFAULT_POLICIES",
    "Progress",
    "ReviewError",
    "Reviewed",
    "display_path",
    "evaluate_inputs",
    "load_inventory_file",
    "load_policy_set",
    "review",
    "shipped_policies",
]
