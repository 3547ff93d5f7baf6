"""Impact diff: review the manifests and policies as of a git ref and as in the working tree, and
report only the verdicts that changed, each attributed to the policy change that caused it.

The ref is read with `git archive` into a temporary directory; the working tree is never touched.
Both sides use the same inventory (the working tree's), so a changed verdict comes from a changed
manifest or a changed policy, never from a different cluster.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..core.findings import Finding, Mode, Report
from ..dra import yamlload
from .formats import ReviewResult, finding_sort_key
from .pipeline import (
    Progress,
    Reviewed,
    ReviewError,
    evaluate_inputs,
    load_inventory_file,
    load_policy_set,
)

# What a change of mode means, keyed by (mode at base, mode now); None = no finding.
NEWLY_DENIED = "newly-denied"
NO_LONGER_DENIED = "no-longer-denied"
NEW_WARNING = "new-warning"
WARNING_RESOLVED = "warning-resolved"
NEW_AUDIT = "new-audit"
AUDIT_RESOLVED = "audit-resolved"
REWRITE_CHANGED = "rewrite-changed"

CHANGE_ORDER = (
    NEWLY_DENIED,
    NEW_WARNING,
    REWRITE_CHANGED,
    NEW_AUDIT,
    NO_LONGER_DENIED,
    WARNING_RESOLVED,
    AUDIT_RESOLVED,
)
CHANGE_TITLE = {
    NEWLY_DENIED: "Newly denied",
    NO_LONGER_DENIED: "No longer denied",
    NEW_WARNING: "New warnings",
    WARNING_RESOLVED: "Warnings resolved",
    NEW_AUDIT: "New audit findings",
    AUDIT_RESOLVED: "Audit findings resolved",
    REWRITE_CHANGED: "Changed rewrites",
}
POLICY_GROUP = "policy.draguard.io/"
_RANK = {None: 0, Mode.AUDIT: 1, Mode.WARN: 2, Mode.ENFORCE: 3}


# --------------------------------------------------------------------------- git


def _git(args: Sequence[str], cwd: Path, *, binary: bool = False) -> Any:
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False, timeout=300)
    except FileNotFoundError:
        raise ReviewError("--base needs git on PATH") from None
    except subprocess.TimeoutExpired:
        raise ReviewError(f"git {args[0]} did not finish in 300s") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ReviewError(f"git {' '.join(args[:2])}: {err[-1] if err else 'failed'}")
    return proc.stdout if binary else proc.stdout.decode("utf-8", "replace").strip()


def repo_root(cwd: Path) -> Path:
    try:
        return Path(_git(["rev-parse", "--show-toplevel"], cwd))
    except ReviewError:
        raise ReviewError(f"--base needs a git repository; {cwd} is not inside one") from None


def resolve_ref(ref: str, root: Path) -> str:
    try:
        return str(_git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], root))
    except ReviewError:
        raise ReviewError(
            f"--base {ref}: unknown git revision (fix: fetch it, e.g. git fetch origin {ref})"
        ) from None


def export_tree(commit: str, root: Path, dest: Path) -> None:
    """Write the tree of `commit` under `dest` (git archive; the work tree and index are untouched)."""
    data = _git(["archive", "--format=tar", commit], root, binary=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        if _EXTRACTION_FILTERS:
            tar.extractall(dest, filter=_data_or_left_out)
        else:
            tar.extractall(dest, members=_inside(tar, dest))


# Python 3.11 before 3.11.4 (Debian bookworm's python3 is 3.11.2) has no extraction filters.
_EXTRACTION_FILTERS = hasattr(tarfile, "data_filter")


def _data_or_left_out(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """The "data" filter, leaving out what it refuses (a link out of the tree) instead of failing the
    whole review: the reader refuses such a link in the work tree the same way."""
    try:
        return tarfile.data_filter(member, path)
    except tarfile.FilterError:
        return None


def _inside(tar: tarfile.TarFile, dest: Path) -> Iterator[tarfile.TarInfo]:
    """What the "data" filter lets through, by hand: files and directories under `dest` with plain
    permissions, and links that stay under it. The base side of a review is a branch's content, so
    its names and link targets are not trusted; a link out of the tree is left out, as the reader
    refuses one in the work tree."""
    top = os.path.realpath(dest)

    def under(path: str) -> bool:
        return os.path.commonpath([top, os.path.realpath(path)]) == top

    for m in tar:
        target = os.path.join(top, m.name)
        if os.path.isabs(m.name) or not under(target):
            continue
        if m.issym() or m.islnk():
            link = m.linkname if m.islnk() else os.path.join(os.path.dirname(m.name), m.linkname)
            if os.path.isabs(m.linkname) or not under(os.path.join(top, link)):
                continue
        elif not (m.isfile() or m.isdir()):
            continue
        m.mode &= 0o755  # no setuid, setgid, sticky or group/other write
        m.uid = m.gid = 0
        m.uname = m.gname = ""
        yield m


@contextlib.contextmanager
def _chdir(path: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


# --------------------------------------------------------------------------- policy documents


@dataclass(frozen=True, slots=True)
class PolicyChange:
    kind: str
    name: str
    change: str  # added | removed | modified
    file: str | None

    def __str__(self) -> str:
        where = f" ({self.file})" if self.file else ""
        return f"{self.kind} {self.name} {self.change}{where}"


def policy_documents(path: Path | None) -> dict[tuple[str, str], tuple[str, str]]:
    """(kind, name) -> (canonical JSON, file) for every policy document under `path`."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    if path is None or not path.exists():
        return out
    # The same files the policy loader reads: not recursive (tests/ holds suites, not policies).
    files = (
        [path]
        if path.is_file()
        else sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
    )
    for f in files:
        rel = f.relative_to(path) if path.is_dir() else Path(f.name)
        try:
            docs = list(yamlload.load_all(f.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # the loader reports unreadable policies on its own
        for d in docs:
            if not isinstance(d, Mapping) or not str(d.get("apiVersion", "")).startswith(
                "policy.draguard.io/"
            ):
                continue
            meta = d.get("metadata") if isinstance(d.get("metadata"), Mapping) else {}
            assert isinstance(meta, Mapping)
            key = (str(d.get("kind")), str(meta.get("name")))
            out[key] = (json.dumps(d, sort_keys=True, default=str), str(rel))
    return out


def policy_changes(base: Path | None, head: Path | None, shown_dir: str) -> list[PolicyChange]:
    old, new = policy_documents(base), policy_documents(head)
    changes: list[PolicyChange] = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            change = "added"
        elif key not in new:
            change = "removed"
        elif old[key][0] != new[key][0]:
            change = "modified"
        else:
            continue
        file = (new.get(key) or old[key])[1]
        changes.append(PolicyChange(key[0], key[1], change, f"{shown_dir.rstrip('/')}/{file}"))
    return changes


# Which policy kinds can move which rule families.
_RULE_KINDS = {
    "tier": ("GpuTierPolicy",),
    "quota": ("GpuQuotaPolicy",),
    "cel": ("CelLintPolicy",),
    "migrate": ("MigrationPolicy",),
}


def attribute(rule: str, changes: Sequence[PolicyChange]) -> list[PolicyChange]:
    """The policy changes that can explain a changed verdict of `rule`."""
    family, _, name = rule.partition("/")
    out: list[PolicyChange] = []
    for c in changes:
        if c.kind == "PolicyException":
            out.append(c)  # an exception can silence any rule
        elif (
            family in _RULE_KINDS
            and c.kind in _RULE_KINDS[family]
            # tier/<name> and quota/<name> name their policy; cel/* and migrate/* do not.
            and (family in ("cel", "migrate") or c.name == name)
        ):
            out.append(c)
    return out


# --------------------------------------------------------------------------- comparison


@dataclass(frozen=True, slots=True)
class Change:
    change: str
    rule: str
    base: Finding | None
    head: Finding | None
    causes: tuple[str, ...]

    @property
    def finding(self) -> Finding:
        f = self.head or self.base
        assert f is not None
        return f

    def to_json(self) -> dict[str, Any]:
        f = self.finding
        return {
            "change": self.change,
            "file": f.file,
            "line": f.line,
            "object": f.object.to_json(),
            "rule": self.rule,
            "baseMode": self.base.mode.value if self.base else None,
            "mode": self.head.mode.value if self.head else None,
            "message": f.message,
            "fix": f.fix,
            "causes": list(self.causes),
        }


@dataclass(slots=True)
class Impact:
    base_ref: str
    base_commit: str
    changes: list[Change] = field(default_factory=list)
    policy_changes: list[PolicyChange] = field(default_factory=list)
    base: ReviewResult | None = None
    head: ReviewResult | None = None

    @property
    def newly_denied(self) -> list[Change]:
        return [c for c in self.changes if c.change == NEWLY_DENIED]

    def counts(self) -> dict[str, int]:
        return {k: sum(1 for c in self.changes if c.change == k) for k in CHANGE_ORDER}


Key = tuple[str, str, str, str, str]


def _key(f: Finding) -> Key:
    return (f.file or "", f.object.kind, f.object.namespace or "", f.object.name, f.rule)


def _strongest(findings: Sequence[Finding]) -> Finding:
    return max(findings, key=lambda f: (_RANK[f.mode], f.message))


def _group(report: Report) -> dict[Key, list[Finding]]:
    out: dict[Key, list[Finding]] = {}
    for f in report.findings:
        out.setdefault(_key(f), []).append(f)
    return out


def _rewrite_of(findings: Sequence[Finding]) -> str | None:
    """What the migration would do: its patch in `migrate` mode, else the rewrite its message
    proposes (observe/warn/enforce describe the same rewrite without patching)."""
    patches = [(f.patch, f.generated) for f in findings if f.patch]
    if patches:
        return json.dumps(patches, sort_keys=True, default=str)
    proposals = sorted(f.message.split("rewrite:", 1)[1] for f in findings if "rewrite:" in f.message)
    return json.dumps(proposals) if proposals else None


def _object_docs(reviewed: Reviewed) -> dict[tuple[str, str, str, str], str]:
    out: dict[tuple[str, str, str, str], str] = {}
    for o in reviewed.inputs.objects:
        meta = o.obj.get("metadata") if isinstance(o.obj.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        key = (o.file or "", str(o.obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))
        out[key] = json.dumps(o.obj, sort_keys=True, default=str)
    return out


def _related(key: tuple[str, str, str, str], changed: Sequence[tuple[str, str, str, str]]) -> str:
    """Name the changed objects that can move this object's verdict: same namespace, or cluster-scoped."""
    near = [c for c in changed if c[2] == key[2] or not c[2]]
    if not near:
        return "related objects changed (inventory classes, claims or templates it refers to)"
    names = [f"{c[1]}/{c[2] + '/' if c[2] else ''}{c[3]} ({c[0]})" for c in near[:3]]
    more = f" and {len(near) - 3} more" if len(near) > 3 else ""
    return "related objects changed: " + ", ".join(names) + more


def compare(base: Reviewed, head: Reviewed, policy_diff: Sequence[PolicyChange]) -> list[Change]:
    old, new = _group(base.result.report), _group(head.result.report)
    old_docs, new_docs = _object_docs(base), _object_docs(head)
    changed_docs = sorted(k for k in set(old_docs) | set(new_docs) if old_docs.get(k) != new_docs.get(k))
    changes: list[Change] = []
    for key in sorted(set(old) | set(new)):
        b = _strongest(old[key]) if key in old else None
        h = _strongest(new[key]) if key in new else None
        bm, hm = (b.mode if b else None), (h.mode if h else None)
        kind: str | None = None
        if _RANK[hm] == 3 and _RANK[bm] < 3:
            kind = NEWLY_DENIED
        elif _RANK[bm] == 3 and _RANK[hm] < 3:
            kind = NO_LONGER_DENIED
        elif hm is Mode.WARN and _RANK[bm] < 2:
            kind = NEW_WARNING
        elif bm is Mode.WARN and _RANK[hm] < 2:
            kind = WARNING_RESOLVED
        elif hm is Mode.AUDIT and bm is None:
            kind = NEW_AUDIT
        elif bm is Mode.AUDIT and hm is None:
            kind = AUDIT_RESOLVED
        elif _rewrite_of(old.get(key, [])) != _rewrite_of(new.get(key, [])):
            kind = REWRITE_CHANGED
        if kind is None:
            continue
        causes = [str(c) for c in attribute(key[4], policy_diff)]
        doc_key = key[:4]
        if doc_key not in old_docs:
            causes.append("object added")
        elif doc_key not in new_docs:
            causes.append("object removed")
        elif old_docs[doc_key] != new_docs[doc_key]:
            causes.append("object changed")
        if not causes:
            causes.append(_related(doc_key, changed_docs))
        changes.append(Change(kind, key[4], b, h, tuple(causes)))
    changes.sort(key=lambda c: (CHANGE_ORDER.index(c.change), *finding_sort_key(c.finding)))
    return changes


# --------------------------------------------------------------------------- running both sides


def _rel_to_root(path: str, root: Path, cwd: Path) -> Path | None:
    p = (cwd / path).resolve() if not Path(path).is_absolute() else Path(path).resolve()
    try:
        return p.relative_to(root)
    except ValueError:
        return None


def impact(
    paths: Sequence[str],
    *,
    base: str,
    policies: str | None,
    inventory: str | None,
    namespace: str = "default",
    progress: Progress | None = None,
    cluster_state: str | None = None,
    kubernetes_version: str | None = None,
    driver_schema: str | None = None,
    exclude: Sequence[str | Path] = (),
) -> Impact:
    """The findings `base` had and HEAD has on `paths`; `exclude` (paths in this checkout, as
    `.draguard.yaml` gives them) is skipped on both sides, at the same place in the base's tree."""
    from .inputs import InputError, read_paths
    from .pipeline import load_cluster_state

    labels = load_cluster_state(cluster_state)

    paths = list(paths) or ["."]
    if "-" in paths:
        raise ReviewError("--base cannot compare stdin (-); name files or directories")
    cwd = Path.cwd().resolve()
    root = repo_root(cwd).resolve()
    commit = resolve_ref(base, root)
    prefix = cwd.relative_to(root)
    for p in paths:
        if _rel_to_root(p, root, cwd) is None:
            raise ReviewError(f"{p}: outside the git repository {root}; --base compares tracked files only")

    inv = load_inventory_file(str(Path(inventory).resolve()) if inventory else None)
    head_policies = load_policy_set(policies, required=False)
    skipped = [Path(p).resolve() for p in exclude]
    exclude = [Path(p) for p in (policies, inventory) if p] + skipped
    try:
        head_inputs = read_paths(paths, exclude=exclude)
    except InputError as exc:
        raise ReviewError(str(exc)) from None
    head = Reviewed(
        evaluate_inputs(
            head_inputs, head_policies, inv, namespace=namespace, progress=progress, namespace_labels=labels,
            kubernetes_version=kubernetes_version, driver_schema=driver_schema,
        ),
        head_inputs,
    )

    with tempfile.TemporaryDirectory(prefix="draguard-base-") as tmp:
        tree = Path(tmp)
        if progress is not None:
            progress.say(f"reading {base} ({commit[:12]}) with git archive")
        export_tree(commit, root, tree)
        base_cwd = tree / prefix
        base_cwd.mkdir(parents=True, exist_ok=True)
        with _chdir(base_cwd):
            base_paths = [p for p in paths if Path(p).exists()]
            rel_policies = _rel_to_root(policies, root, cwd) if policies else None
            # Relative to the base tree's cwd, so findings on policies name the same files as now.
            base_policy_dir = (
                Path(os.path.relpath(tree / rel_policies, base_cwd)) if rel_policies is not None else None
            )
            base_policies = load_policy_set(base_policy_dir, required=False)
            # The same paths in the base's tree (a path outside the repository has no place there).
            in_base = [tree / p.relative_to(root) for p in skipped if p.is_relative_to(root)]
            base_exclude = [Path(p) for p in (policies, inventory) if p] + in_base
            try:
                base_inputs = read_paths(base_paths, exclude=base_exclude) if base_paths else None
            except InputError as exc:
                raise ReviewError(f"at {base}: {exc}") from None
            from .inputs import Inputs

            base_inputs = base_inputs or Inputs()
            base_rev = Reviewed(
                evaluate_inputs(
                    base_inputs, base_policies, inv, namespace=namespace, namespace_labels=labels,
                    kubernetes_version=kubernetes_version, driver_schema=driver_schema,
                ),
                base_inputs,
            )
            head_policy_dir = (cwd / policies) if policies else None
            pchanges = policy_changes(base_policy_dir, head_policy_dir, policies or "")
    result = Impact(
        base_ref=base, base_commit=commit, policy_changes=pchanges, base=base_rev.result, head=head.result
    )
    result.changes = compare(base_rev, head, pchanges)
    return result


# --------------------------------------------------------------------------- output


def _line(c: Change) -> str:
    f = c.finding
    where = f"{f.file}:{f.line}" if f.file and f.line else (f.file or "<input>")
    modes = f"{c.base.mode.value if c.base else '-'} -> {c.head.mode.value if c.head else '-'}"
    return f"  {where}  {c.rule}  {f.object}  [{modes}]"


def render_text(imp: Impact, *, color: bool = False) -> str:
    bold, red, green, reset = ("\033[1m", "\033[31m", "\033[32m", "\033[0m") if color else ("", "", "", "")
    out = [f"{bold}Impact of changes since {imp.base_ref} ({imp.base_commit[:12]}){reset}"]
    if imp.policy_changes:
        out.append("Policy changes:")
        out += [f"  {c}" for c in imp.policy_changes]
    else:
        out.append("Policy changes: none")
    for kind in CHANGE_ORDER:
        group = [c for c in imp.changes if c.change == kind]
        if not group:
            continue
        paint = (
            red
            if kind in (NEWLY_DENIED, NEW_WARNING)
            else green
            if kind.endswith(("denied", "resolved"))
            else ""
        )
        out.append("")
        out.append(f"{paint}{CHANGE_TITLE[kind]} ({len(group)}){reset if paint else ''}")
        for c in group:
            out.append(_line(c))
            out.append(f"      {c.finding.message}")
            if c.head and c.head.fix:
                out.append(f"      fix: {c.head.fix}")
            out.append(f"      because: {'; '.join(c.causes)}")
    out.append("")
    counts = imp.counts()
    if imp.changes:
        parts = [f"{n} {CHANGE_TITLE[k].lower()}" for k, n in counts.items() if n]
        out.append("Changed verdicts: " + ", ".join(parts))
    else:
        out.append("No verdict changed.")
    return "\n".join(out) + "\n"


def render_json(imp: Impact) -> str:
    doc = {
        "base": {"ref": imp.base_ref, "commit": imp.base_commit},
        "policyChanges": [
            {"kind": c.kind, "name": c.name, "change": c.change, "file": c.file} for c in imp.policy_changes
        ],
        "changes": [c.to_json() for c in imp.changes],
        "summary": imp.counts(),
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def render_markdown(imp: Impact) -> str:
    from .formats.markdown import cell, code

    out = [f"### draguard impact since {code(imp.base_ref)}", ""]
    if imp.policy_changes:
        out.append("**Policy changes:** " + ", ".join(code(str(c)) for c in imp.policy_changes))
    else:
        out.append("**Policy changes:** none")
    if not imp.changes:
        out += ["", "✅ No verdict changed."]
        return "\n".join(out) + "\n"
    for kind in CHANGE_ORDER:
        group = [c for c in imp.changes if c.change == kind]
        if not group:
            continue
        out += [
            "",
            f"#### {CHANGE_TITLE[kind]} ({len(group)})",
            "",
            "| Location | Rule | Object | Mode | Message | Because |",
            "|---|---|---|---|---|---|",
        ]
        for c in group[:200]:
            f = c.finding
            where = code(f"{f.file or ''}:{f.line}") if f.line else code(f.file or "")
            modes = f"{c.base.mode.value if c.base else '–'} → {c.head.mode.value if c.head else '–'}"
            out.append(
                f"| {where} | {code(c.rule)} | {cell(str(f.object))} | {modes} | {cell(f.message)} "
                f"| {cell('; '.join(c.causes))} |"
            )
    return "\n".join(out) + "\n"


def render(imp: Impact, fmt: str, *, color: bool = False, root: str | None = None) -> str:
    """Text, JSON and Markdown describe the changes; SARIF, JUnit and GitHub annotate the findings
    this change introduces (newly denied, new warnings, changed rewrites) so CI flags only those."""
    if fmt == "text":
        return render_text(imp, color=color)
    if fmt == "json":
        return render_json(imp)
    if fmt == "markdown":
        return render_markdown(imp)
    from .formats import renderers

    head = imp.head or ReviewResult(Report())
    introduced = [
        c.head
        for c in imp.changes
        if c.head is not None and c.change in (NEWLY_DENIED, NEW_WARNING, NEW_AUDIT, REWRITE_CHANGED)
    ]
    report = Report(findings=introduced, objects=head.report.objects, ignored=head.report.ignored)
    sub = ReviewResult(
        report,
        files=head.files,
        objects=head.objects,
        ignored=head.ignored,
        title=f"draguard review (changes since {imp.base_ref})",
        root=root,
        elapsed=head.elapsed,
        rules_url=head.rules_url,
    )
    return renderers()[fmt](sub)
