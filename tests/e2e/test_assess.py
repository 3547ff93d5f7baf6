"""`draguard assess` on the real local cluster: legacy pods under a Deployment and under a CronJob's
Job, a DRA Deployment with allocated claims, an LLM Deployment the webhook admitted before a
stricter tier policy existed, a node advertising device-plugin GPUs, and the drivers' ResourceSlices."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import Kubectl, wait_for
from webhook.dev import scenarios
from webhook.dev.cluster import LocalCluster
from webhook.dev.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
TAINT = "draguard.io/assess-e2e"

STRICT = """\
apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata:
  name: llm-on-h200
spec:
  mode: enforce
  namespaces: ["assess-strict-*"]
  classes:
  - name: llm
    match:
      imageWords: [vllm]
    deviceClasses: [gpu.nvidia.com-h200]
"""


def _legacy_deployment(ns: str) -> str:
    return f"""\
apiVersion: apps/v1
kind: Deployment
metadata: {{name: legacy-train, namespace: {ns}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: legacy-train}}}}
  template:
    metadata: {{labels: {{app: legacy-train}}}}
    spec:
      tolerations: [{{key: {TAINT}, operator: Exists}}]
      containers:
      - name: trainer
        image: nvcr.io/nvidia/pytorch:24.01-py3
        resources: {{limits: {{nvidia.com/gpu: 1}}}}
"""


def _cronjob(ns: str) -> str:
    return f"""\
apiVersion: batch/v1
kind: CronJob
metadata: {{name: nightly, namespace: {ns}}}
spec:
  schedule: "0 3 * * *"
  suspend: true
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          tolerations: [{{key: {TAINT}, operator: Exists}}]
          containers:
          - name: eval
            image: nvcr.io/nvidia/pytorch:24.01-py3
            resources: {{limits: {{nvidia.com/gpu: 1}}}}
"""


def _job_of(cron: dict[str, Any]) -> str:
    """The Job the CronJob controller would make (made here: the schedule is hours away)."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "nightly-29000000",
            "namespace": cron["metadata"]["namespace"],
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "CronJob",
                    "name": cron["metadata"]["name"],
                    "uid": cron["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": cron["spec"]["jobTemplate"]["spec"],
    }
    return json.dumps(job)


@pytest.fixture
def gpu_node(cluster: LocalCluster, kubectl: Kubectl) -> Iterator[str]:
    """A node that advertises 4 device-plugin GPUs (tainted so no other test's pods land on it)."""
    name = f"assess-legacy-{uuid.uuid4().hex[:6]}"
    kube = cluster.kube()
    kube.create(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                },
            },
            "spec": {"taints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]},
        },
    )
    gpus = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "4"}
    kube.merge_patch(f"/api/v1/nodes/{name}/status", {"status": {"capacity": gpus, "allocatable": gpus}})
    yield name
    kubectl.run("delete", "node", name, "--wait=false")


def _assess(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "webhook.cli", "assess", "--kubeconfig", str(cluster.kubeconfig), *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)


