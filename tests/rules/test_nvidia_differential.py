"""draguard's port of NVIDIA's opaque-config rules (webhook/dra/drivers/nvidia.py) against NVIDIA's
own API types (tools/nvconfig, built from the driver's source): hand-written and generated configs,
with the sharing feature gates on and off, must get the same verdict from both.

What the tool cannot judge is left out of the comparison: the 10 KiB limit (the API server's) and
which device types a kind fits (prepare time, covered in test_nvidia_config.py). Per-device
pinned-memory keys use indexes within the devices given to both and those devices' UUIDs.
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.gotool import ROOT, SCRIPT, run_tool
from tests.rules.test_nvidia_config import CASES
from webhook.dra.drivers import nvidia

API = nvidia.API_VERSION
UUIDS = ["GPU-4a1f2c3e-0000-0000-0000-000000000001", "MIG-0f1e2d3c-0000-0000-0000-00000000000b"]
GATE_SETS: list[frozenset[str]] = [
    frozenset({"TimeSlicingSettings", "MPSSupport"}), frozenset({"TimeSlicingSettings"}),
    frozenset({"MPSSupport"}), frozenset(),
]
QUANTITIES: list[Any] = ["1Mi", "10Gi", "1G", "2048Mi", "1.5Gi", 1073741824, "1e9", "512Ki", "0", "-5Mi",
                         "ten gigs", "1GB", True, None, 3.5, "", " 1Gi"]
JUNK: list[Any] = [None, "", "x", 0, -1, 101, 50, 12.5, True, [], {}, {"a": 1}, "Long", "MPS", "TimeSlicing",
                   "LegacyOnly", "PreferIommuFD", "All", "uid-1"]


@pytest.fixture(scope="module", autouse=True)
def _nvidia_source() -> None:
    """The tool builds from NVIDIA's driver source, which comes from git, not the Go proxy: where it
    cannot be fetched the comparison is skipped, under CI too. Unlike the other reference tools, whose
    modules every machine that runs the suite can fetch, this source is reachable only where git can reach
    its repository (or DRAGUARD_NVIDIA_SRC names a clone), so its absence says nothing about draguard."""
    built = Path(subprocess.run(["bash", str(SCRIPT), "--path", "nvconfig"], check=True, capture_output=True,
                                text=True).stdout.strip())
    if built.is_file():
        return
    res = subprocess.run([str(ROOT / "tools" / "nvconfig" / "source.sh")], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip("tools/nvconfig: NVIDIA's DRA driver source could not be fetched "
                     f"({res.stderr.strip()}); set DRAGUARD_NVIDIA_SRC to a clone of "
                     "kubernetes-sigs/dra-driver-nvidia-gpu")


def _valid(rng: random.Random) -> tuple[str, dict[str, Any]]:
    kind = rng.choice(["GpuConfig", "MigDeviceConfig", "VfioDeviceConfig", "ComputeDomainChannelConfig",
                       "ComputeDomainDaemonConfig"])
    p: dict[str, Any] = {"apiVersion": API, "kind": kind}
    if kind in ("GpuConfig", "MigDeviceConfig"):
        if rng.random() < 0.85:
            strategy = rng.choice(nvidia.STRATEGIES)
            sharing: dict[str, Any] = {"strategy": strategy}
            if strategy == "TimeSlicing" and kind == "GpuConfig" and rng.random() < 0.6:
                sharing["timeSlicingConfig"] = {"interval": rng.choice(nvidia.INTERVALS)}
            if strategy == "MPS" and rng.random() < 0.8:
                mps: dict[str, Any] = {}
                if rng.random() < 0.5:
                    mps["defaultActiveThreadPercentage"] = rng.randint(0, 100)
                if rng.random() < 0.5:
                    mps["defaultPinnedDeviceMemoryLimit"] = rng.choice(["1Mi", "10Gi", "1.5Gi", 1073741824])
                if rng.random() < 0.4:
                    keys = rng.sample(["0", "1", *UUIDS], rng.randint(1, 3))
                    mps["defaultPerDevicePinnedMemoryLimit"] = {k: rng.choice(["1Gi", "1Mi"]) for k in keys}
                if rng.random() < 0.3:
                    mps["multiUser"] = rng.random() < 0.5
                sharing["mpsConfig"] = mps
            p["sharing"] = sharing
        return "gpu.nvidia.com", p
    if kind == "VfioDeviceConfig":
        if rng.random() < 0.8:
            iommu: dict[str, Any] = {}
            if rng.random() < 0.7:
                iommu["backendPolicy"] = rng.choice(nvidia.BACKEND_POLICIES)
            if rng.random() < 0.5:
                iommu["enableAPIDevice"] = rng.random() < 0.5
            p["iommu"] = iommu
        return "gpu.nvidia.com", p
    p["domainID"] = "4f2b7c1e-uid"
    if kind == "ComputeDomainChannelConfig" and rng.random() < 0.5:
        p["allocationMode"] = rng.choice(["Single", "All"])
    return "compute-domain.nvidia.com", p


def _objects(obj: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for k, v in obj.items():
        if isinstance(v, dict) and k != "defaultPerDevicePinnedMemoryLimit":
            out += _objects(v, (*prefix, k))
    return out


def _mutate(rng: random.Random, driver: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    p = copy.deepcopy(params)
    where = rng.choice(_objects(p))
    target = p
    for key in where:
        target = target[key]
    roll = rng.random()
    if roll < 0.2:
        target[rng.choice(["replicas", "Strategy", "interval", "backendpolicy", "domainId"])] = 1
    elif roll < 0.35 and target:
        del target[rng.choice(sorted(target))]
    elif roll < 0.75 and target:
        key = rng.choice(sorted(target))
        pool = QUANTITIES if "Limit" in key else JUNK
        target[key] = rng.choice(pool)
    elif roll < 0.85:
        p["kind"] = rng.choice(["GpuConfig", "MigDeviceConfig", "VfioDeviceConfig", "ComputeDomain",
                                "ComputeDomainDaemonConfig", "TimeSlicingConfig", "gpuconfig"])
    elif roll < 0.9:
        p["apiVersion"] = rng.choice(["resource.nvidia.com/v1alpha1", "gpu.nvidia.com/v1alpha1",
                                      "resource.nvidia.com/v1", ""])
    else:
        driver = "compute-domain.nvidia.com" if driver == "gpu.nvidia.com" else "gpu.nvidia.com"
    return driver, p


def _corpus() -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(20260807)
    out = [(driver, params) for _why, driver, params, _path in CASES]
    for _ in range(700):
        driver, params = _valid(rng)
        out.append((driver, params))
        for _ in range(2):
            out.append(_mutate(rng, driver, params))
    return out


def test_port_agrees_with_nvidias_api_types() -> None:
    corpus = _corpus()
    lines = []
    for gates in GATE_SETS:
        for driver, params in corpus:
            lines.append(json.dumps({"driver": driver, "parameters": params, "uuids": UUIDS,
                                     "gates": ",".join(f"{g}=true" for g in sorted(gates))}))
    res = run_tool("nvconfig", stdin="\n".join(lines) + "\n", timeout=300)
    assert res.returncode == 0, res.stderr
    verdicts = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(verdicts) == len(lines)
    disagree = []
    accepted = rejected = 0
    for i, verdict in enumerate(verdicts):
        gates = GATE_SETS[i // len(corpus)]
        driver, params = corpus[i % len(corpus)]
        errors = nvidia.validate(driver, params, None, gates)
        accepted += verdict["ok"]
        rejected += not verdict["ok"]
        if verdict["ok"] != (not errors):
            disagree.append((driver, sorted(gates), params, verdict.get("error"), [str(e) for e in errors]))
    assert not disagree, f"{len(disagree)} of {len(verdicts)} differ; first: {disagree[:3]}"
    # The corpus exercises both verdicts, not one.
    assert accepted > 500 and rejected > 1000, (accepted, rejected)


@pytest.mark.parametrize("gates", [frozenset(), frozenset({"TimeSlicingSettings", "MPSSupport"})])
def test_the_driver_panics_where_the_port_reports_a_missing_interval(gates: frozenset[str]) -> None:
    params = {"apiVersion": API, "kind": "GpuConfig",
              "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}}
    line = json.dumps({"driver": "gpu.nvidia.com", "parameters": params,
                       "gates": ",".join(f"{g}=true" for g in sorted(gates))})
    verdict = json.loads(run_tool("nvconfig", stdin=line + "\n").stdout)
    assert verdict["ok"] is False
    errors = nvidia.validate("gpu.nvidia.com", params, None, gates)
    if gates:
        assert verdict["error"].startswith("panic: ")
        assert [e.path for e in errors] == ["sharing.timeSlicingConfig.interval"]
    else:
        assert "feature gate is not enabled" in verdict["error"]
        assert "feature gate is not enabled" in errors[0].message
