"""Shared fixtures: policy directories, the seed inventory, AdmissionReview bodies, certificates."""

from __future__ import annotations

import argparse
import copy
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.dra.inventory import Inventory
from webhook.server import commands
from webhook.server.app import ServeOptions, Webhook

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "tests" / "fixtures" / "seed"

TIER = """
apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata: {name: gpu-tiers}
spec:
  mode: MODE
  classes:
  - name: llm
    match:
      labels: {draguard.io/workload-class: llm}
    deviceClasses: [gpu.nvidia.com-h100]
"""
CEL = """
apiVersion: policy.draguard.io/v1alpha1
kind: CelLintPolicy
metadata: {name: cel-lint}
spec:
  mode: MODE
  checks:
    cel/syntax: {mode: MODE}
    cel/no-match: {mode: MODE}
"""
MIGRATION = """
apiVersion: policy.draguard.io/v1alpha1
kind: MigrationPolicy
metadata: {name: legacy-gpu}
spec:
  defaultMode: warn
  strategy: claim-template
  claimApiVersion: resource.k8s.io/v1
  mappings:
  - resource: nvidia.com/gpu
    deviceClass: gpu.nvidia.com-a100
"""


QUOTA = """
apiVersion: policy.draguard.io/v1alpha1
kind: GpuQuotaPolicy
metadata: {name: budgets}
spec:
  mode: MODE
  budgets:
  - namespace: team-a
    deviceClasses: {gpu.nvidia.com-a100: 1}
"""


def write_policies(directory: Path, mode: str = "enforce", quota: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if quota:
        (directory / "quota.yaml").write_text(QUOTA.replace("MODE", mode))
    (directory / "tier.yaml").write_text(TIER.replace("MODE", mode))
    (directory / "cel.yaml").write_text(CEL.replace("MODE", mode))
    (directory / "migration.yaml").write_text(MIGRATION)
    return directory


def seed_inventory() -> Inventory:
    objs: list[Any] = list(yaml.safe_load_all((SEED / "cluster-inventory.yaml").read_text()))
    objs += list(yaml.safe_load_all((SEED / "deviceclasses.yaml").read_text()))
    # A template in the cluster that LLM workloads reference (A100: outside the llm tier).
    objs.append(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-a100", "namespace": "team-a"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-a100"}}]
                    }
                }
            },
        }
    )
    return Inventory.from_objects(o for o in objs if o)


class RecordingCreator:
    """Stands in for the API server's create call on the mutate path (the only write it makes)."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.made: list[Mapping[str, Any]] = []
        self.fail = fail

    def ensure(self, tmpl: Mapping[str, Any], timeout: float) -> str:
        if self.fail is not None:
            raise self.fail
        self.made.append(copy.deepcopy(dict(tmpl)))
        return "created"


def make_webhook(
    policies: Path, creator: Any = None, labels: Mapping[str, Mapping[str, str]] | None = None
) -> Webhook:
    wh = Webhook(ServeOptions(policies=str(policies), no_watch=True, poll_interval=0.1), creator=creator)
    assert wh.load_policies(first=True), wh.watcher.last_error
    wh.set_inventory(seed_inventory())
    wh.caches_synced = True
    if labels is not None:
        from dataclasses import replace

        wh.snapshot = replace(wh.snapshot, namespace_labels=labels)
    return wh


def review(
    obj: Mapping[str, Any] | None,
    *,
    group: str = "",
    version: str = "v1",
    kind: str = "Pod",
    namespace: str = "team-a",
    operation: str = "CREATE",
    uid: str = "0b8e3f3c-1111-4a5e-9e1a-3c6f0d2a7b01",
    dry_run: bool = False,
    sub_resource: str | None = None,
) -> dict[str, Any]:
    req: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "alice"},
        "object": obj,
        "oldObject": None,
        "dryRun": dry_run,
    }
    if obj is not None:
        meta = obj.get("metadata")
        req["name"] = meta.get("name") if isinstance(meta, dict) else None
    if sub_resource:
        req["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def run_cli(argv: list[str]) -> int:
    """Run one of this package's `draguard` subcommands in-process."""
    parser = argparse.ArgumentParser(prog="draguard")
    commands.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return int(args.func(args))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def policy_dir(tmp_path: Path) -> Callable[[str], Path]:
    def make(mode: str = "enforce") -> Path:
        return write_policies(tmp_path / f"policies-{mode}", mode)

    return make


@pytest.fixture
def cert_dir(tmp_path: Path) -> Path:
    out = tmp_path / "tls"
    assert (
        run_cli(["certs", "--out-dir", str(out), "--extra-san", "127.0.0.1", "--extra-san", "localhost"]) == 0
    )
    return out
