"""Output formats of `draguard review`: one function per format, `render(result) -> str`."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from ...core.findings import Finding, Mode, ObjectRef, Report

RULES_URL = "https://github.com/draguard/draguard/blob/main/docs/rules.md"
"""Where docs/rules.md is published: the default base of SARIF help links (`review --rules-url`)."""


@dataclass(frozen=True, slots=True)
class ReviewedObject:
    """One object the review read, and where (JUnit needs the objects without findings too)."""

    ref: ObjectRef
    file: str | None
    line: int | None


@dataclass(slots=True)
class ReviewResult:
    """What every format renders: the engine's report plus what the reader saw."""

    report: Report
    files: list[str] = field(default_factory=list)
    objects: list[ReviewedObject] = field(default_factory=list)
    # Documents that are not Kubernetes objects, plus objects of kinds no rule looks at.
    ignored: int = 0
    # Set by `--base`: a one-line note on what the report was compared with.
    title: str = "draguard review"
    # The repository root (absolute): SARIF, annotations and JUnit name files relative to it, as
    # code scanning and test reporters resolve them. None: paths as the reader gave them.
    root: str | None = None
    # Seconds the review took (JUnit `time`).
    elapsed: float = 0.0
    # The Kubernetes release selectors were judged for (`--kubernetes-version`); None: not said.
    kubernetes_version: str | None = None
    # Where docs/rules.md is published: SARIF help links are this plus `#<rule anchor>`.
    rules_url: str = RULES_URL

    def sorted_findings(self) -> list[Finding]:
        return sorted(self.report.findings, key=finding_sort_key)

    def repo_path(self, file: str) -> str | None:
        """`file` relative to the repository root with forward slashes; None when it lies outside
        the root (or is not a file, like `<stdin>`)."""
        return repo_path(file, self.root)


def repo_path(file: str, root: str | None) -> str | None:
    if not file or file.startswith("<"):
        return None
    if root is None:
        return None if os.path.isabs(file) else PurePosixPath(file.replace("\\", "/")).as_posix()
    full = os.path.normpath(os.path.join(os.getcwd(), file))
    if not (full == root or full.startswith(root.rstrip(os.sep) + os.sep)):
        return None
    return PurePosixPath(os.path.relpath(full, root).replace(os.sep, "/")).as_posix()


def finding_sort_key(f: Finding) -> tuple[str, int, str, str, str]:
    return (f.file or "", f.line or 0, f.rule, str(f.object), f.message)


MODE_ORDER = {Mode.ENFORCE: 0, Mode.WARN: 1, Mode.AUDIT: 2}

# Help text per rule id (or id prefix before "/"): SARIF `help`, Markdown and JUnit use it.
RULE_HELP: dict[str, str] = {
    "tier": "GpuTierPolicy: the DeviceClasses, device counts and selectors a namespace or team may request.",
    "quota": "GpuQuotaPolicy: the devices (or GPU-equivalents) a namespace or team may hold across claims.",
    "cel/syntax": "A CEL selector does not parse; the API server would reject the object.",
    "cel/type": "A CEL selector does not type-check (e.g. a quantity compared with a string).",
    "cel/unknown-attribute": "A selector reads an attribute the driver never publishes: it never matches.",
    "cel/no-match": "A CEL selector matches no device of the inventory: the claim would stay pending.",
    "cel/limits": "A CEL selector exceeds the API server's cost or length limits.",
    "cel/driver-guard": "A selector reads a driver's attributes without checking `device.driver` first.",
    "cel/unsupported": "A selector uses CEL the API server accepts but draguard's runtime cannot check.",
    "cel/version": "A selector uses a CEL function or device field the target Kubernetes release does not "
    "accept yet.",
    "migrate/legacy-gpu": "A workload still requests `nvidia.com/gpu` as an extended resource; "
    "`draguard migrate` rewrites it to a DRA claim.",
    "structure/invalid": "The API server rejects this claim or template (wrong shape for its apiVersion, "
    "missing deviceClassName, bad count, duplicate names); the message names the field.",
    "structure/inline-source": "The pod uses the inline `resourceClaims[].source` field, removed in 1.31.",
    "structure/undeclared-claim": "A container names a claim missing from the pod's `spec.resourceClaims`.",
    "structure/deprecated-version": "The object uses a `resource.k8s.io` version the cluster does not serve.",
    "structure/dropped-field": "A DRA field the target Kubernetes release drops on create (its feature gate "
    "is off by default).",
    "structure/unsatisfiable": "No node of the inventory can satisfy the request (class, count, selectors).",
    "structure/interconnect": "A multi-GPU request has no constraint keeping the GPUs on one NVLink domain.",
    "structure/admin-access": "adminAccess needs the namespace label "
    '`resource.kubernetes.io/admin-access: "true"`.',
    "config/opaque": "Opaque driver configuration does not validate against the driver's schema.",
    "internal": "A rule failed on this object; the message names the rule. Please report it.",
}


def rule_help(rule: str) -> str:
    if rule in RULE_HELP:
        return RULE_HELP[rule]
    prefix = rule.split("/", 1)[0]
    return RULE_HELP.get(prefix, "draguard policy check.")


# Every string below comes from the reviewed tree (file and object names, messages quoting them),
# which may be an untrusted branch: each format escapes it for where it lands.

# C0 and C1 controls, DEL, Unicode line/paragraph separators and lone surrogates (undecodable
# file-name bytes): a terminal or a CI log would act on them, or they split lines unseen.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_CONTROL_NO_NL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, *, newlines: bool = False) -> str:
    """`text` with control characters written out (`\\x1b`), so none reaches a terminal or
    log as a control; with `newlines`, line feeds are kept (and tabs, which are harmless)."""
    return (_CONTROL if newlines else _CONTROL_NO_NL).sub(_visible, text)


def neutralise_commands(text: str) -> str:
    """No line of `text` can be read as a CI workflow command: a line starting with `::` (GitHub
    Actions, after leading blanks) gets a backslash in front, and `##[` (the older syntax, matched
    anywhere in a line) becomes `##\\[`."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if "##[" in line:
            line = line.replace("##[", "##\\[")
        stripped = line.lstrip()
        if stripped.startswith("::"):
            line = line[: len(line) - len(stripped)] + "\\" + stripped
        lines[i] = line
    return "\n".join(lines)


Renderer = Callable[[ReviewResult], str]


def renderers() -> dict[str, Renderer]:
    from . import github, gitlab, json, junit, markdown, sarif, text

    return {
        "text": text.render,
        "json": json.render,
        "markdown": markdown.render,
        "sarif": sarif.render,
        "junit": junit.render,
        "github": github.render,
        "gitlab": gitlab.render,
    }


FORMATS = ("text", "json", "markdown", "sarif", "junit", "github", "gitlab")
