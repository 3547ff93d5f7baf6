"""The four renderings of one assessment, and that cluster-supplied text cannot inject markup."""

from __future__ import annotations

import copy
import json
import re
from html.parser import HTMLParser
from typing import Any

from tests.assess.test_checklist import GOOD
from webhook.assess.checklist import checklist
from webhook.assess.formats import (
    RENDERERS,
    bar_chart,
    render_html,
    render_json,
    render_markdown,
    render_text,
)
from webhook.policy.model import PolicySet

EVIL = "<script>alert(1)</script>|`x`"


def _assessment(policies: PolicySet) -> dict[str, Any]:
    a = copy.deepcopy(GOOD)
    a["legacyWorkloads"] = [
        {
            "owner": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "ml", "name": EVIL},
            "chain": [],
            "pods": 2,
            "running": 2,
            "legacyGpus": {"nvidia.com/gpu": 4},
            "claims": 0,
            "deny": [],
            "migration": {
                "status": "admitted after migration",
                "templates": [
                    {
                        "name": "draguard-gpu-nvidia-com-a100-2",
                        "deviceClass": "gpu.nvidia.com-a100",
                        "count": 2,
                    }
                ],
                "quota": {
                    "replicas": 2,
                    "devices": {"gpu.nvidia.com-a100": 4},
                    "gpuEquivalents": 4.0,
                    "admitted": True,
                    "findings": [],
                },
                "tier": {"admitted": True, "findings": []},
            },
        }
    ]
    a["legacyWorkloadCount"] = 1
    a["gpuUse"] = {"legacy": 4, "dra": 2}
    a["pluginGpusByModel"] = {"NVIDIA-A100": 4}
    a["nodeCount"] = 3
    a["checklist"] = checklist(a, policies, {})
    return a


def test_text_and_markdown_carry_the_same_facts(policies: PolicySet) -> None:
    a = _assessment(policies)
    for text in (render_text(a), render_markdown(a)):
        assert "draguard-gpu-nvidia-com-a100-2" in text
        assert "4 via the device plugin, 2 via DRA" in text
        assert "gpu.nvidia.com-h100" in text
        assert "Allocation latency" in text
    assert "[FAIL] No workload left on the device plugin" in render_text(a)
    md = render_markdown(a)
    assert (
        "- [ ] **No workload left on the device plugin \\(nvidia.com/gpu\\)** (fail)" not in md
    )  # parens unescaped
    assert "- [ ] **No workload left on the device plugin (nvidia.com/gpu)** (fail)" in md
    # A pipe in a name cannot break the table.
    row = next(line for line in md.splitlines() if "alert(1)" in line)
    assert row.count(" | ") == 3 and "\\|" in row and "<script>" not in row


def test_json_is_the_assessment(policies: PolicySet) -> None:
    a = _assessment(policies)
    doc = json.loads(render_json(a))
    assert doc["kind"] == "Assessment" and doc["legacyWorkloads"][0]["owner"]["name"] == EVIL
    assert [i["id"] for i in doc["checklist"]] == [i["id"] for i in a["checklist"]]


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs.extend(attrs)


def test_html_is_self_contained_with_charts_and_escapes_names(policies: PolicySet) -> None:
    page = render_html(_assessment(policies))
    p = _Tags()
    p.feed(page)
    assert "script" not in p.tags and p.tags.count("svg") == 3
    assert not [v for k, v in p.attrs if k in ("src", "href")]  # nothing fetched
    assert "default-src 'none'" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # Bars: DRA devices by model (8 H100), device-plugin GPUs by model, legacy vs DRA in use.
    assert re.search(r"<title>NVIDIA H100 80GB HBM3: 8</title>", page)
    assert re.search(r"<title>device plugin \(nvidia.com/gpu\): 4</title>", page)
    assert re.search(r"<title>DRA \(allocated devices\): 2</title>", page)


def test_bar_lengths_follow_the_values() -> None:
    svg = bar_chart("t", {"a": 10, "b": 5})
    widths = [int(w) for w in re.findall(r'<rect x="\d+" y="\d+" width="(\d+)"', svg)]
    assert widths[0] == 2 * widths[1]
    assert "none" in bar_chart("t", {})


def test_every_format_renders_an_empty_cluster(policies: PolicySet) -> None:
    a: dict[str, Any] = {
        "server": {},
        "dra": {"served": []},
        "unreadable": {"pods": "HTTP 403"},
        "extras": {},
    }
    a["checklist"] = checklist(a, policies, {})
    for name, render in RENDERERS.items():
        assert render(a), name
    assert "note: pods not read: HTTP 403" in render_text(a)


def test_text_carries_no_terminal_control_sequences(policies: PolicySet) -> None:
    a = _assessment(policies)
    a["wouldDeny"] = [
        {
            "owner": {"kind": "Pod", "namespace": "ml", "name": "p"},
            "pods": 1,
            "deny": [{"rule": "tier/x", "message": "image \x1b]0;pwned\x07\x1b[2J evil", "fix": ""}],
        }
    ]
    for text in (render_text(a), render_markdown(a)):
        assert "\x1b" not in text and "\x07" not in text
        assert "evil" in text
