"""Background audit on the real cluster: existing objects judged, PolicyReports written. The audited
LLM Deployment runs on the real node, on an H100 the draguard driver prepared.

The audit runs as `draguard audit run` with the bundle's own ServiceAccount and RBAC (a token for
`draguard-audit`), so the test also shows that the shipped permissions are enough. Its periodic scan
is an hour away: policy changes bring full scans, and workload changes reach the reports through the
watches.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.helpers import Kubectl, wait_for
from webhook.dev import scenarios
from webhook.dev.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
AUDIT = REPO / "kustomize" / "base" / "audit"
AUDIT_RUN = (sys.executable, "-m", "webhook.cli", "audit", "run", "--interval", "3600",
             "--poll-interval", "0.3", "--debounce", "0.5", "--metrics-host", "127.0.0.1")  # fmt: skip
H200_ONLY = """\
apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata:
  name: llm-h200-only
spec:
  mode: {mode}
  namespaces: [{ns}]
  classes:
  - name: llm
    match:
      labelWords:
        app: [llm]
    deviceClasses: [gpu.nvidia.com-h200]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def audit_identity(cluster: LocalCluster, kubectl: Kubectl, tmp_path: Path) -> Path:
    """A kubeconfig for the bundle's draguard-audit ServiceAccount, with the bundle's CRDs and RBAC."""
    kubectl.ok("apply", "-f", str(AUDIT / "crds.yaml"))
    kubectl.ok("wait", "--for=condition=Established", "--timeout=60s",
               "crd/policyreports.wgpolicyk8s.io", "crd/clusterpolicyreports.wgpolicyk8s.io")  # fmt: skip
    if kubectl.run("get", "namespace", "draguard-system").returncode != 0:
        kubectl.ok("create", "namespace", "draguard-system")
    kubectl.ok("apply", "-f", str(AUDIT / "serviceaccount.yaml"), "-f", str(AUDIT / "rbac.yaml"))
    token = kubectl.ok("create", "token", "draguard-audit", "-n", "draguard-system", "--duration=1h").strip()
    cfg = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    for user in cfg["users"]:
        user["user"] = {"token": token}
    path = tmp_path / "audit.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def run_audit(audit_identity: Path, tmp_path: Path) -> Iterator[Callable[[Path], int]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(policies: Path) -> int:
        port = _free_port()
        log = (tmp_path / "audit.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    *AUDIT_RUN,
                    "--kubeconfig",
                    str(audit_identity),
                    "--policies",
                    str(policies),
                    "--metrics-port",
                    str(port),
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        return port

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=30)
    log = tmp_path / "audit.log"
    if log.exists():
        print(log.read_text()[-4000:])


def _report(kubectl: Kubectl, ns: str) -> dict[str, Any] | None:
    proc = kubectl.run("get", "policyreports.wgpolicyk8s.io", "draguard-audit", "-n", ns, "-o", "json")
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _entries(rep: dict[str, Any] | None, name: str) -> list[tuple[str, str]]:
    if rep is None:
        return []
    return sorted(
        (r["result"], r["rule"])
        for r in rep.get("results", [])
        if any(res.get("name") == name for res in r.get("resources", []))
    )


def _wait_entries(
    kubectl: Kubectl, ns: str, name: str, want: list[tuple[str, str]], what: str, timeout: float = 90
) -> Any:
    """The namespace's report once `name`'s entries are `want`."""

    def check() -> dict[str, Any] | None:
        rep = _report(kubectl, ns)
        return rep if rep is not None and _entries(rep, name) == want else None

    return wait_for(check, what, timeout=timeout)


def _write_policy(policies: Path, text: str) -> None:
    """One change as the audit sees it (as a ConfigMap update swaps a link): write aside, then rename."""
    aside = policies.parent / "llm-h200.yaml.new"
    aside.write_text(text)
    os.replace(aside, policies / "llm-h200.yaml")


