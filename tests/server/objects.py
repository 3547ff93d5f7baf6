"""Objects of every kind the webhook checks, built around one pod spec."""

from __future__ import annotations

import copy
from typing import Any

# kind -> (group, version)
WORKLOADS: dict[str, tuple[str, str]] = {
    "Pod": ("", "v1"),
    "PodTemplate": ("", "v1"),
    "ReplicationController": ("", "v1"),
    "Deployment": ("apps", "v1"),
    "ReplicaSet": ("apps", "v1"),
    "StatefulSet": ("apps", "v1"),
    "DaemonSet": ("apps", "v1"),
    "Job": ("batch", "v1"),
    "CronJob": ("batch", "v1"),
}
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")


def legacy_pod_spec() -> dict[str, Any]:
    return {
        "containers": [
            {
                "name": "trainer",
                "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}, "requests": {"cpu": "1"}},
            }
        ]
    }


def tier_pod_spec() -> dict[str, Any]:
    return {
        "containers": [
            {
                "name": "server",
                "image": "example.com/llm-server:1",
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-a100"}],
    }


def workload(
    kind: str, spec: dict[str, Any], labels: dict[str, str] | None = None, name: str = "w"
) -> dict[str, Any]:
    group, version = WORKLOADS[kind]
    api = f"{group}/{version}" if group else version
    labels = labels or {}
    tmeta: dict[str, Any] = {"labels": {"app": name, **labels}}
    template = {"metadata": tmeta, "spec": copy.deepcopy(spec)}
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "labels": dict(labels)}
    obj: dict[str, Any] = {"apiVersion": api, "kind": kind, "metadata": meta}
    sel = {"matchLabels": {"app": name}}
    if kind == "Pod":
        obj["spec"] = template["spec"]
        meta["labels"] = {"app": name, **labels}
    elif kind == "PodTemplate":
        obj["template"] = template
    elif kind == "ReplicationController":
        obj["spec"] = {"replicas": 1, "selector": {"app": name}, "template": template}
    elif kind in ("Deployment", "ReplicaSet", "StatefulSet"):
        obj["spec"] = {"replicas": 2, "selector": sel, "template": template}
        if kind == "StatefulSet":
            obj["spec"]["serviceName"] = name
    elif kind == "DaemonSet":
        obj["spec"] = {"selector": sel, "template": template}
    elif kind == "Job":
        template["spec"]["restartPolicy"] = "Never"
        obj["spec"] = {"template": template}
    elif kind == "CronJob":
        template["spec"]["restartPolicy"] = "Never"
        obj["spec"] = {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": template}}}
    return obj


def request(version: str, cls: str, expression: str | None = None, count: int = 1) -> dict[str, Any]:
    exact: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if expression is not None:
        exact["selectors"] = [{"cel": {"expression": expression}}]
    if version == "v1beta1":
        return {"name": "gpu", **exact}
    return {"name": "gpu", "exactly": exact}


def dra_object(kind: str, version: str, expression: str | None = None, name: str = "c") -> dict[str, Any]:
    api = f"resource.k8s.io/{version}"
    if kind == "DeviceClass":
        spec: dict[str, Any] = {
            "selectors": [{"cel": {"expression": expression or "device.driver == 'gpu.nvidia.com'"}}]
        }
        return {"apiVersion": api, "kind": kind, "metadata": {"name": name}, "spec": spec}
    claim = {"devices": {"requests": [request(version, "gpu.nvidia.com-a100", expression)]}}
    if kind == "ResourceClaim":
        return {
            "apiVersion": api,
            "kind": kind,
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": claim,
        }
    return {
        "apiVersion": api,
        "kind": kind,
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"spec": claim},
    }


BAD_CEL = "device.attributes['gpu.nvidia.com'].productName == "
NO_MATCH_CEL = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'"
