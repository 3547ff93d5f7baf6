"""The README's main command over examples/: the article's manifests and a small GitOps repo."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.review.conftest import Run

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not (shutil.which("kustomize") or shutil.which("kubectl")), reason="examples/ holds a kustomization"
)


@pytest.fixture
def at_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(ROOT)
    return ROOT


def test_readme_command_reviews_the_examples(draguard: Callable[..., Run], at_root: Path) -> None:
    run = draguard("review", "examples/", "--inventory", "examples/inventory.yaml", "-f", "json")
    assert run.code == 1, run.err
    doc = json.loads(run.out)
    denied = sorted((f["rule"], f["object"]["name"]) for f in doc["findings"] if f["mode"] == "enforce")
    assert denied == [
        ("structure/inline-source", "quick-gpu-job"),
        ("structure/interconnect", "training-gpu-claim"),
        ("tier/gpu-tiers", "llm-inference-service"),
    ]
    files = {f["file"] for f in doc["findings"]}
    # Only the article's manifests have findings; the research overlay and the notebooks pass.
    assert all(f.startswith("examples/teams/ml-workloads/") for f in files)
    assert not any("inventory.yaml" in f for f in files)


def test_examples_inventory_has_three_simulated_nodes(draguard: Callable[..., Run], at_root: Path) -> None:
    run = draguard("lint-cel", "device.driver == 'gpu.nvidia.com'", "--inventory", "examples/inventory.yaml")
    assert run.code == 0, run.err
    for node in ("gpu-h100-0", "gpu-a100-0", "gpu-a100-mig-0"):
        assert node in run.out


def test_explain_resolves_the_overlay_claim_template(draguard: Callable[..., Run], at_root: Path) -> None:
    # namePrefix renames the template; the kustomize configuration in the base keeps the Job's
    # reference in step, so the built Job resolves and fits on the A100 node.
    run = draguard(
        "explain", "examples/teams/research", "--inventory", "examples/inventory.yaml", "-f", "json"
    )
    assert run.code == 0, run.err
    job = next(e for e in json.loads(run.out) if e["object"]["kind"] == "Job")
    assert job["source"] == "ResourceClaimTemplate prod-four-a100-nvlink"
    assert job["satisfiable"] is True
    assert job["alternatives"][0]["byNode"] == [
        {"node": "gpu-a100-0", "product": "NVIDIA A100 80GB PCIe", "count": 4}
    ]


def test_migrate_the_articles_legacy_pod(draguard: Callable[..., Run], at_root: Path) -> None:
    run = draguard("migrate", "examples/teams/ml-workloads/gpu-training-legacy.yaml")
    assert run.code == 1
    assert "+kind: ResourceClaimTemplate" in run.out
    assert "-          nvidia.com/gpu: 2" in run.out
