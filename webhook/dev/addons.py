"""draguard's own parts in the local cluster: one driver per node and the host-run webhook."""

from __future__ import annotations

import base64
import json
import re
import ssl
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import PREFIX
from .procs import REPO_ROOT, free_port

if TYPE_CHECKING:
    from .cluster import LocalCluster

# Server-side apply manager of what the harness registers; applying with it again replaces the fields.
FIELD_MANAGER = "draguard-dev"
DRIVER_NAME = "gpu.nvidia.com"


@dataclass(frozen=True)
class DriverDirs:
    """Where one node's driver keeps its sockets, checkpoint and CDI specs."""

    plugins: Path
    registry: Path
    cdi: Path


def draguard_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", f"{PREFIX}webhook.cli", *args]


def topology_path(topology: str) -> Path:
    topo = Path(topology)
    return topo if topo.is_absolute() else REPO_ROOT / "driver" / "sim" / "topologies" / topology


def nvml_events_path(cluster: LocalCluster, node: str) -> Path:
    """The JSON-lines file the node's simulated NVML reads XID and lost-GPU events from.

    Append `{"uuid": U, "xid": N}` or `{"lost": U}` lines; the driver reads the whole file again
    when it restarts, so truncate it first to start healthy.
    """
    return cluster.paths.root / "nvml-events" / f"{node}.jsonl"


def start_driver(
    cluster: LocalCluster, node: str, topology: str, dirs: DriverDirs, timeout: float,
    args: Sequence[str] = (), env: Mapping[str, str] | None = None,
) -> None:  # fmt: skip
    """A simulated-NVML driver for `node`; waits until it has published its ResourceSlices.

    `args` are added to `draguard driver run` (a sharing mode), `env` to its environment (fault points,
    the simulated NVML's MIG state file).
    """
    for d in (dirs.plugins, dirs.registry, dirs.cdi):
        d.mkdir(parents=True, exist_ok=True)
    events = nvml_events_path(cluster, node)
    events.parent.mkdir(parents=True, exist_ok=True)
    events.touch()
    name = f"driver-{node}"
    cluster.spawn(
        name,
        draguard_argv(
            "driver", "run",
            "--node-name", node,
            "--sim", str(topology_path(topology)),
            "--kubeconfig", str(cluster.kubeconfig),
            "--plugin-dir", str(dirs.plugins),
            "--registry-dir", str(dirs.registry),
            "--cdi-root", str(dirs.cdi),
            "--metrics-port", "0",
            *args,
        ),
        env={"PYTHONPATH": str(REPO_ROOT), "DRAGUARD_NVML_SIM_EVENTS": str(events), **(env or {})},
    )  # fmt: skip
    kube = cluster.kube()
    path = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{node}"

    def published() -> bool:
        return bool(kube.get(path).get("items"))

    took = cluster.wait(name, published, timeout)
    cluster.progress(f"driver on {node} ({topology}) published its ResourceSlices ({took:.1f}s)")


