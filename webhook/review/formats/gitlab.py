"""GitLab Code Quality report (`artifacts:reports:codequality`): a JSON array of issues."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ...core.findings import Finding, Mode, Severity
from . import ReviewResult

# Code Quality's scale is info < minor < major < critical < blocker. A denied object blocks the
# merge, a warning is worth fixing, an audit record (excepted findings included) is information.
_SEVERITY = {
    (Mode.ENFORCE, Severity.ERROR): "blocker",
    (Mode.ENFORCE, Severity.WARNING): "critical",
    (Mode.ENFORCE, Severity.INFO): "critical",
    (Mode.WARN, Severity.ERROR): "major",
    (Mode.WARN, Severity.WARNING): "minor",
    (Mode.WARN, Severity.INFO): "minor",
}


def severity(f: Finding) -> str:
    if f.mode is Mode.AUDIT:
        return "info"
    return _SEVERITY[(f.mode, f.severity)]


def fingerprint(f: Finding, path: str) -> str:
    """Stable across runs and line moves (GitLab matches issues between branches by it): the rule,
    file, object and message, each length-prefixed so no two different tuples hash alike."""
    parts = (f.rule, path, str(f.object), f.message)
    # surrogatepass: an undecodable file-name byte or a lone surrogate from a JSON escape still
    # hashes, to the same bytes every run.
    data = "".join(f"{len(p)}:{p}" for p in parts).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


def render(result: ReviewResult) -> str:
    issues: list[dict[str, Any]] = []
    for f in result.sorted_findings():
        # GitLab resolves paths from the repository root; a finding outside it (or on stdin) still
        # gets an entry, under the name it was read as, so nothing is dropped silently.
        path = (result.repo_path(f.file) if f.file else None) or f.file or "<input>"
        text = f"{f.object}: {f.message}" + (f" Fix: {f.fix}" if f.fix else "")
        issues.append(
            {
                "type": "issue",
                "description": text,
                "check_name": f.rule,
                "fingerprint": fingerprint(f, path),
                "severity": severity(f),
                "location": {"path": path, "lines": {"begin": f.line or 1}},
            }
        )
    return json.dumps(issues, indent=2, ensure_ascii=False) + "\n"
