"""Helpers shared by the e2e tests: the built kubectl and polling."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

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
