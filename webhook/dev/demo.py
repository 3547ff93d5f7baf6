"""`draguard demo`: the article's scenarios, live, against the local cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import scenarios
from .cluster import REPO_ROOT, ClusterError, LocalCluster, wait_until

NAMESPACES = {
    "migrate": ("demo-migrate", scenarios.MIGRATE_LABELS),
    "tiers": ("demo-llm", {}),
    "quota": ("team-demo", {}),
    "training": ("demo-training", {}),
}


def _say(text: str = "") -> None:
    print(text, flush=True)


def _indent(text: str) -> str:
    return textwrap.indent(text.strip() or "(no output)", "    ")


class Demo:
    """Runs the steps, printing what a user would type and what the cluster answered."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.failures: list[str] = []

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        _say(f"  $ kubectl {' '.join(args)}")
        proc = self.cluster.kubectl_run(*args, input=input)
        _say(_indent(proc.stdout + proc.stderr))
        return proc

    def get(self, *args: str) -> Any:
        proc = self.cluster.kubectl_run("get", *args, "-o", "json")
        if proc.returncode != 0:
            raise ClusterError(proc.stderr.strip())
        return json.loads(proc.stdout)

    def expect(self, ok: bool, what: str) -> None:
        _say(f"  {'OK ' if ok else 'FAIL'} {what}")
        if not ok:
            self.failures.append(what)

    def namespace(self, key: str) -> str:
        name, labels = NAMESPACES[key]
        self.cluster.kube().create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels)}},
        )
        self.cluster.wait_default_sa(name)
        return name

    def wait(self, check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        try:
            return wait_until(check, timeout, what, interval=0.5)
        except ClusterError:
            return None

    def allocation(self, claim: dict[str, Any]) -> list[dict[str, Any]]:
        alloc = (claim.get("status") or {}).get("allocation") or {}
        return list((alloc.get("devices") or {}).get("results") or [])

    def show_allocation(self, ns: str, claim_name: str) -> list[dict[str, Any]]:
        claim = self.wait(
            lambda: (c := self.get("resourceclaim", claim_name, "-n", ns)) and self.allocation(c) and c,
            f"claim {ns}/{claim_name} allocated",
        )
        results = self.allocation(claim) if claim else []
        for r in results:
            _say(f"    allocated: driver={r['driver']} pool={r['pool']} device={r['device']}")
        return results

    def show_running(self, ns: str, pod: str) -> None:
        """On the real node: wait for the pod to run and print what its container saw."""
        if not self.on_real_node:
            return
        running = self.wait(
            lambda: (p := self.get("pod", pod, "-n", ns))["status"].get("phase") == "Running" and p,
            f"pod {ns}/{pod} Running",
            timeout=120,
        )
        self.expect(bool(running), f"pod {pod} Running on the real node {self.cluster.real_node}")
        if running:
            seen = self.cluster.kubectl_run("logs", "-n", ns, pod).stdout
            _say("    the container saw:")
            _say(textwrap.indent(seen.strip() or "(nothing yet)", "      "))
            self.expect(
                "NVIDIA_VISIBLE_DEVICES=GPU-" in seen, "its claim's GPU UUIDs in NVIDIA_VISIBLE_DEVICES"
            )

    @property
    def on_real_node(self) -> bool:
        return bool(self.cluster.real_node and self.cluster.workload_image)

    def runs(self) -> dict[str, str | None]:
        """Arguments that put a scenario's pod on the real node with a command showing its GPUs."""
        if not self.on_real_node:
            return {}
        return {
            "image": self.cluster.workload_image,
            "node": self.cluster.real_node,
            "command": scenarios.SHOW_GPUS,
        }

    def pod_claims(self, ns: str, pod: str) -> list[str]:
        bound = self.wait(
            lambda: (p := self.get("pod", pod, "-n", ns))["spec"].get("nodeName") and p,
            f"pod {ns}/{pod} scheduled",
        )
        if not bound:
            return []
        node = bound["spec"]["nodeName"]
        kind = "real node" if node == self.cluster.real_node else "simulated node: scheduled, never run"
        _say(f"    pod {pod} bound to node {node} ({kind})")
        return [s["resourceClaimName"] for s in bound["status"].get("resourceClaimStatuses") or []]

    # ---- steps -------------------------------------------------------------------------------
    def step_migrate(self) -> None:
        _say("\n== 1. A device-plugin pod (nvidia.com/gpu: 2) in a namespace in migrate mode")
        ns = self.namespace("migrate")
        _say(f"  namespace {ns} is labelled draguard.io/migration-mode=migrate")
        pod_yaml = scenarios.legacy_pod(ns, **self.runs())
        # The webhook learns a new namespace's labels from its watch a moment later; wait for it.
        self.wait(
            lambda: (
                '"resourceClaimTemplateName"'
                in self.cluster.kubectl_run(
                    "apply", "--dry-run=server", "-o", "json", "-f", "-", input=pod_yaml
                ).stdout
            ),
            "the webhook to see the namespace label",
            timeout=20,
        )
        proc = self.kubectl("apply", "-f", "-", input=pod_yaml)
        self.expect(proc.returncode == 0, "pod admitted")
        pod = self.get("pod", "gpu-training-legacy", "-n", ns)
        claims = pod["spec"].get("resourceClaims") or []
        limits = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
        self.expect(bool(claims) and "nvidia.com/gpu" not in limits, "rewritten to a ResourceClaimTemplate")
        for c in claims:
            _say(f"    resourceClaims: {c.get('name')} -> template {c.get('resourceClaimTemplateName')}")
        names = self.pod_claims(ns, "gpu-training-legacy")
        results = self.show_allocation(ns, names[0]) if names else []
        self.expect(len(results) == 2, "controller-manager made the claim; scheduler allocated 2 GPUs")
        self.show_running(ns, "gpu-training-legacy")
        if self.on_real_node:
            # The real node has four A100s: free these two for the training step.
            self.kubectl("delete", "pod", "-n", ns, "gpu-training-legacy", "--wait=true", "--timeout=60s")

    def step_tiers(self) -> None:
        _say("\n== 2. GPU tiers: an LLM inference Deployment may only use H100")
        ns = self.namespace("tiers")
        for cls in (scenarios.A100, scenarios.H100):
            self.kubectl("apply", "-f", "-", input=scenarios.llm_template(ns, cls))
        a100 = scenarios.llm_deployment(ns, scenarios.A100)
        # The webhook learns of new claim templates from its watch a moment later; wait for it.
        self.wait(
            lambda: self.cluster.kubectl_run("apply", "--dry-run=server", "-f", "-", input=a100).returncode,
            "the webhook to see the new templates",
            timeout=20,
        )
        proc = self.kubectl("apply", "-f", "-", input=a100)
        self.expect(proc.returncode != 0 and "denied" in proc.stderr, "A100 Deployment denied by policy")
        proc = self.kubectl("apply", "-f", "-", input=scenarios.llm_deployment(ns, scenarios.H100))
        self.expect(proc.returncode == 0, "H100 Deployment admitted")

        def scheduled() -> list[dict[str, Any]]:
            pods = self.get("pods", "-n", ns, "-l", "app=llm-inference-h100")["items"]
            done = [p for p in pods if p["spec"].get("nodeName")]
            return done if len(done) == 2 else []

        pods = self.wait(scheduled, "2 LLM pods scheduled") or []
        for p in pods:
            _say(f"    pod {p['metadata']['name']} -> node {p['spec']['nodeName']}")
        self.expect(len(pods) == 2, "both replicas scheduled on H100 devices")

    def step_cel(self) -> None:
        _say("\n== 3. A DeviceClass with the article's CEL mistake (migProfile)")
        manifest = scenarios.mig_profile_deviceclass()
        proc = self.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest)
        self.expect(
            "[cel/unknown-attribute]" in proc.stderr, "admission warns: unknown attribute (policy mode warn)"
        )
        # Admission warnings are cut at 120 characters; the review CLI prints the whole finding.
        policies = self.cluster.state.get("policies") or str(REPO_ROOT / "policies")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "deviceclass.yaml"
            path.write_text(manifest)
            _say(f"  $ draguard review deviceclass.yaml --policies {policies}")
            review = subprocess.run(
                self.cluster.draguard_argv("review", str(path), "--policies", policies),
                capture_output=True,
                text=True,
                cwd=REPO_ROOT,
                timeout=120,
            )
        _say(_indent(review.stdout + review.stderr))
        self.expect("did you mean 'profile'" in review.stdout, "the linter suggests the published 'profile'")

    def step_quota(self) -> None:
        _say("\n== 4. Quota: 9 A100s in a team-* namespace (budget 8)")
        ns = self.namespace("quota")
        proc = self.kubectl("apply", "-f", "-", input=scenarios.big_a100_claim(ns))
        denied = proc.returncode != 0 and "quota" in proc.stderr.lower()
        self.expect(denied, "claim denied by the quota policy")

    def step_training(self) -> None:
        _say("\n== 5. 4x A100 training claim, all on one NVLink domain")
        ns = self.namespace("training")
        proc = self.kubectl("apply", "-f", "-", input=scenarios.training_claim(ns, **self.runs()))
        self.expect(proc.returncode == 0, "claim and pod admitted")
        self.pod_claims(ns, "distributed-training")
        results = self.show_allocation(ns, "training-gpu-claim")
        self.expect(len(results) == 4 and len({r["pool"] for r in results}) == 1, "4 GPUs from one node")
        self.show_running(ns, "distributed-training")

    def cleanup(self) -> None:
        names = [n for n, _ in NAMESPACES.values()]
        for n in names:
            # Simulated nodes have no kubelet to confirm shutdown: force-delete so the namespaces can go
            # and claims are freed (the real node's kubelet still stops its containers).
            self.cluster.kubectl_run("delete", "pods", "--all", "-n", n, "--force", "--grace-period=0")
        self.cluster.kubectl_run("delete", "namespace", "--ignore-not-found", "--wait=false", *names)
        self.cluster.kubectl_run(
            "delete", "deviceclass", "--ignore-not-found", "gpu.nvidia.com-a100-mig-3g20gb-typo"
        )


