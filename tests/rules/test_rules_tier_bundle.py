"""The bundle against its own policies: what `kustomize build kustomize/base` ships must agree with itself.

The policies are read from the built ConfigMap `draguard-policies` (what the webhook loads), the
DeviceClasses from the same build, and the devices from the driver's simulated topologies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kustomize.kbundle import kustomize_command
from webhook.core.findings import Mode, Report
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.evaluate import evaluate
from webhook.policy.load import parse_policy_text
from webhook.policy.model import PolicySet

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = ("a100-4x-mig", "h100-8x-nvlink")


def _need(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@cache
def bundle() -> tuple[dict[str, Any], ...]:
    cmd = kustomize_command()
    if cmd is None:
        _need("neither kustomize nor kubectl is on PATH")
        raise AssertionError("unreachable")
    out = subprocess.run(
        [*cmd, str(REPO / "kustomize" / "base")], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return tuple(d for d in yaml.safe_load_all(out) if isinstance(d, Mapping))


def shipped_policies() -> PolicySet:
    (cm,) = [
        o
        for o in bundle()
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("draguard-policies")
    ]
    return PolicySet.of(
        [p for name, text in sorted(cm["data"].items()) for p in parse_policy_text(text, name).all()]
    )


def device_classes() -> list[dict[str, Any]]:
    return [o for o in bundle() if o["kind"] == "DeviceClass"]


@cache
def inventory() -> Inventory:
    objs: list[Any] = list(device_classes())
    for topo in TOPOLOGIES:
        out = subprocess.run(
            [sys.executable, "-m", "webhook.cli", "driver", "inventory", "--sim", topo, "-o", "yaml"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            cwd=REPO,
        ).stdout
        objs += [d for d in yaml.safe_load_all(out) if isinstance(d, Mapping)]
    return Inventory.from_objects(objs)


def review(objects: list[dict[str, Any]], policies: PolicySet | None = None) -> Report:
    return evaluate([SourceObject(o) for o in objects], policies or shipped_policies(), inventory())


def workload(image: str, device_class: str, command: list[str] | None = None) -> list[dict[str, Any]]:
    tmpl = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one", "namespace": "ml"},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}
        },
    }
    container: dict[str, Any] = {"name": "c", "image": image, "resources": {"claims": [{"name": "gpu"}]}}
    if command:
        container["command"] = command
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {
            "containers": [container],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one"}],
        },
    }
    return [tmpl, pod]


def test_the_bundle_passes_its_own_policies() -> None:
    denied = [f for f in review(list(bundle())).findings if f.mode is Mode.ENFORCE]
    assert denied == [], "\n".join(f"{f.rule}: {f.object}: {f.message}" for f in denied)


def _mig_classes() -> list[str]:
    names = [o["metadata"]["name"] for o in device_classes() if "mig" in o["metadata"]["name"]]
    assert len(names) >= 7, names  # the bundle ships every A100 MIG profile
    return names


@pytest.mark.parametrize(
    ("what", "image"),
    [
        ("notebook", "quay.io/jupyter/pytorch-notebook:latest"),
        ("triton", "nvcr.io/nvidia/tritonserver:24.12-py3"),
    ],
)
def test_notebooks_and_triton_may_use_every_shipped_mig_class(what: str, image: str) -> None:
    for dc in _mig_classes():
        findings = [f for f in review(workload(image, dc)).findings if f.rule.startswith("tier/")]
        assert findings == [], f"{what} on {dc}: {findings[0].message}"


def test_every_shipped_class_serves_some_workload_class_and_back() -> None:
    names = [o["metadata"]["name"] for o in device_classes()]
    (tiers,) = shipped_policies().tier
    for dc in names:
        assert any(c.allows(dc) for c in tiers.classes), f"no workload class may use DeviceClass {dc}"
    for c in tiers.classes:
        assert any(c.allows(dc) for dc in names), (
            f"class {c.name!r} may use none of the shipped DeviceClasses"
        )


def test_the_lint_has_teeth() -> None:
    """vLLM is kept off every shipped class but H100, H200, B200 and GB200, so the checks above could
    fail."""
    for o in device_classes():
        dc = o["metadata"]["name"]
        findings = [
            f for f in review(workload("vllm/vllm-openai:v0.6.3", dc)).findings if f.rule.startswith("tier/")
        ]
        llm_class = any(f"gpu.nvidia.com-{fam}" in dc for fam in ("h100", "h200", "b200", "gb200"))
        assert bool(findings) == (not llm_class), dc