def _metrics(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The audit's /metrics: sample name -> sorted labels -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _violations(port: int) -> dict[tuple[str, str], float]:
    got = _metrics(port).get("draguard_audit_violations", {})
    return {(dict(k)["rule"], dict(k)["result"]): v for k, v in got.items()}


def test_audit_reports_follow_policies_and_deletions(
    kubectl: Kubectl,
    namespace: Callable[..., str],
    run_audit: Callable[[Path], int],
    h100_real_node: str,
    workload_image: str,
    tmp_path: Path,
) -> None:
    ns = namespace("audit")
    assert kubectl.apply(scenarios.llm_template(ns, scenarios.H100)).returncode == 0
    dep = scenarios.llm_deployment(
        ns, scenarios.H100, replicas=1, image=workload_image, node=h100_real_node, command="exec sleep 3600"
    )
    # Admitted under today's policies (the webhook resolves the template from its watch cache).
    wait_for(lambda: kubectl.run("apply", "--dry-run=server", "-f", "-", input=dep).returncode == 0,
             "the webhook to know the new claim template", timeout=30)  # fmt: skip
    made = kubectl.apply(dep)
    assert made.returncode == 0, made.stderr
    name = "llm-inference-h100"

    def running() -> dict[str, Any] | None:
        pods = kubectl.items("pods", ns, "-l", "app=llm-inference-h100")
        return pods[0] if len(pods) == 1 and pods[0]["status"].get("phase") == "Running" else None

    # The workload the audit judges really runs: on the real node, on the H100 its claim holds.
    pod = wait_for(running, "the LLM pod Running on the real node", timeout=180)
    assert pod["spec"]["nodeName"] == h100_real_node

    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies, ignore=shutil.ignore_patterns("tests"))
    port = run_audit(policies)

    # Under the shipped policies the Deployment (H100 for an LLM) passes.
    rep = _wait_entries(
        kubectl, ns, name, [("pass", "all")], "the Deployment to pass in its namespace's report"
    )
    assert rep["summary"]["fail"] == 0
    assert _entries(rep, "llm-h100") == [("pass", "all")]  # the ResourceClaimTemplate
    [entry] = [r for r in rep["results"] if r["resources"][0]["name"] == name]
    assert entry["resources"][0]["kind"] == "Deployment"
    assert entry["resources"][0]["uid"] == kubectl.get("deployment", name, ns)["metadata"]["uid"]
    # Its ReplicaSet and pod are judged through the Deployment, not reported again.
    kinds = {res["kind"] for r in rep["results"] for res in r["resources"]}
    assert kinds == {"Deployment", "ResourceClaimTemplate"}, kinds
    cluster_rep = json.loads(
        kubectl.ok("get", "clusterpolicyreports.wgpolicyk8s.io", "draguard-audit", "-ojson")
    )
    assert {r["resources"][0]["kind"] for r in cluster_rep["results"]} == {"DeviceClass"}

    # A stricter policy appears: the Deployment admitted before it existed now fails.
    _write_policy(policies, H200_ONLY.format(mode="enforce", ns=ns))
    rule = "tier/llm-h200-only"
    rep = _wait_entries(kubectl, ns, name, [("fail", rule)], "the Deployment to fail the new policy")
    [entry] = [r for r in rep["results"] if r["resources"][0]["name"] == name]
    assert entry["policy"] == "llm-h200-only" and entry["severity"] == "high"
    assert "gpu.nvidia.com-h100" in entry["message"] and entry["properties"]["mode"] == "enforce"
    assert rep["summary"]["fail"] == 1
    wait_for(lambda: _violations(port).get((rule, "fail")) == 1.0, "the violation in the metrics", timeout=30)

    # A Deployment created now (admitted: the cluster's webhook runs the shipped policies) is judged
    # within seconds by the audit's stricter set, through the Deployment watch.
    late = "llm-late-h100"
    made = kubectl.apply(dep.replace(name, late))
    assert made.returncode == 0, made.stderr
    _wait_entries(kubectl, ns, late, [("fail", rule)], "the new Deployment to fail", timeout=30)
    kubectl.ok("delete", "deployment", late, "-n", ns, "--wait=true")
    _wait_entries(kubectl, ns, late, [], "the new Deployment's entry to go", timeout=30)

    # The policy is relaxed to warn: the entry follows.
    _write_policy(policies, H200_ONLY.format(mode="warn", ns=ns))
    _wait_entries(kubectl, ns, name, [("warn", rule)], "the entry to become a warning")
    assert _metrics(port)["draguard_audit_policy_reloads_total"][(("outcome", "ok"),)] == 3.0

    # Deleting the workload clears its entry (the watch, not a scan); the template's stays.
    kubectl.ok("delete", "deployment", name, "-n", ns, "--wait=true")
    rep = _wait_entries(kubectl, ns, name, [], "the deleted Deployment's entry to go", timeout=30)
    assert _entries(rep, "llm-h100") == [("pass", "all")]
    assert rep["summary"] == {"pass": 1, "fail": 0, "warn": 0, "error": 0, "skip": 0}, [
        (r["resources"][0]["kind"], r["resources"][0]["name"], r["result"]) for r in rep["results"]
    ]
    wait_for(
        lambda: not any(r == rule for r, _ in _violations(port)),
        "the violation to leave the metrics",
        timeout=30,
    )
    # A rescan publishes its violations before it counts itself: wait for the count.
    wait_for(
        lambda: _metrics(port)["draguard_audit_namespace_scans_total"][(("outcome", "ok"),)] >= 3,
        "the third namespace rescan to be counted",
        timeout=10,
    )
    metrics = _metrics(port)
    # Full scans: at start and at the two policy changes; the workload changes came through watches.
    # A device published or withdrawn meanwhile (another node's driver) asks for one more each.
    events = metrics.get("draguard_audit_watch_events_total", {})
    inventory_changes = sum(
        events.get((("resource", r), ("what", "change")), 0.0) for r in ("resourceslices", "deviceclasses")
    )
    assert 3.0 <= metrics["draguard_audit_scans_total"][(("outcome", "ok"),)] <= 3.0 + inventory_changes
