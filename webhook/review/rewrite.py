"""`draguard migrate`: rewrite legacy `nvidia.com/gpu` manifests into DRA, keeping the file's
comments, key order and quoting (ruamel.yaml round-trip).

The decisions (which claim, which template, which DeviceClass) come from the engine's migration
planner (`webhook.engine.migration`), the same code the webhook's `migrate` mode patches with;
this module only applies its RFC 6902 patch to the YAML the user wrote. Only documents that change
are re-emitted; every other document keeps its exact text.
"""

from __future__ import annotations

import bisect
import difflib
import io
import itertools
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError as RuamelError

from ..dra import yamlload
from .inputs import (
    YAML_SUFFIXES,
    InputError,
    display_path,
    parse_text,
    read_text,
    resolve_in_tree,
    tree_for,
)
from .pipeline import ReviewError, load_policy_set

DEFAULT_GPU_CLASS = "gpu.nvidia.com"
DEFAULT_MIG_CLASS = "mig.nvidia.com"
_SEPARATOR = re.compile(r"^---(?:[ \t].*)?$")


class RewriteError(Exception):
    """A file that cannot be rewritten (one line: file and reason)."""


@dataclass(slots=True)
class MigrateOutcome:
    output: str = ""
    changed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- documents as text


@dataclass(slots=True)
class Chunk:
    """One document's text, with the `---` line that opened it (None for the first)."""

    separator: str | None
    body: str


def split_documents(text: str) -> list[Chunk]:
    """Split a YAML stream at column-0 `---` lines (block content is always indented)."""
    chunks: list[Chunk] = []
    sep: str | None = None
    buf: list[str] = []
    for line in text.splitlines(keepends=True):
        if _SEPARATOR.match(line.rstrip("\r\n")):
            chunks.append(Chunk(sep, "".join(buf)))
            sep, buf = line if line.endswith("\n") else line + "\n", []
        else:
            buf.append(line)
    chunks.append(Chunk(sep, "".join(buf)))
    return chunks


def join_documents(chunks: Sequence[Chunk]) -> str:
    return "".join((c.separator or "") + c.body for c in chunks)


def detect_indent(text: str) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) the file already uses, for ruamel's emitter."""
    mapping, offset = None, None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for prev, nxt in itertools.pairwise(lines):
        if not prev.rstrip().endswith(":"):
            continue
        pcol = len(prev) - len(prev.lstrip(" "))
        body = prev.lstrip(" ")
        if body.startswith("- "):
            pcol += 2  # a key on a list item line: its children indent from the key
        ncol = len(nxt) - len(nxt.lstrip(" "))
        if ncol <= pcol:
            continue
        if nxt.lstrip().startswith("- "):
            offset = offset if offset is not None else ncol - pcol
        else:
            mapping = mapping if mapping is not None else ncol - pcol
        if mapping is not None and offset is not None:
            break
    m = mapping or 2
    o = offset if offset is not None else 0
    return m, max(m, o + 2), o


def _yaml(text: str) -> YAML:
    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap long strings (CEL expressions, commands)
    m, s, o = detect_indent(text)
    y.indent(mapping=m, sequence=s, offset=o)
    return y


# --------------------------------------------------------------------------- RFC 6902 on ruamel


def _to_ruamel(value: Any) -> Any:
    if isinstance(value, Mapping):
        cm = CommentedMap()
        for k, v in value.items():
            cm[k] = _to_ruamel(v)
        return cm
    if isinstance(value, list | tuple):
        return CommentedSeq([_to_ruamel(v) for v in value])
    return value


def _tokens(pointer: str) -> list[str]:
    if not pointer:
        return []
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer.lstrip("/").split("/")]


def _parent(doc: Any, tokens: Sequence[str]) -> Any:
    node = doc
    for t in tokens:
        node = node[int(t)] if isinstance(node, list) else node[t]
    return node


def apply_patch(doc: Any, patch: Sequence[Mapping[str, Any]]) -> None:
    """Apply add/remove/replace operations in place, keeping ruamel's comments and order."""
    for op in patch:
        tokens = _tokens(str(op["path"]))
        parent = _parent(doc, tokens[:-1])
        last = tokens[-1]
        kind = op["op"]
        if kind == "add":
            value = _to_ruamel(op["value"])
            if isinstance(parent, list):
                if last == "-":
                    parent.append(value)
                else:
                    parent.insert(int(last), value)
            else:
                parent[last] = value
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        elif kind == "replace":
            if isinstance(parent, list):
                parent[int(last)] = _to_ruamel(op["value"])
            else:
                parent[last] = _to_ruamel(op["value"])
        else:  # the planner only emits the three above
            raise RewriteError(f"unsupported patch operation {kind!r}")


