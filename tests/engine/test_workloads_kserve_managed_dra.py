"""KServe's Managed DRA: an LLMInferenceService's `serving.kserve.io/exp-dra-*` annotations make the
controller claim devices for the pod, so tier and quota judge those devices like any other DRA
request (tests/corpus/kserve, from kserve/kserve's docs/samples)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from webhook.core.findings import Mode
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.dra.workloads import container_amounts, kserve_managed_dra, pod_templates_of
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import load_policies

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = load_policies(ROOT / "policies")
MINIMAL = ROOT / "tests" / "corpus" / "kserve" / "llm-inference-service-managed-dra-minimal.yaml"
IMPLICIT = "deviceclass.resource.kubernetes.io/"


def _minimal() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(MINIMAL.read_text())
    return doc


def _findings(obj: dict[str, Any], namespace: str = "default") -> list[tuple[str, Mode, str]]:
    obj.setdefault("metadata", {})["namespace"] = namespace
    report = evaluate([SourceObject(obj)], SHIPPED, Inventory.empty(), Context())
    return [(f.rule, f.mode, f.message) for f in report.findings]


def test_the_annotation_is_the_devices_of_the_main_container() -> None:
    obj = _minimal()
    assert kserve_managed_dra(obj) == ("gpu.nvidia.com", 1, None)
    [tmpl] = pod_templates_of(obj)
    assert tmpl.pointer == "/spec/template"
    [main] = tmpl.spec["containers"]
    assert container_amounts(main)[f"{IMPLICIT}gpu.nvidia.com"] == 1
    # The object itself is not changed: this is how the pods run, not an edit.
    assert f"{IMPLICIT}gpu.nvidia.com" not in yaml.safe_dump(obj)


def test_an_llm_on_a_class_the_tier_does_not_allow_is_denied() -> None:
    # An LLMInferenceService without an image runs KServe's vLLM preset: class 'llm', which the
    # shipped tier policy gives only H100/H200/B200/GB200 classes.
    tier = [(m, msg) for r, m, msg in _findings(_minimal()) if r == "tier/gpu-tiers"]
    assert tier and tier[0][0] is Mode.ENFORCE and "gpu.nvidia.com" in tier[0][1]
    allowed = _minimal()
    allowed["metadata"]["annotations"]["serving.kserve.io/exp-dra-device-class"] = "gpu.nvidia.com-h100"
    assert [r for r, _m, _msg in _findings(allowed) if r == "tier/gpu-tiers"] == []


def test_count_container_and_replicas_are_charged() -> None:
    obj = _minimal()
    notes = obj["metadata"]["annotations"]
    notes["serving.kserve.io/exp-dra-device-class"] = "gpu.nvidia.com-h100"
    notes["serving.kserve.io/exp-dra-device-count"] = "4"
    obj["spec"]["replicas"] = 3
    # 3 pods x 4 H100s = 12 over the default budget of 8 GPU-equivalents.
    quota = [msg for r, m, msg in _findings(obj) if r.startswith("quota/") and m is Mode.ENFORCE]
    assert any("asks for 12 GPU-equivalents" in msg for msg in quota), quota
    obj["spec"]["replicas"] = 2
    assert [msg for r, m, msg in _findings(obj) if r.startswith("quota/") and m is Mode.ENFORCE] == []


def test_the_named_container_gets_the_devices() -> None:
    obj = _minimal()
    obj["metadata"]["annotations"]["serving.kserve.io/exp-dra-container-name"] = "main"
    obj["spec"]["template"]["containers"].insert(0, {"name": "sidecar", "image": "busybox:1.36"})
    [tmpl] = pod_templates_of(obj)
    sidecar, main = tmpl.spec["containers"]
    assert container_amounts(sidecar) == {}
    assert container_amounts(main)[f"{IMPLICIT}gpu.nvidia.com"] == 1


def test_without_a_template_the_preset_pod_gets_the_devices() -> None:
    obj = _minimal()
    del obj["spec"]["template"]
    [tmpl] = pod_templates_of(obj)
    assert tmpl.pointer == "/spec/template" and tmpl.replicas == 1
    assert container_amounts(tmpl.spec["containers"][0]) == {f"{IMPLICIT}gpu.nvidia.com": 1}


def test_values_kserve_refuses_are_not_read() -> None:
    for key, value in (("serving.kserve.io/exp-dra-device-count", "0"),
                       ("serving.kserve.io/exp-dra-device-count", "two"),
                       ("serving.kserve.io/exp-dra-device-count", "100000000000000000000"),
                       ("serving.kserve.io/exp-dra-device-class", "GPU.NVIDIA.COM"),
                       ("serving.kserve.io/exp-dra-device-class", "x" * 300 + "!"),
                       # A tenant's 256 KiB annotation is refused at once, not backtracked over.
                       ("serving.kserve.io/exp-dra-device-class", "a" * 262_000 + "!")):  # fmt: skip
        obj = _minimal()
        obj["metadata"]["annotations"][key] = value
        assert kserve_managed_dra(obj) is None, (key, value)
        [tmpl] = pod_templates_of(obj)
        assert not any(k.startswith(IMPLICIT) for k in container_amounts(tmpl.spec["containers"][0]))
    # Without the class annotation the others mean nothing (KServe's HasManagedDRA).
    obj = copy.deepcopy(_minimal())
    del obj["metadata"]["annotations"]["serving.kserve.io/exp-dra-device-class"]
    obj["metadata"]["annotations"]["serving.kserve.io/exp-dra-device-count"] = "2"
    assert kserve_managed_dra(obj) is None
