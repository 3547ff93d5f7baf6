"""The linter's result type, shared by the compiler and the linter."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.findings import Severity

CHECKS = (
    "cel/syntax",
    "cel/type",
    "cel/unknown-attribute",
    "cel/no-match",
    "cel/limits",
    "cel/driver-guard",
    "cel/unsupported",
    "cel/version",
)


@dataclass(frozen=True, slots=True)
class CelIssue:
    """One problem with a selector expression.

    `line`/`column` are 1-based positions inside the expression text (None when the problem is
    about the whole expression).
    """

    check: str
    severity: Severity
    message: str
    fix: str = ""
    line: int | None = None
    column: int | None = None