def run_demo(cluster: LocalCluster, keep: bool = False) -> int:
    demo = Demo(cluster)
    demo.cleanup()
    # Namespaces from an earlier run may still be terminating.
    for name, _ in NAMESPACES.values():

        def gone(n: str = name) -> bool:
            return cluster.kubectl_run("get", "namespace", n).returncode != 0

        wait_until(gone, 120, f"namespace {name} from an earlier demo to be deleted")
    t0 = time.monotonic()
    slices = demo.get("resourceslices")["items"]
    _say(f"kubeconfig: {cluster.kubeconfig}")
    nodes = ", ".join(n["name"] for n in cluster.state.get("nodes") or [])
    _say(f"nodes: {nodes}; {len(slices)} ResourceSlices")
    if cluster.real_node:
        _say(f"real node (kubelet, containerd, kube-proxy; simulated GPUs): {cluster.real_node}")
    for step in (demo.step_migrate, demo.step_tiers, demo.step_cel, demo.step_quota, demo.step_training):
        try:
            step()
        except ClusterError as exc:
            demo.expect(False, f"{step.__name__}: {exc}")
    if not keep:
        demo.cleanup()
    _say(f"\n{len(demo.failures)} of the checks failed" if demo.failures else "\nall checks passed")
    _say(f"({time.monotonic() - t0:.0f}s) The cluster keeps running: export KUBECONFIG={cluster.kubeconfig}")
    _say("Stop it with: draguard demo --down")
    return 1 if demo.failures else 0


if __name__ == "__main__":
    sys.exit(run_demo(LocalCluster()))
