"""Coexistence pre-flight: does NVIDIA's device plugin or NVIDIA's DRA driver serve the GPUs that
draguard's driver would serve?

Pure: objects in (as `kubectl get nodes,daemonsets,resourceslices,deviceclasses -A -o yaml` prints
them), findings out. `draguard preflight` reads the objects; other commands may call `preflight`.
Running next to either lets two pods be given one GPU: NVIDIA's DRA driver uses the same driver name
(`gpu.nvidia.com`), the device plugin hands the same GPUs out as `nvidia.com/gpu`. The driver refuses
such a node at start (driver/coexist.py); this check tells the operator before the install.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..core.findings import Finding, Mode, ObjectRef, Severity

DRIVER_NAME = "gpu.nvidia.com"
MANAGED_BY = ("app.kubernetes.io/managed-by", "draguard")
DEVICE_PLUGIN_RESOURCE = "nvidia.com/gpu"
# Image names of NVIDIA's components (any registry, any tag).
DEVICE_PLUGIN_IMAGES = ("k8s-device-plugin", "nvidia-gpu-device-plugin")
DRA_DRIVER_IMAGES = ("k8s-dra-driver-gpu", "k8s-dra-driver")
# DeviceClasses NVIDIA's DRA driver chart creates (draguard's are gpu.nvidia.com-<model>).
NVIDIA_DEVICE_CLASSES = frozenset({"gpu.nvidia.com", "mig.nvidia.com"})
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
GKE_NO_DEVICE_PLUGIN = "gke-no-default-nvidia-gpu-device-plugin"

FIX_DEVICE_PLUGIN = (
    "turn the device plugin off on the GPU nodes draguard serves: GPU Operator devicePlugin.enabled=false, "
    "the nvidia-device-plugin chart uninstalled or its DaemonSet kept off those nodes; GKE: node pools "
    "with gpu-driver-version=disabled and the label gke-no-default-nvidia-gpu-device-plugin=true; EKS: "
    "the AMI's or eksctl's device plugin removed (docs/install.md, \"Coexistence\")"
)
FIX_DRA_DRIVER = (
    "uninstall NVIDIA's DRA driver (helm uninstall) or keep its kubelet plugin off the nodes draguard "
    "serves; EKS Auto Mode bundles it: use managed node groups for draguard's GPU nodes "
    "(docs/install.md, \"Coexistence\")"
)


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _items(objects: Iterable[Any]) -> Iterable[Mapping[str, Any]]:
    for o in objects:
        if not isinstance(o, Mapping):
            continue
        kind = o.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and isinstance(o.get("items"), list):
            yield from _items(o["items"])
        else:
            yield o


def _ref(o: Mapping[str, Any]) -> ObjectRef:
    meta = _map(o.get("metadata"))
    ns = meta.get("namespace")
    return ObjectRef(
        api_version=str(o.get("apiVersion") or ""),
        kind=str(o.get("kind") or ""),
        namespace=ns if isinstance(ns, str) else None,
        name=str(meta.get("name") or ""),
    )


def _finding(o: Mapping[str, Any], rule: str, severity: Severity, message: str, fix: str) -> Finding:
    return Finding(rule=rule, severity=severity, mode=Mode.ENFORCE, object=_ref(o), message=message, fix=fix)


def _gpus(node: Mapping[str, Any]) -> str | None:
    status = _map(node.get("status"))
    for field in ("capacity", "allocatable"):
        n = _map(status.get(field)).get(DEVICE_PLUGIN_RESOURCE)
        if n not in (None, "0", 0):
            return str(n)
    return None


def _images(ds: Mapping[str, Any]) -> list[str]:
    spec = _map(_map(_map(ds.get("spec")).get("template")).get("spec"))
    out = []
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            image = _map(c).get("image")
            if isinstance(image, str):
                out.append(image)
    return out


def _image_is(image: str, names: tuple[str, ...]) -> bool:
    repo = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    return repo in names


def preflight(objects: Iterable[Any]) -> list[Finding]:
    """Findings about NVIDIA's device plugin and DRA driver: errors where they serve GPUs now,
    warnings where they are installed or a GKE GPU node pool would start the device plugin."""
    out: list[Finding] = []
    for o in _items(objects):
        kind, meta = o.get("kind"), _map(o.get("metadata"))
        name = str(meta.get("name") or "")
        labels = _map(meta.get("labels"))
        if kind == "Node":
            gpus = _gpus(o)
            if gpus is not None:
                out.append(_finding(
                    o, "coexist/device-plugin", Severity.ERROR,
                    f"node {name} offers {DEVICE_PLUGIN_RESOURCE}={gpus}: the NVIDIA device plugin hands "
                    "out its GPUs, and draguard's driver would hand out the same ones",
                    FIX_DEVICE_PLUGIN,
                ))  # fmt: skip
            elif GKE_ACCELERATOR in labels and labels.get(GKE_NO_DEVICE_PLUGIN) != "true":
                out.append(_finding(
                    o, "coexist/gke-node-pool", Severity.WARNING,
                    f"GKE GPU node {name} has no label {GKE_NO_DEVICE_PLUGIN}=true: GKE starts its own "
                    "device plugin there",
                    FIX_DEVICE_PLUGIN,
                ))  # fmt: skip
        elif kind == "DaemonSet":
            images = _images(o)
            if any(_image_is(i, DEVICE_PLUGIN_IMAGES) for i in images):
                out.append(_finding(
                    o, "coexist/device-plugin", Severity.WARNING,
                    f"DaemonSet {meta.get('namespace')}/{name} runs the NVIDIA device plugin; on the GPU "
                    "nodes it reaches, draguard's driver refuses to start",
                    FIX_DEVICE_PLUGIN,
                ))  # fmt: skip
            elif any(_image_is(i, DRA_DRIVER_IMAGES) for i in images):
                out.append(_finding(
                    o, "coexist/nvidia-dra-driver", Severity.WARNING,
                    f"DaemonSet {meta.get('namespace')}/{name} runs NVIDIA's DRA driver, which uses the "
                    f"same driver name ({DRIVER_NAME}) as draguard's",
                    FIX_DRA_DRIVER,
                ))  # fmt: skip
        elif kind == "ResourceSlice":
            spec = _map(o.get("spec"))
            if spec.get("driver") == DRIVER_NAME and labels.get(MANAGED_BY[0]) != MANAGED_BY[1]:
                node = spec.get("nodeName") or "(no node)"
                out.append(_finding(
                    o, "coexist/nvidia-dra-driver", Severity.ERROR,
                    f"ResourceSlice {name} of driver {DRIVER_NAME} on node {node} was not written by "
                    "draguard: NVIDIA's DRA driver serves that node's GPUs",
                    FIX_DRA_DRIVER,
                ))  # fmt: skip
        elif kind == "DeviceClass" and name in NVIDIA_DEVICE_CLASSES:
            out.append(_finding(
                o, "coexist/nvidia-dra-driver", Severity.WARNING,
                f"DeviceClass {name} is NVIDIA's DRA driver's (draguard's classes are {DRIVER_NAME}-<model>)",
                FIX_DRA_DRIVER,
            ))  # fmt: skip
    return out
