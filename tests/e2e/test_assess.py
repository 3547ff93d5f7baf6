"""`draguard assess` on the real local cluster, every workload running: legacy pods under a
Deployment and under a CronJob's Job on a second real node whose GPUs come from the simulated NVIDIA
device plugin (`nvidia.com/gpu`), and an LLM Deployment the webhook admitted before a stricter tier
policy existed, on H100s the draguard driver prepared on the first real node."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from driver.sim import load_topology
from tests.e2e.helpers import Kubectl, published_devices, wait_for
from webhook.dev import realnodes, scenarios
from webhook.dev.addons import topology_path
from webhook.dev.cluster import LocalCluster
from webhook.dev.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
TAINT = realnodes.DEVICE_PLUGIN_TAINT
# What each container prints: the GPUs it was given, as a CUDA program would find them.
SHOW = (
    'echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; '
    'for d in /dev/nvidia*; do [ -c "$d" ] && stat -c "node %n %t:%T" "$d"; done; '
    'echo "== end"; exec sleep 3600'
)

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
      labelWords:
        app: [llm]
    deviceClasses: [gpu.nvidia.com-h200]
"""


def _legacy_deployment(ns: str, image: str) -> str:
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
      terminationGracePeriodSeconds: 1
      containers:
      - name: trainer
        image: {image}
        command: [sh, -c, {json.dumps(SHOW)}]
        resources: {{limits: {{nvidia.com/gpu: 1}}}}
"""


def _cronjob(ns: str, image: str) -> str:
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
          terminationGracePeriodSeconds: 1
          containers:
          - name: eval
            image: {image}
            command: [sh, -c, {json.dumps(SHOW)}]
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


def _shown(kubectl: Kubectl, ns: str, pod: str) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """(UUIDs in NVIDIA_VISIBLE_DEVICES, {device node: (major, minor)}) as the container printed them."""

    def printed() -> str | None:
        out = kubectl.ok("logs", "-n", ns, pod)
        return out if "== end" in out else None

    out = str(wait_for(printed, f"{ns}/{pod} to print its GPUs", timeout=60))
    uuids: list[str] = []
    nodes: dict[str, tuple[int, int]] = {}
    for line in out.splitlines():
        if line.startswith("NVIDIA_VISIBLE_DEVICES="):
            uuids = [u for u in line.split("=", 1)[1].split(",") if u]
        elif line.startswith("node "):
            _, path, numbers = line.split()
            major, minor = numbers.split(":")
            nodes[path] = (int(major, 16), int(minor, 16))
    return uuids, nodes


def _assess(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "webhook.cli", "assess", "--kubeconfig", str(cluster.kubeconfig), *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)


def test_assess_a_mixed_cluster(
    cluster: LocalCluster,
    kubectl: Kubectl,
    namespace: Callable[..., str],
    device_plugin_node: str,
    h100_real_node: str,
    workload_image: str,
    tmp_path: Path,
) -> None:
    legacy_ns = namespace("assess")
    strict_ns = namespace("assess-strict")
    assert kubectl.apply(_legacy_deployment(legacy_ns, workload_image)).returncode == 0
    assert kubectl.apply(_cronjob(legacy_ns, workload_image)).returncode == 0
    cron = kubectl.get("cronjob", "nightly", legacy_ns)
    made = kubectl.apply(_job_of(cron))
    assert made.returncode == 0, made.stderr
    # An LLM on H100s: today's shipped policies admit it; the stricter policy below came later.
    assert kubectl.apply(scenarios.llm_template(strict_ns, scenarios.H100)).returncode == 0
    llm = scenarios.llm_deployment(
        strict_ns, scenarios.H100, 1, image=workload_image, node=h100_real_node, command=SHOW
    )
    wait_for(
        lambda: kubectl.run("apply", "--dry-run=server", "-f", "-", input=llm).returncode == 0,
        "the webhook to know the new claim template",
        timeout=20,
    )
    made = kubectl.apply(llm)
    assert made.returncode == 0, made.stderr

    def running(ns: str, want: int) -> list[dict[str, Any]] | None:
        pods = kubectl.items("pods", ns)
        for p in pods:
            phase = p["status"].get("phase")
            assert phase not in ("Failed", "Succeeded"), json.dumps(p["status"], indent=1)
        up = [p for p in pods if p["status"].get("phase") == "Running"]
        return up if len(pods) == want and len(up) == want else None

    legacy_pods = wait_for(lambda: running(legacy_ns, 3), "3 legacy pods Running", timeout=180)
    [llm_pod] = wait_for(lambda: running(strict_ns, 1), "the LLM pod Running", timeout=180)

    # The legacy pods run on the device-plugin node, each with its own GPU from the plugin.
    a100 = {g.uuid: g.minor for g in load_topology(topology_path("a100-4x-nvlink.yaml")).gpus}
    seen: list[str] = []
    for p in legacy_pods:
        assert p["spec"]["nodeName"] == device_plugin_node
        uuids, nodes = _shown(kubectl, legacy_ns, p["metadata"]["name"])
        assert len(uuids) == 1 and uuids[0] in a100, uuids
        gpu_nodes = {k: v for k, v in nodes.items() if k.removeprefix("/dev/nvidia").isdigit()}
        assert gpu_nodes == {f"/dev/nvidia{a100[uuids[0]]}": (195, a100[uuids[0]])}
        assert nodes["/dev/nvidiactl"] == (195, 255)
        seen += uuids
    assert len(set(seen)) == 3, "each legacy pod has a GPU of its own"
    # draguard's driver does not serve that node: the device plugin's GPUs are its only ones.
    assert published_devices(kubectl, device_plugin_node) == {}
    owners = {p["metadata"]["ownerReferences"][0]["kind"] for p in legacy_pods}
    assert owners == {"ReplicaSet", "Job"}

    # The LLM pod runs on the first real node, with the H100 its claim was allocated.
    assert llm_pod["spec"]["nodeName"] == h100_real_node
    [claim] = kubectl.items("resourceclaims", strict_ns)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    h100 = load_topology(topology_path("h100-8x-nvlink.yaml")).gpus
    gpu = next(g for g in h100 if f"gpu-{g.minor}" == result["device"])
    uuids, nodes = _shown(kubectl, strict_ns, llm_pod["metadata"]["name"])
    assert uuids == [gpu.uuid]
    assert {k for k in nodes if k.removeprefix("/dev/nvidia").isdigit()} == {f"/dev/nvidia{gpu.minor}"}

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

    node = next(n for n in a["nodes"] if n["name"] == device_plugin_node)
    assert node["capacity"] == {"nvidia.com/gpu": "4"} and node["model"] == "NVIDIA-A100-80GB-PCIe"
    assert node["allocatable"] == {"nvidia.com/gpu": "4"}

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
    llm_denied = denied[("Deployment", strict_ns, "llm-inference-h100")]
    assert [f["rule"] for f in llm_denied["deny"]] == ["tier/llm-on-h200"]
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
    manifest.write_text(scenarios.llm_template(strict_ns, scenarios.H100) + "---\n" + llm)
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
