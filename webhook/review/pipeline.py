"""The review pipeline: read inputs, load policies and inventory, call the engine (the same one the
webhook calls), and gather what the formats need. Every failure is a `ReviewError` (exit 2)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from webhook.core.findings import ObjectRef
from webhook.core.source import SourceObject
from webhook.engine.context import Context
from webhook.review.formats import ReviewedObject, ReviewResult
from webhook.review.inputs import InputError, Inputs, display_path, read_paths

if TYPE_CHECKING:
    from webhook.dra.inventory import Inventory
    from webhook.policy.model import PolicySet

DEFAULT_POLICIES = "policies"
PROGRESS_THRESHOLD = 200  # documents; below this a run is quick enough to need no progress


class ReviewError(Exception):
    """A usage error or unreadable input: one line, exit code 2."""


def load_policy_set(path: str | Path | None, *, required: bool) -> PolicySet:
    """Policies from a directory or file. A missing default directory means built-in checks only."""
    from webhook.policy.load import PolicyError, load_policies
    from webhook.policy.model import PolicySet

    if path is None:
        return PolicySet.empty()
    p = Path(path)
    if not p.exists():
        if required:
            raise ReviewError(f"{path}: policy directory not found (fix: pass --policies DIR)")
        return PolicySet.empty()
    try:
        return load_policies(p)
    except PolicyError as exc:
        raise ReviewError(str(exc)) from None
    except OSError as exc:
        raise ReviewError(f"{path}: cannot read policies: {exc.strerror or exc}") from None


def load_inventory_file(path: str | None) -> Inventory:
    from webhook.dra.inventory import Inventory, InventoryError, load_inventory

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
        from webhook.review.inputs import load_data, read_text

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
    from webhook.review.inputs import load_data, read_text

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
    return ObjectRef(
        api_version=str(item.obj.get("apiVersion") or ""),
        kind=str(item.obj.get("kind") or ""),
        namespace=ns if isinstance(ns, str) and ns else None,
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
    from webhook.engine.evaluate import evaluate

    n = len(inputs.objects)
    if progress is not None and n > PROGRESS_THRESHOLD:
        progress.say(f"evaluating {n} documents from {len(set(inputs.files))} files")
    t0 = time.monotonic()
    labels = {**(namespace_labels or {}), **namespace_labels_of([o.obj for o in inputs.objects])}
    ctx = Context(default_namespace=namespace, namespace_labels=labels, kubernetes_version=kubernetes_version,
                  driver_schema=driver_schema)
    report = evaluate(inputs.objects, policies, inventory, ctx)
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
) -> Reviewed:
    """Review paths with policies and an inventory; raise `ReviewError` for anything unreadable."""
    policy_set = load_policy_set(policies, required=policies_required)
    if policies and not policy_set.all() and not Path(policies).exists():
        print(
            f"draguard review: no {policies}/ here: only the built-in checks ran (pass --policies DIR)",
            file=sys.stderr,
        )
    inv = load_inventory_file(inventory)
    exclude = [Path(p) for p in (policies, inventory) if p]
    try:
        # `root`: the reviewed tree, which no symbolic link may leave (default: the working directory).
        inputs = read_paths(paths, exclude=exclude, stdin=stdin, root=root)
    except InputError as exc:
        raise ReviewError(str(exc)) from None
    if progress is not None and len(inputs.objects) > PROGRESS_THRESHOLD:
        progress.say(f"read {len(inputs.objects)} documents from {len(set(inputs.files))} files")
    labels = load_cluster_state(cluster_state)
    result = evaluate_inputs(
        inputs, policy_set, inv, namespace=namespace, progress=progress, namespace_labels=labels,
        kubernetes_version=kubernetes_version, driver_schema=driver_schema,
    )
    return Reviewed(result, inputs)


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
]
