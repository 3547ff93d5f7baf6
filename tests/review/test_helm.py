"""Helm charts in review: rendered with `helm template` (Helm's own library, tools/helm) and reviewed
like any manifest, findings on the template file; without helm, a clear message and exit 2."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.gotool import go_tool
from tests.review.conftest import Run

CHART = Path(__file__).parent / "fixtures" / "charts" / "gpu-app"
POLICIES = str(Path(__file__).resolve().parents[2] / "policies")


def test_chart_without_helm_says_what_to_do(
    draguard: Callable[..., Run], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DRAGUARD_HELM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no helm anywhere
    run = draguard("review", str(CHART), "--policies", POLICIES)
    assert run.code == 2
    assert "is a Helm chart (Chart.yaml); install helm to review it" in run.err
    assert "helm template gpu-app" in run.err and "| draguard review -" in run.err
    assert "Traceback" not in run.err


def test_chart_is_rendered_and_reviewed(
    draguard: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAGUARD_HELM", str(go_tool("helm")))
    run = draguard("review", str(CHART), "--policies", POLICIES, "-f", "json")
    assert run.code == 1, run.err
    findings = json.loads(run.out)["findings"]
    quota = [f for f in findings if f["rule"] == "quota/team-budgets"]
    # Rendered with the chart's values (9 A100s), reported on the template it came from.
    assert quota and quota[0]["file"].endswith("charts/gpu-app/templates/claim.yaml")
    assert quota[0]["object"]["name"] == "gpu-app-train"
    assert "9 devices of class gpu.nvidia.com-a100" in quota[0]["message"]
    # A chart inside a reviewed directory is rendered too, not parsed as YAML templates.
    walked = draguard("review", str(CHART.parent), "--policies", POLICIES, "-f", "json")
    assert walked.code == 1, walked.err


def test_broken_chart_reports_helms_error(
    draguard: Callable[..., Run], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DRAGUARD_HELM", str(go_tool("helm")))
    chart = tmp_path / "broken"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "claim.yaml").write_text("{{ .Values.gpus | nosuchfunction }}\n")
    run = draguard("review", str(chart), "--policies", POLICIES)
    assert run.code == 2
    assert "helm template failed" in run.err and "nosuchfunction" in run.err
