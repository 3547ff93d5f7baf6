"""Machine-readable JSON: `{"findings": [...], "summary": {...}, "kubernetesVersion": "1.37"}`."""

from __future__ import annotations

import json

from . import ReviewResult


def render(result: ReviewResult) -> str:
    doc = {
        "findings": [f.to_json() for f in result.sorted_findings()],
        "summary": result.report.summary(),
    }
    if result.kubernetes_version:
        doc["kubernetesVersion"] = result.kubernetes_version
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