def test_assess_a_mixed_cluster(
    cluster: LocalCluster, kubectl: Kubectl, namespace: Callable[..., str], gpu_node: str, tmp_path: Path
) -> None:
    legacy_ns = namespace("assess")
    strict_ns = namespace("assess-strict")
    assert kubectl.apply(_legacy_deployment(legacy_ns)).returncode == 0
    assert kubectl.apply(_cronjob(legacy_ns)).returncode == 0
    cron = kubectl.get("cronjob", "nightly", legacy_ns)
    made = kubectl.apply(_job_of(cron))
    assert made.returncode == 0, made.stderr
    # An LLM on H100s: today's shipped policies admit it; the stricter policy below came later.
    assert kubectl.apply(scenarios.llm_template(strict_ns, scenarios.H100)).returncode == 0
    wait_for(
        lambda: (
            kubectl.run(
                "apply",
                "--dry-run=server",
                "-f",
                "-",
                input=scenarios.llm_deployment(strict_ns, scenarios.H100, 1),
            ).returncode
            == 0
        ),
        "the webhook to know the new claim template",
        timeout=20,
    )
    made = kubectl.apply(scenarios.llm_deployment(strict_ns, scenarios.H100, replicas=1))
    assert made.returncode == 0, made.stderr

    def settled() -> bool:
        legacy = kubectl.items("pods", legacy_ns)
        llm = kubectl.items("pods", strict_ns)
        claims = kubectl.items("resourceclaims", strict_ns)
        allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
        return len(legacy) == 3 and len(llm) == 1 and len(allocated) == 1

    wait_for(settled, "3 legacy pods and 1 LLM pod with an allocated claim", timeout=90)

    policies = tmp_path / "policies"
    shutil.copytree(ROOT / "policies", policies, ignore=shutil.ignore_patterns("tests"))
    (policies / "strict.yaml").write_text(STRICT)
    snap = tmp_path / "state.json"
    html = tmp_path / "report.html"
    # A small page size: every list takes several pages.
    done = _assess(
        cluster, "--policies", str(policies), "--format", "json", "--snapshot", str(snap), "--page-size", "3"
    )
    assert done.returncode == 0, done.stderr
    a = json.loads(done.stdout)

    assert a["server"]["gitVersion"].startswith("v1.37")
    assert "v1" in a["dra"]["served"]
    slices = kubectl.items("resourceslices")
    h100 = sum(
        1
        for s in slices
        for d in s["spec"].get("devices") or []
        if str(d.get("attributes", {}).get("productName", {}).get("string", "")).startswith("NVIDIA H100")
    )
    driver = next(d for d in a["drivers"] if d["driver"] == scenarios.DRIVER)
    assert driver["slices"] == sum(1 for s in slices if s["spec"]["driver"] == scenarios.DRIVER)
    assert h100 > 0
    classes = {c["name"]: c for c in a["deviceClasses"]}
    assert classes[scenarios.H100]["devices"] == h100
    assert classes[scenarios.H100]["allocated"] >= 1

    node = next(n for n in a["nodes"] if n["name"] == gpu_node)
    assert node["capacity"] == {"nvidia.com/gpu": "4"} and node["model"] == "NVIDIA-A100-SXM4-80GB"

    legacy = {
        (w["owner"]["kind"], w["owner"]["namespace"], w["owner"]["name"]): w for w in a["legacyWorkloads"]
    }
    dep = legacy[("Deployment", legacy_ns, "legacy-train")]
    assert dep["pods"] == 2 and dep["legacyGpus"] == {"nvidia.com/gpu": 2}
    assert [c.split("/")[0] for c in dep["chain"]] == ["ReplicaSet", "Deployment"]
    mig = dep["migration"]
    assert mig["templates"] == [
        {"name": "draguard-gpu-nvidia-com-a100-1", "deviceClass": scenarios.A100, "count": 1}
    ]
    assert mig["tier"]["admitted"] is True
    assert mig["quota"]["devices"] == {scenarios.A100: 2} and mig["quota"]["replicas"] == 2
    cj = legacy[("CronJob", legacy_ns, "nightly")]
    assert cj["pods"] == 1 and cj["chain"] == [
        f"Job/{legacy_ns}/nightly-29000000",
        f"CronJob/{legacy_ns}/nightly",
    ]

    denied = {(w["owner"]["kind"], w["owner"]["namespace"], w["owner"]["name"]): w for w in a["wouldDeny"]}
    llm = denied[("Deployment", strict_ns, "llm-inference-h100")]
    assert [f["rule"] for f in llm["deny"]] == ["tier/llm-on-h200"]
    assert not any(k[1] == legacy_ns for k in denied), "the legacy workloads only warn"

    status = {i["id"]: i["status"] for i in a["checklist"]}
    assert status["infrastructure/version"] == "pass"
    assert status["infrastructure/dra-api"] == "pass"
    assert status["infrastructure/driver"] == "pass"
    assert status["workloads/legacy"] == "fail"
    assert status["workloads/policy"] == "fail"
    assert status["security/admission"] == "pass"
    assert a["gpuUse"]["legacy"] >= 3 and a["gpuUse"]["dra"] >= 1

    # The snapshot is what review reads: the LLM Deployment is denied there too, with the live classes.
    manifest = tmp_path / "llm.yaml"
    manifest.write_text(
        scenarios.llm_template(strict_ns, scenarios.H100)
        + "---\n"
        + scenarios.llm_deployment(strict_ns, scenarios.H100, 1)
    )
    review = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "review",
            "--policies",
            str(policies),
            "--cluster-state",
            str(snap),
            "--inventory",
            str(snap),
            "--format",
            "json",
            str(manifest),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert review.returncode == 1, review.stderr
    assert "tier/llm-on-h200" in {f["rule"] for f in json.loads(review.stdout)["findings"]}
    names = {i["metadata"]["name"] for i in json.loads(snap.read_text())["items"] if i["kind"] == "Namespace"}
    assert {legacy_ns, strict_ns} <= names

    page = _assess(cluster, "--policies", str(policies), "--format", "html", "--output", str(html), "--quiet")
    assert page.returncode == 0, page.stderr
    text = html.read_text()
    assert text.count("<svg") == 3 and "legacy-train" in text and "<script" not in text


def test_assess_names_an_unreachable_cluster(tmp_path: Path, cluster: LocalCluster) -> None:
    bad = tmp_path / "kubeconfig"
    cfg = json.loads(cluster.kubeconfig.read_text())
    # A loopback port nothing listens on: the connection is refused on this machine.
    cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    bad.write_text(json.dumps(cfg))
    done = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "assess", "--kubeconfig", str(bad), "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout[-500:]
    assert done.stderr.startswith("draguard assess: cannot reach the API server"), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
