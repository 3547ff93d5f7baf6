"""What each cloud overlay (and the local one) changes, as seen in the built output."""

from __future__ import annotations

from pathlib import Path

import yaml
from kbundle import KUSTOMIZE, REPO, build, find, one, webhook_configs


def _driver_spec(overlay: str) -> dict:  # type: ignore[type-arg]
    return one(build(overlay), "DaemonSet", "draguard-driver")["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _required_terms(spec: dict) -> list[dict]:  # type: ignore[type-arg]
    return spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]  # type: ignore[no-any-return]


def test_base_driver_targets_labelled_gpu_nodes() -> None:
    spec = _driver_spec("base")
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_aks_opts_both_webhooks_out_of_the_admissions_enforcer() -> None:
    objs = build("aks")
    cfgs = webhook_configs(objs)
    assert len(cfgs) == 2
    for cfg in cfgs:
        assert cfg["metadata"]["annotations"]["admissions.enforcer/disabled"] == "true"
    # Other overlays do not carry the AKS-only annotation.
    for other in ("gke", "eks", "local"):
        for cfg in webhook_configs(build(other)):
            assert "admissions.enforcer/disabled" not in cfg["metadata"].get("annotations", {})


def test_aks_annotation_survives_the_cert_manager_component() -> None:
    for cfg in webhook_configs(build("aks", ("cert-manager",))):
        ann = cfg["metadata"]["annotations"]
        assert ann["admissions.enforcer/disabled"] == "true"
        assert ann["cert-manager.io/inject-ca-from"] == "draguard-system/draguard-webhook"


