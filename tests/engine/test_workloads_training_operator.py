"""Kubeflow Training Operator v1 jobs (kubeflow.org/v1 PyTorchJob, TFJob, PaddleJob, XGBoostJob,
JAXJob): every replica type's pod template is read with its replicas, so quota counts every worker and
migrate reports and rewrites their device-plugin GPUs. Built from the corpus's PaddleJob (kubeflow/
training-operator's examples) and the same job in each kind's own field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from webhook.core.findings import Mode
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.dra.workloads import KUBEFLOW_V1_JOBS, pod_templates_of
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import load_policies

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = load_policies(ROOT / "policies")
PADDLE = ROOT / "tests" / "corpus" / "kubeflow-trainer" / "paddlejob-simple-gpu.yaml"


def _paddle() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(PADDLE.read_text())
    return doc


def _as(kind: str) -> dict[str, Any]:
    """The PaddleJob's workers as a job of another training-operator kind."""
    obj = _paddle()
    obj["kind"] = kind
    obj["spec"] = {KUBEFLOW_V1_JOBS[kind]: copy.deepcopy(obj["spec"]["paddleReplicaSpecs"])}
    return obj


def _findings(obj: dict[str, Any], **ctx: Any) -> list[tuple[str, Mode, str]]:
    report = evaluate([SourceObject(obj)], SHIPPED, Inventory.empty(), Context(**ctx))
    return [(f.rule, f.mode, f.message) for f in report.findings]


@pytest.mark.parametrize("kind", sorted(KUBEFLOW_V1_JOBS))
def test_every_replica_type_is_read_with_its_replicas(kind: str) -> None:
    obj = _as(kind)
    field = KUBEFLOW_V1_JOBS[kind]
    obj["spec"][field]["Master"] = {"replicas": 1, "template": {"spec": {"containers": [{"name": "m"}]}}}
    got = sorted((t.pointer, t.replicas) for t in pod_templates_of(obj))
    assert got == [(f"/spec/{field}/Master/template/spec", 1), (f"/spec/{field}/Worker/template/spec", 2)]


def test_the_paddlejob_gets_the_legacy_gpu_warning() -> None:
    [(rule, mode, message)] = [f for f in _findings(_paddle()) if f[0].startswith("migrate/")]
    assert rule == "migrate/legacy-gpu" and mode is Mode.WARN and "nvidia.com/gpu" in message


@pytest.mark.parametrize("kind", ["TFJob", "XGBoostJob", "JAXJob"])
def test_quota_counts_every_worker(kind: str) -> None:
    # 5 workers x 2 device-plugin GPUs = 10 over the default budget of 8 GPU-equivalents.
    obj = _as(kind)
    obj["spec"][KUBEFLOW_V1_JOBS[kind]]["Worker"]["replicas"] = 5
    quota = [m for r, mode, m in _findings(obj) if r.startswith("quota/") and mode is Mode.ENFORCE]
    assert any("asks for 10 GPU-equivalents" in m for m in quota), quota
    obj["spec"][KUBEFLOW_V1_JOBS[kind]]["Worker"]["replicas"] = 4
    assert not [r for r, mode, _m in _findings(obj) if r.startswith("quota/") and mode is Mode.ENFORCE]


def test_online_migration_rewrites_the_workers() -> None:
    obj = _paddle()
    ctx = Context(namespace_labels={"kubeflow": {"draguard.io/migration-mode": "migrate"}}, admission=True)
    report = evaluate([SourceObject(obj)], SHIPPED, Inventory.empty(), ctx, rule_modules=("migrate",))
    patch = [op for f in report.findings if f.patch for op in f.patch]
    assert patch
    worker = jsonpatch.apply_patch(obj, patch)["spec"]["paddleReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["resourceClaims"]
    assert "nvidia.com/gpu" not in worker["containers"][0]["resources"].get("limits", {})


def test_nvidias_mpijob_workers_are_read() -> None:
    # NVIDIA's IMEX bandwidth test (k8s-dra-driver-gpu, tests/bats/specs): an MPI Operator v2beta1
    # MPIJob whose 2 workers ask nvidia.com/gpu: 2 each beside a ComputeDomain channel claim.
    path = ROOT / "tests" / "corpus" / "nvidia-dra-driver" / "imex-nvbandwidth-test-job-1.yaml"
    job = next(d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "MPIJob")
    got = [(t.pointer, t.replicas) for t in pod_templates_of(job)]
    assert got == [("/spec/mpiReplicaSpecs/Launcher/template/spec", 1),
                   ("/spec/mpiReplicaSpecs/Worker/template/spec", 2)]  # fmt: skip
    found = _findings(job)
    assert [r for r, _m, _msg in found if r == "migrate/legacy-gpu"] == ["migrate/legacy-gpu"]
    # 2 workers x 2 GPUs = 4, within the default 8; 5 workers would be 10.
    assert not [r for r, m, _msg in found if r.startswith("quota/") and m is Mode.ENFORCE]
    job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 5
    quota = [msg for r, _m, msg in _findings(job) if r.startswith("quota/")]
    assert any("asks for 10 GPU-equivalents" in msg for msg in quota), quota