def rename_key(mapping: CommentedMap, old: str, new: str) -> None:
    """Rename a key in place, keeping its position and value."""
    keys = list(mapping.keys())
    pos = keys.index(old)
    value = mapping[old]
    comment = mapping.ca.items.pop(old, None)  # the end-of-line comment moves with the key
    del mapping[old]
    mapping.insert(pos, new, value)
    if comment is not None:
        mapping.ca.items[new] = comment


# --------------------------------------------------------------------------- the policy to apply


def migration_policy(
    policies: str | None, required: bool, strategy: str | None, mig_resources: set[str]
) -> Any:
    """The first MigrationPolicy of the policy set, else NVIDIA's default classes.

    Without a policy, `nvidia.com/gpu` maps to the `gpu.nvidia.com` class and each
    `nvidia.com/mig-<profile>` to `mig.nvidia.com` with a selector on that profile.
    """
    from ..policy.model import MigrationPolicy, MigrationStrategy, ResourceMapping

    policy_set = load_policy_set(policies, required=required)
    chosen: MigrationPolicy
    if policy_set.migration:
        chosen = policy_set.migration[0]
    else:
        mappings = [ResourceMapping(resource="nvidia.com/gpu", device_class=DEFAULT_GPU_CLASS)]
        for res in sorted(mig_resources):
            profile = res[len("nvidia.com/mig-") :]
            mappings.append(
                ResourceMapping(
                    resource=res,
                    device_class=DEFAULT_MIG_CLASS,
                    selectors=(f"device.attributes['{DEFAULT_GPU_CLASS}'].profile == '{profile}'",),
                )
            )
        chosen = MigrationPolicy(name="default", mappings=tuple(mappings))
    if strategy:
        import dataclasses

        chosen = dataclasses.replace(chosen, strategy=MigrationStrategy(strategy))
    return chosen


# --------------------------------------------------------------------------- one file


def _yaml_files(paths: Sequence[str]) -> Iterator[Path]:
    # As review: no link is followed out of the tree (its target's text would be printed in the
    # diff), and `read_text` refuses special files.
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise RewriteError(f"{raw}: no such file or directory")
        try:
            tree = tree_for(p)
            resolve_in_tree(p, tree, raw)
            if p.is_file():
                yield p
                continue
            for f in sorted(p.rglob("*")):
                rel = f.relative_to(p)
                if any(part.startswith(".") for part in rel.parts):
                    continue
                if f.name.endswith(YAML_SUFFIXES) and f.is_symlink():
                    resolve_in_tree(f, tree)
                if f.is_file() and f.name.endswith(YAML_SUFFIXES):
                    yield f
        except InputError as exc:
            raise RewriteError(str(exc)) from None


def _plain(body: str) -> Any:
    try:
        return yamlload.load(body)
    except yaml.YAMLError:
        return None