def test_aks_driver_uses_aks_gpu_labels_and_taints() -> None:
    spec = _driver_spec("aks")
    assert spec["nodeSelector"] == {"kubernetes.azure.com/accelerator": "nvidia"}
    assert {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in spec["tolerations"]


def test_gke_driver_selects_accelerator_nodes_and_mounts_the_gke_driver_root() -> None:
    spec = _driver_spec("gke")
    assert "nodeSelector" not in spec or "nvidia.com/gpu.present" not in spec["nodeSelector"]
    assert _required_terms(spec) == [
        {"matchExpressions": [{"key": "cloud.google.com/gke-accelerator", "operator": "Exists"}]}
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["driver-root"]["hostPath"]["path"] == "/home/kubernetes/bin/nvidia"
    c = spec["containers"][0]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["driver-root"]["mountPath"] == "/driver-root" and mounts["driver-root"]["readOnly"]
    assert c["args"][c["args"].index("--driver-root-mount") + 1] == "/driver-root"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DRIVER_ROOT"] == "/home/kubernetes/bin/nvidia"
    # Elsewhere the driver is installed on the host itself (or by the GPU Operator: patch both to
    # /run/nvidia/driver); the volume and DRIVER_ROOT always name the same host directory.
    for other in ("aks", "eks"):
        o = _driver_spec(other)
        path = {v["name"]: v for v in o["volumes"]}["driver-root"]["hostPath"]["path"]
        assert path == "/" == {e["name"]: e.get("value") for e in o["containers"][0]["env"]}["DRIVER_ROOT"]


def test_gke_webhook_listens_on_443_for_private_clusters_without_new_capabilities() -> None:
    objs = build("gke")
    spec = one(objs, "Deployment", "draguard-webhook")["spec"]["template"]["spec"]
    assert {"name": "net.ipv4.ip_unprivileged_port_start", "value": "443"} in spec["securityContext"][
        "sysctls"
    ]
    c = spec["containers"][0]
    assert c["ports"][0]["containerPort"] == 443
    assert c["args"][c["args"].index("--port") + 1] == "443"
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    text = (KUSTOMIZE / "overlays" / "gke" / "kustomization.yaml").read_text()
    assert "firewall-rules create" in text and "tcp:8443" in text  # the alternative is documented


EKS_TYPES = {"p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"}


def test_eks_driver_selects_p4d_and_p5_instances() -> None:
    spec = _driver_spec("eks")
    assert "nvidia.com/gpu.present" not in spec.get("nodeSelector", {})
    (term,) = _required_terms(spec)
    (expr,) = term["matchExpressions"]
    assert expr["key"] == "node.kubernetes.io/instance-type" and expr["operator"] == "In"
    assert set(expr["values"]) == EKS_TYPES


def test_eks_host_network_component() -> None:
    assert (
        "hostNetwork" not in one(build("eks"), "Deployment", "draguard-webhook")["spec"]["template"]["spec"]
    )
    spec = one(build("eks", ("eks-host-network",)), "Deployment", "draguard-webhook")["spec"]["template"][
        "spec"
    ]
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_eks_karpenter_nodepool_is_an_example_not_applied() -> None:
    assert not find(build("eks"), "NodePool")
    path = KUSTOMIZE / "overlays" / "eks" / "examples" / "karpenter-nodepool-h100.yaml"
    pool = yaml.safe_load(path.read_text())
    assert pool["apiVersion"] == "karpenter.sh/v1" and pool["kind"] == "NodePool"
    reqs = {r["key"]: r for r in pool["spec"]["template"]["spec"]["requirements"]}
    # Nodes from this pool must be picked up by the eks overlay's driver affinity.
    assert set(reqs["node.kubernetes.io/instance-type"]["values"]) <= EKS_TYPES
    assert reqs["karpenter.sh/capacity-type"]["values"] == ["on-demand"]
    assert pool["spec"]["template"]["spec"]["nodeClassRef"] == {
        "group": "karpenter.k8s.aws",
        "kind": "EC2NodeClass",
        "name": "gpu-nodes",
    }
    assert pool["spec"]["limits"]["nvidia.com/gpu"] == "64"
    assert pool["spec"]["disruption"] == {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "30m"}
    spec = _driver_spec("eks")
    for taint in pool["spec"]["template"]["spec"].get("taints", []):
        assert any(t["key"] == taint["key"] and t["operator"] == "Exists" for t in spec["tolerations"])


def test_local_overlay_is_the_whole_bundle_on_the_real_node() -> None:
    objs = build("local")
    base = {cfg["kind"]: {h["name"] for h in cfg["webhooks"]} for cfg in webhook_configs(build("base"))}
    for cfg in webhook_configs(objs):
        # Every webhook of the base, and no half-defined one added by a patch that matched no name.
        names = [h["name"] for h in cfg["webhooks"]]
        assert names and set(names) == base[cfg["kind"]]
        assert len(cfg["webhooks"]) == len(base[cfg["kind"]])
        assert all(h.get("rules") for h in cfg["webhooks"])
        for h in cfg["webhooks"]:
            # In-cluster, like every cloud: the Service, with caBundle injected by the certificate Job.
            assert h["clientConfig"]["service"]["name"] == "draguard-webhook", h["name"]
            assert "url" not in h["clientConfig"]
    for kind, name in (
        ("Deployment", "draguard-webhook"),
        ("Deployment", "draguard-audit"),
        ("Job", "draguard-certs"),
        ("CronJob", "draguard-certs-renew"),
        ("DaemonSet", "draguard-driver"),
    ):
        obj = one(objs, kind, name)
        tmpl = (
            obj["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob" else obj["spec"]["template"]
        )
        # The dev cluster's other nodes are simulated and never run pods.
        assert tmpl["spec"]["nodeSelector"].get("draguard.io/real-node") == "true", kind
    assert one(objs, "Deployment", "draguard-webhook")["spec"]["replicas"] == 3
    assert find(objs, "Service", "draguard-webhook") and find(objs, "PodDisruptionBudget", "draguard-webhook")


def test_local_driver_runs_simulated_with_a_topology_the_image_ships() -> None:
    spec = _driver_spec("local")
    args = spec["containers"][0]["args"]
    topo = Path(args[args.index("--sim") + 1])
    assert "--real" not in args
    assert topo.parent == Path("/usr/share/draguard/topologies")
    assert (REPO / "driver" / "sim" / "topologies" / topo.name).is_file(), (
        f"{topo.name} not in driver/sim/topologies"
    )
    assert "COPY driver/sim/topologies /usr/share/draguard/topologies" in (REPO / "Containerfile").read_text()
    assert "/dev" not in {v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert "/dev" not in {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    # the volume list and the mounts still agree after the deletions
    assert {m["name"] for m in spec["containers"][0]["volumeMounts"]} <= {v["name"] for v in spec["volumes"]}


def test_gke_allows_critical_priority_pods_in_both_namespaces() -> None:
    objs = build("gke")
    quotas = {q["metadata"]["namespace"]: q for q in find(objs, "ResourceQuota", "draguard-critical-pods")}
    priority = {
        (o["metadata"]["namespace"], o["metadata"]["name"]):
            o["spec"]["template"]["spec"].get("priorityClassName")
        for o in objs
        if o["kind"] in {"Deployment", "DaemonSet"}
    }
    # The background audit is on no request path: it needs no critical priority.
    assert priority.pop(("draguard-system", "draguard-audit")) is None
    used = {ns: p for (ns, _), p in priority.items()}
    assert len(set(priority.values())) == len(used)  # one priority per namespace
    assert used == {"draguard-system": "system-cluster-critical", "draguard-driver": "system-node-critical"}
    assert set(quotas) == set(used)
    for ns, quota in quotas.items():
        (expr,) = quota["spec"]["scopeSelector"]["matchExpressions"]
        assert expr["scopeName"] == "PriorityClass" and expr["operator"] == "In"
        assert used[ns] in expr["values"]
        assert int(quota["spec"]["hard"]["pods"]) >= 100
    assert not find(build("eks"), "ResourceQuota")
