"""SARIF 2.1.0 for code-scanning upload: one rule per rule id, one result per finding."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ... import __version__
from ...core.findings import Mode
from ..rules import documented, lookup
from . import ReviewResult, rule_help

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Mode.ENFORCE: "error", Mode.WARN: "warning", Mode.AUDIT: "note"}


def _artifact(result: ReviewResult, file: str) -> dict[str, Any] | None:
    """An artifactLocation: relative to the repository root (%SRCROOT%) when the file is inside it,
    else an absolute `file:` URI (SARIF1004 forbids absolute paths with a uriBaseId)."""
    if file.startswith("<"):
        return None
    rel = result.repo_path(file)
    if rel is not None:
        # surrogateescape: a file name that is not UTF-8 gets its own bytes percent-encoded.
        return {"uri": quote(rel, errors="surrogateescape"), "uriBaseId": "%SRCROOT%"}
    return {"uri": Path(os.path.abspath(file)).as_uri()}


def _rule(rule: str, level: str, base_url: str) -> dict[str, Any]:
    """A reportingDescriptor: prose from the rule reference (docs/rules.md), linked to its anchor."""
    doc = lookup(rule)
    if doc is None:  # an id the reference does not know (should not happen): the short help only
        help_text = rule_help(rule)
        return {
            "id": rule,
            "name": _name(rule),
            "shortDescription": {"text": help_text.split(". ")[0][:200]},
            "fullDescription": {"text": help_text},
            "help": {"text": help_text, "markdown": f"**{rule}**: {help_text}"},
            "defaultConfiguration": {"level": level},
        }
    mode = f"Default mode: {doc.mode.value}" + (f" ({doc.mode_from})" if doc.mode_from else "") + "."
    link = f"{base_url}#{doc.anchor}"
    return {
        "id": rule,
        "name": _name(rule),
        "shortDescription": {"text": doc.summary.split(". ")[0].rstrip(".")[:200] + "."},
        "fullDescription": {"text": f"{doc.summary} {mode}"},
        "help": {
            "text": f"{doc.summary}\nFix: {doc.fix}\n{link}",
            "markdown": f"**{rule}**: {doc.summary}\n\n**Fix:** {doc.fix}\n\n[Rule reference]({link})",
        },
        "helpUri": link,
        "defaultConfiguration": {"level": level},
    }


def _name(rule: str) -> str:
    return rule.replace("/", "_").replace("-", "_").replace("<", "").replace(">", "")


def render(result: ReviewResult) -> str:
    findings = result.sorted_findings()
    # Every rule of the reference (so a code-scanning UI can show any rule's help), plus each id a
    # family produced (`tier/llm-h100`): one descriptor per id a result may name.
    known = [d.id for d in documented() if not d.family]
    rule_ids = sorted({*known, *(f.rule for f in findings)})
    index = {rule: i for i, rule in enumerate(rule_ids)}
    # The most severe mode a rule fired with is its level here; a rule that did not fire gets its
    # documented default.
    worst: dict[str, Mode] = {}
    for f in findings:
        if (
            f.rule not in worst
            or _LEVEL[f.mode] == "error"
            or (_LEVEL[worst[f.rule]] == "note" and f.mode is Mode.WARN)
        ):
            worst[f.rule] = f.mode
    rules: list[dict[str, Any]] = []
    for rule in rule_ids:
        ref = lookup(rule)
        mode = worst.get(rule) or (ref.mode if ref is not None else Mode.WARN)
        rules.append(_rule(rule, _LEVEL[mode], result.rules_url))
    results: list[dict[str, Any]] = []
    for f in findings:
        text = f.message + (f" Fix: {f.fix}" if f.fix else "")
        res: dict[str, Any] = {
            "ruleId": f.rule,
            "ruleIndex": index[f.rule],
            "level": _LEVEL[f.mode],
            "message": {"text": f"{f.object}: {text}"},
            "properties": {"mode": f.mode.value, "severity": f.severity.value, "object": f.object.to_json()},
        }
        if f.excepted_by is not None:
            # Excepted on purpose, with a reason on record: code scanning shows it as dismissed,
            # not as an open alert.
            res["suppressions"] = [
                {
                    "kind": "external",
                    "justification": f.exception_reason
                    or f"excepted by PolicyException {f.excepted_by} (it gives no reason)",
                    "properties": {"policyException": f.excepted_by},
                }
            ]
        artifact = _artifact(result, f.file) if f.file else None
        if artifact is not None:
            location: dict[str, Any] = {"artifactLocation": artifact}
            if f.line:
                location["region"] = {"startLine": f.line}
            res["locations"] = [{"physicalLocation": location}]
        results.append(res)
    s = result.report.summary()
    doc = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "draguard",
                        "version": __version__,
                        "informationUri": "https://github.com/draguard/draguard",
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"description": {"text": "the repository root"}}},
                "artifacts": [
                    {"location": a} for a in (_artifact(result, p) for p in sorted(set(result.files))) if a
                ],
                "results": results,
                "properties": {**s, "ignored": result.ignored},
            }
        ],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
