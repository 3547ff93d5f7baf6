"""Who may reach the webhook's admission port on each managed cloud (overlays/*/webhook-callers.yaml).

Built with the real kustomize, every overlay alone and with components/network-policy: the sources
admitted to the admission port are exactly that cloud's API server paths (konnectivity agents by
label on AKS and GKE, the control plane's range), no rule admits the port to every source, the probe
and metrics port is a different port with a rule of its own, and the policies select the webhook
pods the Deployment makes, and only those.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from kbundle import KUSTOMIZE, Obj, build, containers, find, one, pod_template, run_build

CLOUDS = ("aks", "gke", "eks")
KUBE_SYSTEM = {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}
MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]

# What each cloud's API server connects from when it calls a webhook (docs/install.md, "Who can reach
# the admission port, per cloud"). The ipBlock is the CONTROL_PLANE_CIDR default the user narrows.
EXPECTED_ADMISSION_SOURCES: dict[str, list[Obj]] = {
    "aks": [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16"]}},
        {"namespaceSelector": KUBE_SYSTEM, "podSelector": {"matchLabels": {"app": "konnectivity-agent"}}},
    ],
    "gke": [
        {"ipBlock": {"cidr": "0.0.0.0/0"}},
        {"namespaceSelector": KUBE_SYSTEM, "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}}},
    ],
    "eks": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
}


def _labels_match(selector: Obj, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"only matchLabels is read here: {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _selecting(objs: tuple[Obj, ...], workload: Obj) -> list[Obj]:
    """The NetworkPolicies that select `workload`'s pods (same namespace, podSelector matches)."""
    labels = pod_template(workload)["metadata"]["labels"]  # type: ignore[index]
    ns = workload["metadata"]["namespace"]
    return [
        np
        for np in find(objs, "NetworkPolicy")
        if np["metadata"]["namespace"] == ns and _labels_match(np["spec"]["podSelector"], labels)
    ]


def _port_numbers(workload: Obj) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for c in containers(workload) for p in c.get("ports", [])}


def _admitted(objs: tuple[Obj, ...], workload: Obj, port: int) -> list[Any]:
    """Every ingress source admitted to `port` of the workload's pods; None stands for "any source"."""
    names = _port_numbers(workload)
    sources: list[Any] = []
    for np in _selecting(objs, workload):
        for rule in np["spec"].get("ingress", []):
            rule_ports = rule.get("ports")
            if rule_ports:
                opened = {names.get(p["port"], p["port"]) for p in rule_ports}
                if port not in opened:
                    continue
            if not rule.get("from"):
                sources.append(None)
            else:
                sources.extend(rule["from"])
    return sources


def _webhook(objs: tuple[Obj, ...]) -> Obj:
    return one(objs, "Deployment", "draguard-webhook")


@pytest.mark.parametrize("components", [(), ("network-policy",)], ids=["overlay", "overlay+network-policy"])
@pytest.mark.parametrize("cloud", CLOUDS)
def test_admission_port_admits_only_that_clouds_api_server_paths(
    cloud: str, components: tuple[str, ...]
) -> None:
    objs = build(cloud, components)
    webhook = _webhook(objs)
    https = _port_numbers(webhook)["https"]
    admitted = _admitted(objs, webhook, https)
    assert None not in admitted, "a rule admits the admission port to every source"
    assert sorted(map(repr, admitted)) == sorted(map(repr, EXPECTED_ADMISSION_SOURCES[cloud]))
    # The rule the user narrows sits at the same index on every cloud, so one documented patch fits all.
    callers = one(objs, "NetworkPolicy", "draguard-webhook-callers")
    assert callers["spec"]["ingress"][0]["from"] == [EXPECTED_ADMISSION_SOURCES[cloud][0]]
    assert callers["spec"]["policyTypes"] == ["Ingress"]