def start_webhook(cluster: LocalCluster, policies: Path, timeout: float) -> None:
    """Run `draguard serve` on loopback and register it with the API server by URL."""
    c = cluster.paths.certs
    port = free_port()
    cluster.state["ports"]["webhook"] = port
    cluster.spawn(
        "webhook",
        draguard_argv(
            "serve",
            "--host", "127.0.0.1",
            "--port", str(port),
            "--tls-cert", str(c / "webhook.crt"),
            "--tls-key", str(c / "webhook.key"),
            "--policies", str(policies),
            "--kubeconfig", str(cluster.kubeconfig),
        ),
        env={"PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(c / "webhook-ca.crt"))

    def ready() -> bool:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=2) as r:
            return bool(r.status == 200)

    took = cluster.wait("webhook", ready, timeout)
    cluster.progress(f"webhook serving on https://127.0.0.1:{port} ({took:.1f}s)")
    cluster.state["policies"] = str(policies)
    cluster._save_state()
    source = register_webhook(cluster, port)
    cluster.progress(f"webhook configurations registered ({source})")


def webhook_ca_bundle(cluster: LocalCluster) -> str:
    return base64.b64encode((cluster.paths.certs / "webhook-ca.crt").read_bytes()).decode()


def webhook_objects(cluster: LocalCluster, port: int) -> tuple[list[dict[str, Any]], str]:
    """Namespace, DeviceClasses and webhook configurations of the local overlay, aimed at `port`."""
    import yaml

    overlay = REPO_ROOT / "kustomize" / "overlays" / "local"
    if not (overlay / "kustomization.yaml").exists():
        return generated_webhook_configs(port, webhook_ca_bundle(cluster)), "generated in code"
    out = cluster.kubectl("kustomize", str(overlay))
    keep = {"Namespace", "DeviceClass", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    objs = [d for d in yaml.safe_load_all(out) if isinstance(d, dict) and d.get("kind") in keep]
    bundle = webhook_ca_bundle(cluster)
    for obj in objs:
        for hook in obj.get("webhooks") or []:
            cc = hook.setdefault("clientConfig", {})
            url = str(cc.get("url") or "https://127.0.0.1/validate")
            if cc.get("service"):
                url = f"https://127.0.0.1{cc['service'].get('path') or '/validate'}"
            cc["url"] = re.sub(r"^https://[^/]+", f"https://127.0.0.1:{port}", url)
            cc.pop("service", None)
            cc["caBundle"] = bundle
    return objs, "kustomize/overlays/local, each webhook pointed at this process by URL with its caBundle"


def register_webhook(cluster: LocalCluster, port: int) -> str:
    objs, source = webhook_objects(cluster, port)
    hooks = [o for o in objs if o.get("kind", "").endswith("WebhookConfiguration")]
    rest = [o for o in objs if o not in hooks]
    # Configurations first: on a re-registration the old ones still point at a stopped webhook,
    # which (failing closed) would refuse the DeviceClasses applied in the same batch.
    for batch in (hooks, rest):
        if batch:
            doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": batch})
            cluster.kubectl(
                "apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
                "-f", "-", input=doc,
            )  # fmt: skip
    return source


def generated_webhook_configs(port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """Webhook configurations for a host-run webhook, used when the local overlay is absent."""
    ns_selector = {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": [
                    "kube-system", "kube-node-lease", "kube-public", "draguard-system", "draguard-driver",
                ],
            }
        ]
    }
    rules = [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]},
        {
            "apiGroups": ["apps", "batch"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["deployments", "statefulsets", "daemonsets", "replicasets", "jobs", "cronjobs"],
        },
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["deviceclasses", "resourceclaims", "resourceclaimtemplates"],
        },
    ]

    def hook(name: str, path: str, policy: str) -> dict[str, Any]:
        return {
            "name": name,
            "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle},
            # /mutate only rewrites workloads' device-plugin requests; resource.k8s.io is never patched.
            "rules": rules[:2] if path == "/mutate" else rules,
            "namespaceSelector": ns_selector,
            "failurePolicy": policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }

    labels = {"app.kubernetes.io/managed-by": "draguard"}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "draguard", "labels": labels},
            "webhooks": [hook("mutate.draguard.io", "/mutate", "Ignore")],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "draguard", "labels": labels},
            "webhooks": [hook("validate.draguard.io", "/validate", "Fail")],
        },
    ]


# What the bundle's driver DaemonSet expects on a node, and where the dev node keeps it.
KUBELET_DIR = "/var/lib/kubelet"
CDI_DIR = "/var/run/cdi"


