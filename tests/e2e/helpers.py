"""Helpers shared by the e2e tests: the built kubectl, polling, and pods on the real node."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from webhook.dev import scenarios
from webhook.dev.cluster import ClusterError, LocalCluster, wait_until


@dataclass
class Kubectl:
    """The built kubectl against the session cluster."""

    cluster: LocalCluster

    def run(self, *args: str, input: str | None = None) -> Any:
        return self.cluster.kubectl_run(*args, input=input)

    def apply(self, manifest: str, *extra: str) -> Any:
        """`kubectl apply -f -`; returns the CompletedProcess (callers assert on rc and stderr)."""
        return self.run("apply", "-f", "-", *extra, input=manifest)

    def ok(self, *args: str, input: str | None = None) -> str:
        proc = self.run(*args, input=input)
        assert proc.returncode == 0, f"kubectl {' '.join(args)} failed:\n{proc.stderr}"
        return str(proc.stdout)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        ns = ["-n", namespace] if namespace else []
        return dict(json.loads(self.ok("get", kind, name, *ns, "-o", "json")))

    def items(self, kind: str, namespace: str | None = None, *selector: str) -> list[dict[str, Any]]:
        ns = ["-n", namespace] if namespace else ["--all-namespaces"]
        return list(json.loads(self.ok("get", kind, *ns, *selector, "-o", "json"))["items"])


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll until `check` returns something truthy (assertion-friendly wrapper of wait_until)."""

    def attempt() -> Any:
        try:
            return check()
        except AssertionError:  # e.g. kubectl get of an object that does not exist yet
            return None

    try:
        return wait_until(attempt, timeout, what, interval=0.3)
    except ClusterError as exc:
        pytest.fail(str(exc), pytrace=False)


def running_pod(kubectl: Kubectl, ns: str, name: str, timeout: float = 90.0) -> dict[str, Any]:
    """Wait until the pod is Running; a pod that ended (Failed/Succeeded) fails at once with its status."""

    def check() -> dict[str, Any] | None:
        pod = kubectl.get("pod", name, ns)
        phase = pod["status"].get("phase")
        assert phase not in ("Failed", "Succeeded"), json.dumps(pod["status"], indent=1)
        return pod if phase == "Running" else None

    return dict(wait_for(check, f"pod {ns}/{name} Running", timeout=timeout))


def start_claim_pod(
    kubectl: Kubectl, ns: str, name: str, device_class: str, count: int, image: str, node: str,
    command: str = scenarios.SHOW_GPUS, timeout: float = 120.0,
) -> dict[str, Any]:  # fmt: skip
    """Apply scenarios.claim_pod (claim `<name>-gpu`) and wait for the pod to run; returns the pod."""
    applied = kubectl.apply(scenarios.claim_pod(ns, name, device_class, count, image, node, command))
    assert applied.returncode == 0, applied.stderr
    return running_pod(kubectl, ns, name, timeout)


def exec_in(kubectl: Kubectl, ns: str, pod: str, script: str) -> str:
    return kubectl.ok("exec", "-n", ns, pod, "--", "sh", "-c", script)


def published_devices(kubectl: Kubectl, node: str) -> dict[str, dict[str, Any]]:
    """The devices of the node's ResourceSlices, by name."""
    slices = kubectl.items("resourceslices", None, "--field-selector", f"spec.nodeName={node}")
    # A slice may hold only counter sets (partitionable devices): it has no devices.
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def claim_uid(kubectl: Kubectl, ns: str, claim: str) -> str:
    return str(kubectl.get("resourceclaim", claim, ns)["metadata"]["uid"])


def allocated_devices(kubectl: Kubectl, ns: str, claim: str) -> list[str]:
    results = kubectl.get("resourceclaim", claim, ns)["status"]["allocation"]["devices"]["results"]
    return [str(r["device"]) for r in results]


def cdi_specs_for(cluster: LocalCluster, uid: str) -> list[Path]:
    """The real node's CDI spec files of one claim (containerd's CDI directory)."""
    return [p for p in cluster.containerd_paths().cdi.glob("*.json") if uid in p.name]