@pytest.mark.parametrize("components", [(), ("network-policy",)], ids=["overlay", "overlay+network-policy"])
@pytest.mark.parametrize("cloud", CLOUDS)
def test_probe_and_metrics_port_is_separate_and_monitoring_only(
    cloud: str, components: tuple[str, ...]
) -> None:
    objs = build(cloud, components)
    webhook = _webhook(objs)
    ports = _port_numbers(webhook)
    assert ports["probes"] != ports["https"]
    # The kubelet and Prometheus reach the probe port; the API server never needs to.
    probe = webhook["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert probe["port"] == "probes" and probe["scheme"] == "HTTP"
    metrics_svc = one(objs, "Service", "draguard-webhook-metrics")
    assert metrics_svc["spec"]["ports"][0]["targetPort"] == "probes"
    assert _admitted(objs, webhook, ports["probes"]) == MONITORING * (1 + len(components))
    for np in _selecting(objs, webhook):
        for rule in np["spec"].get("ingress", []):
            opened = {p["port"] for p in rule["ports"]}
            assert opened in ({"https"}, {"probes"}), f"{np['metadata']['name']}: one port per rule, {opened}"
            assert set(_port_numbers(webhook)) >= opened, "a named port the pod lacks opens nothing"
            if opened == {"probes"}:
                assert rule["from"] == MONITORING


@pytest.mark.parametrize("cloud", CLOUDS)
def test_callers_policy_selects_the_webhook_pods_and_nothing_else(cloud: str) -> None:
    objs = build(cloud, ("network-policy",))
    callers = one(objs, "NetworkPolicy", "draguard-webhook-callers")
    webhook = _webhook(objs)
    assert callers["metadata"]["namespace"] == webhook["metadata"]["namespace"]
    assert callers["spec"]["podSelector"] == {"matchLabels": webhook["spec"]["selector"]["matchLabels"]}
    assert callers in _selecting(objs, webhook)
    others = [
        o for o in objs if o["kind"] in {"Deployment", "DaemonSet", "Job", "CronJob"} and o is not webhook
    ]
    assert others, "the bundle has other pods to tell apart"
    for other in others:
        assert callers not in _selecting(objs, other), other["metadata"]["name"]


def test_gke_port_443_is_followed_by_name() -> None:
    objs = build("gke", ("network-policy",))
    webhook = _webhook(objs)
    assert _port_numbers(webhook)["https"] == 443
    assert _admitted(objs, webhook, 443) and None not in _admitted(objs, webhook, 443)
    assert _admitted(objs, webhook, 8443) == [], "nothing is opened on the old port"


def _user_overlay(cloud: str, patch: str) -> tuple[Obj, ...]:
    """A user's kustomization on top of ours, with the CONTROL_PLANE_CIDR patch the overlays document."""
    with tempfile.TemporaryDirectory(prefix="draguard-callers-") as tmp:
        overlay = os.path.relpath(KUSTOMIZE / "overlays" / cloud, tmp)
        component = os.path.relpath(KUSTOMIZE / "components" / "network-policy", tmp)
        Path(tmp, "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources:\n  - {overlay}\ncomponents:\n  - {component}\n"
            f"patches:\n{patch}"
        )
        return tuple(run_build(Path(tmp)))


def _documented_patch(cloud: str) -> str:
    """The commented example in the overlay's kustomization.yaml, uncommented as the comment says."""
    text = (KUSTOMIZE / "overlays" / cloud / "kustomization.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("  # - target:"))
    block = ["  - target:"]
    for line in text[start + 1 :]:
        # The example ends where the comment is no longer indented under its `- target:`.
        if not line.startswith("  #   "):
            break
        block.append("  " + line[len("  # ") :])
    assert any("name: draguard-webhook-callers" in line for line in block)
    return "\n".join(block) + "\n"


@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_documented_cidr_patch_narrows_the_port_to_the_control_plane(cloud: str) -> None:
    patch = _documented_patch(cloud)
    objs = _user_overlay(cloud, patch)
    webhook = _webhook(objs)
    admitted = _admitted(objs, webhook, _port_numbers(webhook)["https"])
    cidrs = [s["ipBlock"] for s in admitted if "ipBlock" in s]
    assert len(cidrs) == 1 and cidrs[0]["cidr"] != "0.0.0.0/0" and "except" not in cidrs[0], cidrs
    # The konnectivity path stays: it needs no cluster-specific value.
    assert [s for s in admitted if "ipBlock" not in s] == EXPECTED_ADMISSION_SOURCES[cloud][1:]
    # The user's own range is the one applied.
    mine = patch.replace(cidrs[0]["cidr"], "198.51.100.0/28")
    assert mine != patch
    admitted = _admitted(_user_overlay(cloud, mine), webhook, _port_numbers(webhook)["https"])
    assert {"ipBlock": {"cidr": "198.51.100.0/28"}} in admitted


def test_the_install_guides_snippet_sets_the_control_plane_subnets(tmp_path: Path) -> None:
    """docs/install.md's my-cluster example, built next to kustomize/: the port is the subnets' only."""
    doc = (KUSTOMIZE.parent / "docs" / "install.md").read_text()
    block = next(
        b
        for b in re.findall(r"```yaml\n(.*?)```", doc, flags=re.S)
        if b.startswith("# my-cluster/") and "draguard-webhook-callers" in b
    )
    (tmp_path / "kustomize").symlink_to(KUSTOMIZE, target_is_directory=True)
    (tmp_path / "my-cluster").mkdir()
    (tmp_path / "my-cluster" / "kustomization.yaml").write_text(block)
    objs = tuple(run_build(tmp_path / "my-cluster"))
    webhook = _webhook(objs)
    admitted = _admitted(objs, webhook, _port_numbers(webhook)["https"])
    assert admitted == [{"ipBlock": {"cidr": "10.0.0.0/28"}}, {"ipBlock": {"cidr": "10.0.0.16/28"}}]
