"""Simulated GPU Nodes: Node objects that stay Ready without a kubelet.

These nodes have no kubelet (the local cluster's one real node does).  They are created
through the API with a Ready condition, and a small heartbeat process renews their Leases
and the condition's heartbeat time, as a kubelet would, so the node-lifecycle controller and
anything else that watches node health sees live nodes.  Pods bound to these nodes never run;
they give the scheduler more nodes to choose from than one machine can run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from .kube import ApiError, Kube

LEASE_SECONDS = 40
HEARTBEAT_SECONDS = 10.0


@dataclass(frozen=True)
class SimNode:
    """One simulated node and the topology its driver publishes."""

    name: str
    topology: str
    labels: dict[str, str] = field(default_factory=dict)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _conditions() -> list[dict[str, str]]:
    now = _now()
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "simulated node (draguard dev)",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    healthy = [
        {
            "type": t,
            "status": "False",
            "reason": f"KubeletHas{reason}",
            "message": "simulated",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for t, reason in (
            ("MemoryPressure", "SufficientMemory"),
            ("DiskPressure", "NoDiskPressure"),
            ("PIDPressure", "SufficientPID"),
        )
    ]
    return [ready, *healthy]


def node_object(node: SimNode) -> dict[str, Any]:
    """The Node as a kubelet would register it, with generous CPU/memory so GPUs decide placement."""
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "draguard.io/simulated": "true",
        "nvidia.com/gpu.present": "true",
        **node.labels,
    }
    resources = {"cpu": "96", "memory": "1024Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": _conditions(),
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": node.name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "simulated",
                "containerRuntimeVersion": "none://simulated",
                "kernelVersion": "",
                "osImage": "draguard simulated node",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kubeProxyVersion": "",
            },
        },
    }


def register_nodes(kube: Kube, nodes: Sequence[SimNode]) -> None:
    """Create the Nodes (idempotent) and mark them Ready."""
    for node in nodes:
        obj = node_object(node)
        kube.create("/api/v1/nodes", {k: v for k, v in obj.items() if k != "status"})
        # status is a subresource: a create ignores it, so it is written separately.
        kube.merge_patch(f"/api/v1/nodes/{node.name}/status", {"status": obj["status"]})
        # The TaintNodesByCondition admission plugin gives every new Node a not-ready:NoSchedule
        # taint, which the node-lifecycle controller would lift once the node reports Ready; that
        # controller is off here (nothing renews node health the way it expects), so lift it now.
        current = kube.get(f"/api/v1/nodes/{node.name}").get("spec", {}).get("taints") or []
        kept = [t for t in current if not t.get("key", "").startswith("node.kubernetes.io/")]
        if kept != current:
            kube.merge_patch(f"/api/v1/nodes/{node.name}", {"spec": {"taints": kept or None}})
    heartbeat(kube, [n.name for n in nodes])


def heartbeat(kube: Kube, names: Sequence[str]) -> None:
    """Renew every node's Lease and Ready condition once."""
    for name in names:
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": _micro_now(),
        }
        try:
            kube.merge_patch(lease_path, {"spec": spec})
        except ApiError as exc:
            if exc.status != 404:
                raise
            kube.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": name, "namespace": "kube-node-lease"},
                    "spec": spec,
                },
            )
        now = _now()
        node = kube.get(f"/api/v1/nodes/{name}")
        conds = node.get("status", {}).get("conditions") or _conditions()
        for c in conds:
            c["lastHeartbeatTime"] = now
            if c["type"] == "Ready" and c.get("status") != "True":
                c.update(status="True", reason="KubeletReady", lastTransitionTime=now)
        kube.merge_patch(f"/api/v1/nodes/{name}/status", {"status": {"conditions": conds}})


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m webhook.dev.nodes --server URL --ca F --cert F --key F NODE...`: heartbeat loop."""
    p = argparse.ArgumentParser(prog="python -m webhook.dev.nodes")
    p.add_argument("--server", required=True)
    p.add_argument("--ca", required=True, type=Path)
    p.add_argument("--cert", required=True, type=Path)
    p.add_argument("--key", required=True, type=Path)
    p.add_argument("--interval", type=float, default=HEARTBEAT_SECONDS)
    p.add_argument("nodes", nargs="+")
    args = p.parse_args(argv)
    kube = Kube(args.server, args.ca, args.cert, args.key)
    stop = False

    def _stop(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop:
        try:
            heartbeat(kube, args.nodes)
        except (ApiError, OSError) as exc:
            # The API server may be restarting; keep trying rather than letting nodes go stale.
            print(f"heartbeat: {exc}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + args.interval
        while not stop and time.monotonic() < deadline:
            time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