def bundle_objects(cluster: LocalCluster, overlay: Path | None = None) -> list[dict[str, Any]]:
    """The local overlay as `kubectl kustomize` renders it, with the node's three host paths mapped.

    The dev node keeps the kubelet's root and the CDI specs in its state directory (so two runs never
    share them); the DaemonSet's kubelet paths are the same inside and outside the container (the
    plugin registers its socket path with the kubelet), so both sides are mapped.
    """
    import yaml

    from . import kubelet
    from .procs import ClusterError

    overlay = overlay or REPO_ROOT / "kustomize" / "overlays" / "local"
    net = cluster.net
    if net is None:
        raise ClusterError("the bundle needs the real node")
    root = str(kubelet.root_dir(net))
    cdi = str(cluster.containerd_paths().cdi)
    objs = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(overlay))) if isinstance(d, dict)]
    for obj in objs:
        if obj.get("kind") != "DaemonSet":
            continue
        spec = obj["spec"]["template"]["spec"]
        for v in spec.get("volumes") or []:
            hp = v.get("hostPath")
            if hp and hp["path"] == CDI_DIR:
                hp["path"] = cdi
        text = json.dumps(obj).replace(f'"{KUBELET_DIR}', f'"{root}')
        obj.clear()
        obj.update(json.loads(text))
    return objs


def apply_bundle(cluster: LocalCluster, timeout: float = 240.0) -> dict[str, float]:
    """`kubectl apply` the local overlay on the real node and wait until it works; returns timings.

    The host-run driver of the real node stops first (the DaemonSet's pod takes its place); the
    webhook configurations become the bundle's (Service, caBundle from the certificate Job).
    """
    from .procs import ClusterError, wait_until

    node = cluster.real_node
    if node is None:
        raise ClusterError("the bundle needs the real node (dev up without --no-real-node)")
    kube = cluster.kube()
    cluster.stop(f"driver-{node}")
    slices = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{node}"
    for s in kube.get(slices).get("items") or []:
        kube.delete(f"/apis/resource.k8s.io/v1/resourceslices/{s['metadata']['name']}")
    objs = bundle_objects(cluster)
    t0 = time.monotonic()
    # Under the harness's field manager, so re-registering the host webhook later replaces the
    # bundle's Service clientConfig instead of merging a URL into it.
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}", "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}),
    )  # fmt: skip
    took: dict[str, float] = {}
    ns = "/apis/batch/v1/namespaces/draguard-system"

    def job_done() -> bool:
        conds = kube.get(f"{ns}/jobs/draguard-certs").get("status", {}).get("conditions") or []
        return any(c["type"] == "Complete" and c["status"] == "True" for c in conds)

    def ca_injected() -> bool:
        cfgs = [
            kube.get(f"/apis/admissionregistration.k8s.io/v1/{k}/draguard")
            for k in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
        ]
        return all(h["clientConfig"].get("caBundle") for c in cfgs for h in c["webhooks"])

    def webhook_ready() -> bool:
        d = kube.get("/apis/apps/v1/namespaces/draguard-system/deployments/draguard-webhook")
        return int(d.get("status", {}).get("readyReplicas") or 0) == int(d["spec"]["replicas"])

    def driver_ready() -> bool:
        ds = kube.get("/apis/apps/v1/namespaces/draguard-driver/daemonsets/draguard-driver")
        return int(ds.get("status", {}).get("numberReady") or 0) >= 1

    def published() -> bool:
        return bool(kube.get(slices).get("items"))

    for what, check in (
        ("certificate Job complete", job_done),
        ("caBundle injected", ca_injected),
        ("webhook replicas ready", webhook_ready),
        ("driver pod ready", driver_ready),
        ("ResourceSlices published by the driver pod", published),
    ):
        wait_until(check, max(5.0, timeout - (time.monotonic() - t0)), what, interval=0.5)
        took[what] = time.monotonic() - t0
        cluster.progress(f"bundle: {what} ({took[what]:.1f}s)")
    return took


def remove_bundle(cluster: LocalCluster) -> None:
    """Undo apply_bundle: its workloads go, the host webhook and driver come back."""
    keep = {"Namespace", "DeviceClass", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    gone = [o for o in bundle_objects(cluster) if o.get("kind") not in keep]
    cluster.kubectl_run(
        "delete", "--ignore-not-found", "--wait=true", "--timeout=120s", "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": gone}),
    )  # fmt: skip
    port = (cluster.state.get("ports") or {}).get("webhook")
    if port and "webhook" in cluster.running():
        register_webhook(cluster, int(port))
    if cluster.real_node and f"driver-{cluster.real_node}" not in cluster.running():
        cluster.start_real_node_driver()
