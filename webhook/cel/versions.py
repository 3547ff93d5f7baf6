"""Which CEL functions and `device` fields a DRA selector may use on a given Kubernetes release.

The API server compiles a new selector in the CEL environment of its *compatibility version*, one
minor release below its own by default (`environment.DefaultCompatibilityVersion()`), so a library
Kubernetes introduces at version N is accepted on create from API server N+1 on. Some `device`
fields also depend on a feature gate. Taken from Kubernetes v1.37.2's sources:
`k8s.io/apiserver/pkg/cel/environment/base.go` (library versions),
`k8s.io/dynamic-resource-allocation/cel/compile.go` (the DRA environment) and
`pkg/features/kube_features.go` (gate defaults).

Pure data and a walk of the checked AST.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.findings import Severity
from ..dra.releases import DEFAULT, SUPPORTED, newer_than_known, parse_version, release_key
from .ast import CALL, IDENT, SELECT, CheckedAst, Expr
from .issues import CelIssue

__all__ = ["CHECK", "DEFAULT", "SUPPORTED", "newer_than_known", "parse_version", "version_issues"]

CHECK = "cel/version"


@dataclass(frozen=True, slots=True)
class Since:
    """From which API server release (default feature gates) a name is accepted, and why."""

    release: str
    what: str


_LISTS_EXT = "cel-go's lists extension, in the Kubernetes CEL environment from compatibility version 1.34"
_LISTS_V1 = ("Kubernetes' lists library version 1, from compatibility version 1.37 (on 1.37 only with the "
             "DRAListTypeAttributes feature gate, alpha and off by default)")

FUNCTIONS: dict[str, Since] = {
    name: Since("1.35", _LISTS_EXT)
    for name in ("slice", "flatten", "sort", "@sortByAssociatedKeys", "lists.range", "reverse", "distinct")
}
FUNCTIONS["includes"] = Since("1.38", _LISTS_V1)

DEVICE_FIELDS: dict[str, Since] = {
    "allowMultipleAllocations": Since(
        "1.36", "the DRAConsumableCapacity feature gate (alpha and off by default in 1.34 and 1.35, "
        "beta and on from 1.36)"),
}

_SHOWN = {"@sortByAssociatedKeys": "sortBy"}


def _is_device(node: Expr | None) -> bool:
    return node is not None and node.kind == IDENT and node.name == "device"


def version_issues(ast: CheckedAst, release: str) -> list[CelIssue]:
    """What an API server of `release` (default feature gates) rejects in this selector: one
    `cel/version` error per function or field it does not know yet, at its first use."""
    wanted = release_key(release)
    seen: set[str] = set()
    out: list[CelIssue] = []
    for node in sorted(ast.nodes(), key=lambda n: ast.positions.get(n.id, 0)):
        since: Since | None = None
        name = ""
        if node.kind == CALL and node.function in FUNCTIONS:
            name, since = _SHOWN.get(node.function, node.function), FUNCTIONS[node.function]
            label = f"function {name}()"
        elif node.kind == SELECT and _is_device(node.operand) and node.field in DEVICE_FIELDS:
            name, since = node.field, DEVICE_FIELDS[node.field]
            label = f"field device.{name}"
        if since is None or release_key(since.release) <= wanted or name in seen:
            continue
        seen.add(name)
        line, column = ast.location(node.id)
        out.append(CelIssue(
            CHECK, Severity.ERROR,
            f"Kubernetes {release} rejects this selector on create: {label} is accepted from "
            f"{since.release} ({since.what})",
            f"keep to what {release} accepts, or review with --kubernetes-version set to the cluster's "
            "release",
            line, column,
        ))
    return out
