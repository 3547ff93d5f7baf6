"""The one result type of the engine: findings, and the report that gathers them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .frozen import one_call_init

JsonPatch = list[dict[str, Any]]


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Mode(StrEnum):
    """What admission does with a finding: deny, warn the user, or record only."""

    ENFORCE = "enforce"
    WARN = "warn"
    AUDIT = "audit"


@one_call_init
@dataclass(frozen=True, slots=True)
class ObjectRef:
    api_version: str
    kind: str
    namespace: str | None
    name: str

    def __str__(self) -> str:
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind}/{ns}{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
        }


@one_call_init
@dataclass(frozen=True, slots=True)
class Finding:
    """One rule's verdict on one object.

    `rule` ids are stable (`tier/<policy>`, `cel/no-match`, `migrate/legacy-gpu`, ...): CLIs,
    dashboards and test suites key on them.
    """

    rule: str
    severity: Severity
    mode: Mode
    object: ObjectRef
    message: str
    fix: str = ""
    file: str | None = None
    line: int | None = None
    # RFC 6902 operations against the object as the user sent it (mutating rules only).
    patch: JsonPatch | None = None
    # Extra objects the fix needs (e.g. a ResourceClaimTemplate for a migrated pod).
    generated: tuple[dict[str, Any], ...] = ()
    # The PolicyException that turned this finding into an audit record, and its reason (SARIF
    # reports such findings as suppressed rather than open).
    excepted_by: str | None = None
    exception_reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "object": self.object.to_json(),
            "rule": self.rule,
            "severity": self.severity.value,
            "mode": self.mode.value,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass(slots=True)
class Report:
    """Everything the engine found over an input set."""

    findings: list[Finding] = field(default_factory=list)
    objects: int = 0
    # Objects of kinds no rule looks at (counted, never an error).
    ignored: int = 0

    @property
    def denied(self) -> list[Finding]:
        return [f for f in self.findings if f.mode is Mode.ENFORCE]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.mode is Mode.WARN]

    @property
    def audits(self) -> list[Finding]:
        return [f for f in self.findings if f.mode is Mode.AUDIT]

    def summary(self) -> dict[str, int]:
        return {
            "objects": self.objects,
            "errors": len(self.denied),
            "warnings": len(self.warnings),
            "audits": len(self.audits),
        }
