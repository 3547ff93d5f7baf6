"""KServe's LLMInferenceService preset: a template whose `main` container has no image of its own
(or no `main` at all) runs the preset's vLLM server, whatever image a sidecar beside it names."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import load_policies

ROOT = Path(__file__).resolve().parents[2]
POLICIES = load_policies(ROOT / "policies")
# Managed DRA on gpu.nvidia.com (any GPU), with a busybox sidecar and an image-less `main`.
MULTI_DEVICE = ROOT / "tests/corpus/kserve/llm-inference-service-managed-dra-multi-device.yaml"
MULTI = yaml.safe_load(MULTI_DEVICE.read_text())


def _tier(obj: dict[str, Any]) -> list[str]:
    report = evaluate([SourceObject(obj)], POLICIES, Inventory.empty(), Context())
    return [f.message for f in report.findings if f.rule == "tier/gpu-tiers"]


def test_an_image_less_main_beside_a_sidecar_is_the_vllm_preset() -> None:
    (message,) = _tier(copy.deepcopy(MULTI))
    assert "class 'llm'" in message and "gpu.nvidia.com" in message


def test_a_template_without_main_still_runs_the_preset() -> None:
    obj = copy.deepcopy(MULTI)
    obj["spec"]["template"]["containers"] = [c for c in obj["spec"]["template"]["containers"]
                                             if c["name"] != "main"]  # fmt: skip
    obj["metadata"]["annotations"].pop("serving.kserve.io/exp-dra-container-name")
    assert _tier(obj)


def test_a_main_with_its_own_image_is_judged_by_that_image() -> None:
    obj = copy.deepcopy(MULTI)
    for c in obj["spec"]["template"]["containers"]:
        if c["name"] == "main":
            c["image"] = "example.com/text-embedder:1.0"
    assert _tier(obj) == []
    # ... and a server image the llm class names is an LLM again.
    for c in obj["spec"]["template"]["containers"]:
        if c["name"] == "main":
            c["image"] = "vllm/vllm-openai:v0.9.0"
    assert _tier(obj)
