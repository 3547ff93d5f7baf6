"""SARIF 2.1.0 for code-scanning upload: one rule per rule id, one result per finding."""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from webhook import __version__
from webhook.core.findings import Mode
from webhook.review.formats import ReviewResult, rule_help

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Mode.ENFORCE: "error", Mode.WARN: "warning", Mode.AUDIT: "note"}


def _uri(file: str) -> str:
    # SARIF URIs use forward slashes; relative ones resolve against the checkout (%SRCROOT%).
    return PurePosixPath(file.replace("\\", "/")).as_posix()


def render(result: ReviewResult) -> str:
    findings = result.sorted_findings()
    rule_ids = sorted({f.rule for f in findings})
    index = {rule: i for i, rule in enumerate(rule_ids)}
    # The most severe mode a rule fired with is its default level.
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
        help_text = rule_help(rule)
        rules.append(
            {
                "id": rule,
                "name": rule.replace("/", "_").replace("-", "_"),
                "shortDescription": {"text": help_text.split(": ", 1)[-1].split(". ")[0][:200]},
                "fullDescription": {"text": help_text},
                "help": {"text": help_text, "markdown": f"**{rule}**: {help_text}"},
                "defaultConfiguration": {"level": _LEVEL[worst[rule]]},
            }
        )
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
        if f.file and not f.file.startswith("<"):
            location: dict[str, Any] = {"artifactLocation": {"uri": _uri(f.file), "uriBaseId": "%SRCROOT%"}}
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
                    {"location": {"uri": _uri(p), "uriBaseId": "%SRCROOT%"}}
                    for p in sorted(set(result.files))
                    if not p.startswith("<")
                ],
                "results": results,
                "properties": {**s, "ignored": result.ignored},
            }
        ],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