def _ref(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind')}/{ns}{meta.get('name')}"


def _existing(chunks: Sequence[Chunk]) -> set[tuple[str, str, str]]:
    out: set[tuple[str, str, str]] = set()
    for c in chunks:
        data = _plain(c.body)
        if isinstance(data, Mapping) and isinstance(data.get("metadata"), Mapping):
            meta = data["metadata"]
            out.add((str(data.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name"))))
    return out


def _dump(y: YAML, data: Any) -> str:
    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()


def _namespace_of(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, Mapping) else None
    return ns if isinstance(ns, str) and ns else None


def _merge(plans: Sequence[Any]) -> Any:
    """One plan for a workload with several pod templates: patches concatenated (their paths are
    disjoint), templates once each."""
    import dataclasses

    if len(plans) == 1:
        return plans[0]
    templates: dict[str, Any] = {}
    for p in plans:
        for t in p.templates:
            templates.setdefault(t["metadata"]["name"], t)
    return dataclasses.replace(
        plans[0],
        uses=[u for p in plans for u in p.uses],
        edits=[e for p in plans for e in p.edits],
        unmapped=[u for p in plans for u in p.unmapped],
        refused=[r for p in plans for r in p.refused],
        patch=[op for p in plans for op in p.patch],
        templates=list(templates.values()),
    )


def _device_classes(texts: Mapping[Path, str]) -> dict[str, Any]:
    """name -> DeviceClass (the engine's form) of every DeviceClass in the files."""
    from ..dra.objects import read_device_class

    out: dict[str, Any] = {}
    for text in texts.values():
        if "DeviceClass" not in text:
            continue
        try:
            chunks = split_documents(text)
        except Exception:  # unreadable: the per-file parse reports it with its line
            continue
        for chunk in chunks:
            data = _plain(chunk.body)
            if isinstance(data, Mapping) and data.get("kind") == "DeviceClass":
                cls = read_device_class(data)
                out.setdefault(cls.name, cls)
    return out


def _train_job_notes(
    shown: str, data: Mapping[str, Any], specs: list[Mapping[str, Any]], classes: Mapping[str, Any] | None
) -> list[str]:
    """Why a TrainJob's device-plugin GPUs are left as they are: its trainer is one container whose
    pod, and so its claims, the (Cluster)TrainingRuntime declares."""
    from ..engine.migration import find_legacy

    # A resource a DeviceClass serves as its extendedResourceName is a DRA request already (KEP-5004).
    served = {getattr(c, "extended_resource_name", None) for c in (classes or {}).values()}
    notes = []
    for spec in specs:
        for use in find_legacy(spec, ""):
            if use.resource in served:
                continue
            notes.append(
                f"{shown}: {_ref(data)} spec.trainer.resourcesPerNode {use.resource}: left unchanged: the "
                "trainer's pod is declared by its TrainingRuntime; request the GPUs through resourceClaims "
                "in the runtime's pod template and drop them from spec.trainer.resourcesPerNode"
            )
    return notes


def rewrite_text(
    text: str, shown: str, policy: Any, placed: dict[tuple[str, str, str], str] | None = None,
    tiers: Any = None, classes: Mapping[str, Any] | None = None,
) -> tuple[str, list[str]]:
    """The migrated text of one file and notes about what could not be migrated.

    `placed` (object key -> file) holds the objects of every file in this run: a template that
    exists, or was written for an earlier file, is not written again (kustomize refuses duplicates).
    """
    from ..dra.workloads import pod_spec_of, pod_templates_of
    from ..engine.migration import hosted_forms, plan_pod_spec, use_label

    chunks = split_documents(text)
    present: dict[tuple[str, str, str], str] = placed if placed is not None else {}
    for key in _existing(chunks):
        present.setdefault(key, shown)
    out: list[Chunk] = []
    notes: list[str] = []
    for chunk in chunks:
        out.append(chunk)
        data = _plain(chunk.body)
        if isinstance(data, Mapping) and data.get("kind") == "TrainJob":
            trainers = [t.spec for t in pod_templates_of(data) if t.container]
            notes.extend(_train_job_notes(shown, data, trainers, classes))
        if not isinstance(data, Mapping) or pod_spec_of(data) is None:
            continue
        # Indentation styles differ between documents pasted into one file: follow each one's.
        y = _yaml(chunk.body)
        allowed = None
        if tiers is not None:
            from ..engine.rules.migrate import tier_allowed

            meta = data.get("metadata") if isinstance(data.get("metadata"), Mapping) else {}
            ns = str((meta or {}).get("namespace") or "default")
            allowed = tier_allowed(tiers, data, ns, None)
        templates = pod_templates_of(data)
        # A one-container form (KServe's `predictor.model`, `predictor.pytorch`, ...) is rewritten with
        # the pod spec it belongs to: the claim goes there, the container names it.
        forms = hosted_forms(data, templates)
        plans = [p for p in (
            plan_pod_spec(data, t.pointer, t.spec, policy, namespace=_namespace_of(data), allowed=allowed,
                          rewrite=False, classes=classes, forms=forms.get(t.pointer, ()))
            for t in templates if not t.container
        )]  # fmt: skip
        if not plans:
            continue
        plan = _merge(plans)
        for use in plan.unmapped:
            notes.append(
                f"{shown}: {_ref(data)} {use_label(use)} {use.resource}: "
                + (f"count {use.bad_count!r} is not a whole number" if use.bad_count else "no mapping")
                + " (left unchanged; add a MigrationPolicy mapping)"
            )
        for use, why in plan.refused:
            where = f"{shown}: {_ref(data)} {use_label(use)} {use.resource}"
            notes.append(f"{where}: left unchanged: {why}")
        if not plan.patch:
            continue
        try:
            doc = y.load(chunk.body)
        except RuamelError as exc:
            raise RewriteError(f"{shown}: cannot round-trip this YAML: {str(exc).splitlines()[0]}") from None
        apply_patch(doc, plan.patch)
        out[-1] = Chunk(chunk.separator, _dump(y, doc))
        for tmpl in plan.templates:
            meta = tmpl.get("metadata", {})
            key = (str(tmpl.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))
            if key in present:
                if present[key] != shown:
                    notes.append(
                        f"{shown}: {_ref(data)} uses ResourceClaimTemplate {key[2]}, kept in {present[key]}"
                    )
                continue
            present[key] = shown
            if not out[-1].body.endswith("\n"):
                out[-1] = Chunk(out[-1].separator, out[-1].body + "\n")
            out.append(Chunk("---\n", _dump(y, _to_ruamel(tmpl))))
    return join_documents(out), notes


def legacy_class_needs(texts: Mapping[Path, str], policy: Any, notes: list[str]) -> dict[str, str]:
    """Extended-resource strategy: DeviceClass name -> the legacy resource it must serve.

    KEP-5004 keeps `nvidia.com/gpu: N` in the pod; the scheduler serves it from the DeviceClass
    that declares `extendedResourceName: nvidia.com/gpu` (the engine's migrate rule checks this).
    """
    from ..dra.workloads import pod_spec_of, pod_templates_of
    from ..engine.migration import find_legacy, hosted_forms, node_labels_of, with_forms

    needs: dict[str, str] = {}
    for f, text in texts.items():
        if "nvidia.com/" not in text:
            continue
        shown = display_path(f)
        for chunk in split_documents(text):
            data = _plain(chunk.body)
            found = pod_spec_of(data) if isinstance(data, Mapping) else None
            if found is None:
                continue
            assert isinstance(data, Mapping)
            pointer, podspec = found
            # KServe's one-container forms keep their limits in their own container of this pod.
            podspec, at = with_forms(podspec, hosted_forms(data, pod_templates_of(data)).get(pointer, ()))
            for use in find_legacy(podspec, pointer, at):
                mapping = policy.mapping_for(use.resource, node_labels_of(podspec))
                if mapping is None:
                    notes.append(f"{shown}: {_ref(data)} {use.resource}: no MigrationPolicy mapping (left)")
                elif mapping.selectors:
                    notes.append(
                        f"{shown}: {_ref(data)} {use.resource}: its mapping adds selectors, which an "
                        "extended resource cannot carry; use --strategy claim-template"
                    )
                elif needs.get(mapping.device_class, use.resource) != use.resource:
                    notes.append(
                        f"DeviceClass {mapping.device_class} would have to serve both "
                        f"{needs[mapping.device_class]} and {use.resource}; a class serves one name"
                    )
                else:
                    needs[mapping.device_class] = use.resource
    return needs


def serve_extended_resources(text: str, needs: dict[str, str], served: set[str]) -> str:
    """Set `spec.extendedResourceName` on the DeviceClasses of this file that `needs` names."""
    chunks = split_documents(text)
    out: list[Chunk] = []
    for chunk in chunks:
        data = _plain(chunk.body)
        name = None
        if isinstance(data, Mapping) and data.get("kind") == "DeviceClass":
            meta = data.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
        if name not in needs:
            out.append(chunk)
            continue
        served.add(str(name))
        spec = data.get("spec") if isinstance(data, Mapping) else None
        if isinstance(spec, Mapping) and spec.get("extendedResourceName") == needs[str(name)]:
            out.append(chunk)
            continue
        y = _yaml(chunk.body)
        doc = y.load(chunk.body)
        if not isinstance(doc.get("spec"), CommentedMap):
            doc["spec"] = CommentedMap()
        doc["spec"]["extendedResourceName"] = needs[str(name)]
        out.append(Chunk(chunk.separator, _dump(y, doc)))
    return join_documents(out)


def _anchors(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int]]:
    """Lines that occur once in each text, in an order both texts agree on (longest increasing run).

    Patience-style anchors: a migrated manifest changes a few lines per container, and every
    container's `- name:` line is unique, so the texts split into many small regions.
    """
    count_a: dict[str, int] = {}
    for line in a:
        count_a[line] = count_a.get(line, 0) + 1
    count_b: dict[str, int] = {}
    where_b: dict[str, int] = {}
    for j, line in enumerate(b):
        count_b[line] = count_b.get(line, 0) + 1
        where_b[line] = j
    pairs = [(i, where_b[line]) for i, line in enumerate(a) if count_a[line] == 1 and count_b.get(line) == 1]
    # Longest increasing subsequence of the b positions (patience sorting, O(n log n)).
    tails: list[int] = []
    tail_at: list[int] = []
    back: list[int] = [-1] * len(pairs)
    for k, (_, j) in enumerate(pairs):
        pos = bisect.bisect_left(tails, j)
        if pos == len(tails):
            tails.append(j)
            tail_at.append(k)
        else:
            tails[pos] = j
            tail_at[pos] = k
        back[k] = tail_at[pos - 1] if pos else -1
    out: list[tuple[int, int]] = []
    k = tail_at[-1] if tail_at else -1
    while k >= 0:
        out.append(pairs[k])
        k = back[k]
    out.reverse()
    return out


def _opcodes(a: Sequence[str], b: Sequence[str]) -> list[Op]:
    """difflib opcodes for `a` -> `b`, with difflib run only between unique anchor lines.

    `difflib.SequenceMatcher` over a whole 36,000-line manifest with 3,000 changed spots takes
    seconds per thousand containers; split at the anchors, each region is a few lines.
    """
    ops: list[Op] = []

    def add(tag: str, i1: int, i2: int, j1: int, j2: int) -> None:
        if i1 == i2 and j1 == j2:
            return
        if ops and ops[-1][0] == tag and ops[-1][2] == i1 and ops[-1][4] == j1:
            ops[-1] = (tag, ops[-1][1], i2, ops[-1][3], j2)
        else:
            ops.append((tag, i1, i2, j1, j2))

    i = j = 0
    for ai, bj in [*_anchors(a, b), (len(a), len(b))]:
        region = difflib.SequenceMatcher(None, a[i:ai], b[j:bj], autojunk=False)
        for tag, i1, i2, j1, j2 in region.get_opcodes():
            add(tag, i + i1, i + i2, j + j1, j + j2)
        if ai < len(a):
            add("equal", ai, ai + 1, bj, bj + 1)
        i, j = ai + 1, bj + 1
    return ops


SMALL_DIFF = 4000
"""Below this many lines (both sides) difflib's own unified diff is fast enough and used as is."""


def unified_diff(a: Sequence[str], b: Sequence[str], fromfile: str, tofile: str, n: int = 3) -> Iterator[str]:
    """`difflib.unified_diff` output; large texts are matched between unique anchor lines first."""
    if len(a) + len(b) < SMALL_DIFF:
        yield from difflib.unified_diff(a, b, fromfile=fromfile, tofile=tofile, n=n)
        return
    started = False
    for group in _hunks(_opcodes(a, b), n):
        if not started:
            started = True
            yield f"--- {fromfile}\n"
            yield f"+++ {tofile}\n"
        first, last = group[0], group[-1]
        yield f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n"
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                yield from (" " + line for line in a[i1:i2])
                continue
            if tag in ("replace", "delete"):
                yield from ("-" + line for line in a[i1:i2])
            if tag in ("replace", "insert"):
                yield from ("+" + line for line in b[j1:j2])


Op = tuple[str, int, int, int, int]


def _hunks(ops: Sequence[Op], n: int) -> Iterator[list[Op]]:
    """Changes with `n` lines of context, split where more than 2n unchanged lines separate them."""
    hunk: list[Op] = []
    for tag, i1, i2, j1, j2 in ops:
        if tag != "equal":
            hunk.append((tag, i1, i2, j1, j2))
            continue
        if not hunk:  # leading context of the next hunk
            lead = max(i1, i2 - n)
            hunk.append((tag, lead, i2, j2 - (i2 - lead), j2))
            continue
        if i2 - i1 > 2 * n:  # close this hunk, open the next with trailing context
            hunk.append((tag, i1, i1 + n, j1, j1 + n))
            if any(op[0] != "equal" for op in hunk):
                yield hunk
            hunk = [(tag, i2 - n, i2, j2 - n, j2)]
        else:
            hunk.append((tag, i1, i2, j1, j2))
    if hunk and hunk[-1][0] == "equal":
        tag, i1, i2, j1, j2 = hunk[-1]
        hunk[-1] = (tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n))
    if any(op[0] != "equal" for op in hunk):
        yield hunk


def _range(start: int, stop: int) -> str:
    """A unified-diff range, as difflib writes it."""
    beginning, length = start + 1, stop - start
    if length == 1:
        return f"{beginning}"
    if not length:
        beginning -= 1
    return f"{beginning},{length}"


def migrate_paths(
    paths: Sequence[str],
    *,
    policies: str | None,
    policies_required: bool,
    strategy: str | None,
    write: bool,
) -> MigrateOutcome:
    from ..dra.workloads import using_crd_table

    # Workload CRDs a WorkloadKindPolicy adds are rewritten as review and admission read them.
    table = load_policy_set(policies, required=False).crd_table if policies else None
    with using_crd_table(table):
        return _migrate_paths(
            paths, policies=policies, policies_required=policies_required, strategy=strategy, write=write
        )


def _migrate_paths(
    paths: Sequence[str],
    *,
    policies: str | None,
    policies_required: bool,
    strategy: str | None,
    write: bool,
) -> MigrateOutcome:
    files = list(_yaml_files(paths))
    texts: dict[Path, str] = {}
    mig: set[str] = set()
    for f in files:
        try:
            texts[f] = read_text(f, display_path(f))
        except InputError as exc:
            raise RewriteError(str(exc)) from None
        mig.update(re.findall(r"nvidia\.com/mig-[0-9a-z.]+", texts[f]))
    try:
        policy = migration_policy(policies, policies_required, strategy, mig)
    except ReviewError:
        raise
    # The tier policies next to it: the rewrite picks a class they allow for each workload.
    tiers = load_policy_set(policies, required=False) if policies else None
    # DeviceClasses among the files: one serving a resource as its extendedResourceName makes that
    # resource DRA already (left alone), and a pod pinned to a GPU model gets the class of that model.
    classes = _device_classes(texts)
    outcome = MigrateOutcome()
    diffs: list[str] = []
    extended = policy.strategy.value == "extended-resource"
    needs: dict[str, str] = legacy_class_needs(texts, policy, outcome.notes) if extended else {}
    served: set[str] = set()
    # Objects already in any of the files: a generated template is written once, in the first file
    # that needs it (or not at all when one of the files has it).
    placed: dict[tuple[str, str, str], str] = {}
    for f in files:
        if not extended and f.suffix != ".json" and "kind:" in texts[f]:
            try:
                keys = _existing(split_documents(texts[f]))
            except Exception:  # unreadable: the per-file parse below reports it with its line
                continue
            for key in keys:
                placed.setdefault(key, display_path(f))
    for f in files:
        shown = display_path(f)
        text = texts[f]
        if extended:
            if "DeviceClass" not in text:
                continue
            new = serve_extended_resources(text, needs, served)
        else:
            if "nvidia.com/" not in text:
                continue  # nothing legacy here; skip the parse
            if f.suffix == ".json":
                # Claim templates are new documents, which a JSON file cannot hold next to the workload.
                outcome.notes.append(f"{shown}: JSON manifests are not rewritten; convert it to YAML first")
                continue
            try:
                # Unreadable input (bad YAML, an alias bomb, an integer too long) is an error with
                # its line here; the per-document reads below would only skip it silently.
                parse_text(text, shown)
            except InputError as exc:
                raise RewriteError(str(exc)) from None
            new, notes = rewrite_text(text, shown, policy, placed, tiers, classes)
            outcome.notes.extend(notes)
        if new == text:
            continue
        outcome.changed.append(shown)
        if write:
            if f.is_symlink():
                # The tree may come from an untrusted branch: a link could aim the write anywhere.
                raise RewriteError(
                    f"{f}: is a symbolic link (to {os.readlink(f)}); migrate --write never writes "
                    "through links: run it on the file the link points to"
                )
            try:
                f.write_text(new, encoding="utf-8")
            except OSError as exc:
                raise RewriteError(f"{shown}: cannot write: {exc.strerror or exc}") from None
        else:
            diffs.extend(
                unified_diff(
                    text.splitlines(keepends=True),
                    new.splitlines(keepends=True),
                    fromfile=shown if shown.startswith("/") else f"a/{shown}",
                    tofile=shown if shown.startswith("/") else f"b/{shown}",
                )
            )
    if write:
        outcome.output = "".join(f"migrated {s}\n" for s in outcome.changed) or "nothing to migrate\n"
    else:
        outcome.output = "".join(
            d if d.endswith("\n") else d + "\n\\ No newline at end of file\n" for d in diffs
        )
    for cls in sorted(set(needs) - served):
        outcome.notes.append(
            f"DeviceClass {cls} is not among these files: set spec.extendedResourceName: {needs[cls]} "
            "on it in the cluster (workloads keep their limits)"
        )
    if extended and needs:
        outcome.notes.append(
            "extended-resource strategy: pods keep their nvidia.com/* limits; the cluster needs the "
            "DRAExtendedResource feature gate (alpha 1.34, beta 1.36) on apiserver, scheduler and kubelet"
        )
    return outcome
