"""Refuse to serve a node that another GPU driver already serves.

NVIDIA's DRA driver uses the same driver name (`gpu.nvidia.com`) and CDI kind as this one, and the
NVIDIA device plugin hands out the same GPUs as `nvidia.com/gpu`; running next to either would let
two pods get one GPU. Signs looked for, through the API server: ResourceSlices of this driver name
on this node that draguard did not write, and a node capacity of `nvidia.com/gpu`. When one is
found the driver publishes and prepares nothing, logs what to do, and records a Warning Event on
the Node (the only write besides its own slices that the bundle's admission policy allows it).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from .kube import KubeHTTPError
from .kube import request as kube_request

log = logging.getLogger("draguard.driver.coexist")

MANAGED_BY = ("app.kubernetes.io/managed-by", "draguard")
DEVICE_PLUGIN_RESOURCE = "nvidia.com/gpu"
EVENT_REASON = "ConflictingGPUDriver"
ADVICE = (
    "turn the other one off on this node: uninstall NVIDIA's DRA driver (helm uninstall) or label the "
    "node out of its DaemonSet; for the device plugin, GPU Operator: devicePlugin.enabled=false; GKE: "
    "create the node pool with gpu-driver-version=disabled and without the default device plugin "
    "(docs/install.md); then restart this pod"
)


def find_conflicts(api: Any, node_name: str, driver_name: str, version: str) -> list[str]:
    """What else serves this node's GPUs (empty: nothing)."""
    found: list[str] = []
    path = f"/apis/resource.k8s.io/{version}/resourceslices"
    data = kube_request(api, "GET", path, query=[("fieldSelector", f"spec.nodeName={node_name}")]) or {}
    for s in data.get("items") or []:
        meta, spec = s.get("metadata") or {}, s.get("spec") or {}
        if spec.get("driver") != driver_name:
            continue
        if (meta.get("labels") or {}).get(MANAGED_BY[0]) != MANAGED_BY[1]:
            found.append(
                f"ResourceSlice {meta.get('name')} of driver {driver_name} on node {node_name} was not "
                "written by draguard (NVIDIA's DRA driver runs on this node)"
            )
    node = kube_request(api, "GET", f"/api/v1/nodes/{node_name}") or {}
    capacity = ((node.get("status") or {}).get("capacity") or {}).get(DEVICE_PLUGIN_RESOURCE)
    if capacity not in (None, "0"):
        found.append(
            f"node {node_name} has capacity {DEVICE_PLUGIN_RESOURCE}={capacity} (the NVIDIA device plugin "
            "hands out these GPUs)"
        )
    return found


def report(api: Any, node_name: str, conflicts: list[str]) -> None:
    """Log the refusal and record it as a Warning Event on the Node (best effort)."""
    text = "; ".join(conflicts)
    log.error("refusing to serve GPUs on node %s: %s. To use draguard's driver here, %s",
              node_name, text, ADVICE)  # fmt: skip
    try:
        node = kube_request(api, "GET", f"/api/v1/nodes/{node_name}") or {}
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        event = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"generateName": "draguard-driver-", "namespace": "default"},
            "eventTime": now,
            "reportingController": "draguard.io/driver",
            "reportingInstance": f"draguard-driver-{node_name}"[:128],
            "action": "Refuse",
            "reason": EVENT_REASON,
            "type": "Warning",
            "note": f"draguard's GPU driver is not serving this node: {text}. {ADVICE}"[:1024],
            "regarding": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node_name,
                "uid": (node.get("metadata") or {}).get("uid", ""),
            },
        }
        kube_request(api, "POST", "/apis/events.k8s.io/v1/namespaces/default/events", event)
    except (KubeHTTPError, OSError) as exc:
        log.warning("could not record the Node event: %s", exc)
