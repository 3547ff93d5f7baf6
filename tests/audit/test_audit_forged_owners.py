"""An ownerReference is written by whoever creates the object: the audit leaves an object to its
named owner only when that owner was listed and would make it (webhook/audit/owners.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.audit.scan import judge_pages, owner_filter
from webhook.audit.source import ClusterState
from webhook.dev import scenarios
from webhook.dra.inventory import Inventory
from webhook.policy.load import load_policies
from webhook.policy.model import PolicySet

ROOT = Path(__file__).resolve().parents[2]
NS = "team-a"


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return load_policies(ROOT / "policies")


def _one(doc: str, uid: str) -> dict[str, Any]:
    o: dict[str, Any] = yaml.safe_load(doc)
    o["metadata"]["uid"] = uid
    return o


def _ref(kind: str, name: str, uid: str, api: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True}


def _made_by(owner: dict[str, Any], kind: str, name: str, uid: str) -> dict[str, Any]:
    """What the ReplicaSet controller, then the API server and kubelet, make of `owner`'s template."""
    tmpl = copy.deepcopy(owner["spec"]["template"])
    labels = {**tmpl["metadata"]["labels"], "pod-template-hash": "5d8f"}
    meta = {"name": name, "namespace": NS, "uid": uid, "labels": labels}
    meta["ownerReferences"] = [_ref(owner["kind"], owner["metadata"]["name"], owner["metadata"]["uid"])]
    if kind == "ReplicaSet":
        spec = {**copy.deepcopy(owner["spec"]), "template": {**tmpl, "metadata": {"labels": labels}}}
        return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta, "spec": spec}
    spec = tmpl["spec"]
    for c in spec["containers"]:
        c.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
        c["volumeMounts"] = [{"name": "kube-api-access-x", "mountPath": "/var/run/secrets"}]
    spec.update(nodeName="node-1", serviceAccountName="default", volumes=[{"name": "kube-api-access-x"}])
    spec["tolerations"] = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Running"}}


def _claim(name: str, template: dict[str, Any], pod_uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "ownerReferences": [_ref("Pod", "p", pod_uid, "v1")],
        },
        "spec": copy.deepcopy(template["spec"]["spec"]),
    }


def _scan(
    policies: PolicySet, pages: list[list[dict[str, Any]]], dra: list[dict[str, Any]]
) -> dict[str, list[str]]:
    """Results per (kind/name) of one scan over `pages`, in the order a scan lists them."""
    slices = [o for o in yaml.safe_load_all((ROOT / "examples" / "inventory.yaml").read_text()) if o]
    st = ClusterState(Inventory.from_objects([*slices, *dra]), {NS: {}}, frozenset({"v1"}), dra)
    keep, owners = owner_filter(policies, st, frozenset)
    out = judge_pages(([o for o in p if keep(o)] for p in pages), policies, st, timestamp=5)
    assert len(owners) > 0
    by: dict[str, list[str]] = {}
    for rep in out.reports:
        for r in rep.get("results") or []:
            res = r["resources"][0]
            by.setdefault(f"{res['kind']}/{res['name']}", []).append(f"{r['result']}:{r['rule']}")
    return by


def test_honest_pods_are_left_to_their_deployment_forged_ones_are_judged(policies: PolicySet) -> None:
    a100 = _one(scenarios.llm_template(NS, scenarios.A100), "uid-t-a100")
    h100 = _one(scenarios.llm_template(NS, scenarios.H100), "uid-t-h100")
    dep = _one(scenarios.llm_deployment(NS, scenarios.H100), "uid-dep")
    rs = _made_by(dep, "ReplicaSet", "llm-1", "uid-rs")
    honest = _made_by(rs, "Pod", "llm-1-a", "uid-pod-a")
    # The tier policy fails LLM pods on A100s: a tenant's pod that asks for one, naming the
    # compliant ReplicaSet by its real uid, or an owner that does not exist.
    bad_a100 = _made_by(rs, "Pod", "llm-1-forged", "uid-pod-f")
    bad_a100["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "llm-a100"
    ghost = _made_by(rs, "Pod", "llm-ghost", "uid-pod-g")
    ghost["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "llm-a100"
    ghost["metadata"]["ownerReferences"] = [_ref("ReplicaSet", "llm-0", "uid-gone")]
    image = _made_by(rs, "Pod", "llm-1-image", "uid-pod-i")
    image["spec"]["containers"][0]["image"] = "example.com/miner:1"
    gpus = _made_by(rs, "Pod", "llm-1-gpus", "uid-pod-n")
    gpus["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": 8}
    # Pages as a scan lists them: DRA objects, owners (Deployments, ReplicaSets), then pods.
    by = _scan(policies, [[a100, h100], [dep], [rs], [honest, bad_a100, ghost, image, gpus]], [a100, h100])
    assert by["Deployment/llm-inference-h100"] == ["pass:all"]
    assert "ReplicaSet/llm-1" not in by and "Pod/llm-1-a" not in by  # the finding lands once
    assert by["Pod/llm-1-forged"] == ["fail:tier/gpu-tiers"]
    assert by["Pod/llm-ghost"] == ["fail:tier/gpu-tiers"]
    assert "Pod/llm-1-image" in by and "Pod/llm-1-gpus" in by  # judged themselves


def test_a_replicaset_whose_template_differs_from_its_deployment_is_judged(policies: PolicySet) -> None:
    a100 = _one(scenarios.llm_template(NS, scenarios.A100), "uid-t-a100")
    h100 = _one(scenarios.llm_template(NS, scenarios.H100), "uid-t-h100")
    dep = _one(scenarios.llm_deployment(NS, scenarios.H100), "uid-dep")
    rs = _made_by(dep, "ReplicaSet", "llm-1", "uid-rs")
    rs["spec"]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "llm-a100"
    pod = _made_by(rs, "Pod", "llm-1-a", "uid-pod-a")
    by = _scan(policies, [[a100, h100], [dep], [rs], [pod]], [a100, h100])
    assert by["ReplicaSet/llm-1"] == ["fail:tier/gpu-tiers"]
    assert "Pod/llm-1-a" not in by  # its own ReplicaSet, listed, makes it: reported there


def test_listed_after_its_pod_the_owner_vouches_for_nothing(policies: PolicySet) -> None:
    h100 = _one(scenarios.llm_template(NS, scenarios.H100), "uid-t-h100")
    dep = _one(scenarios.llm_deployment(NS, scenarios.H100), "uid-dep")
    rs = _made_by(dep, "ReplicaSet", "llm-1", "uid-rs")
    pod = _made_by(rs, "Pod", "llm-1-a", "uid-pod-a")
    by = _scan(policies, [[h100], [pod], [dep], [rs]], [h100])
    assert "Pod/llm-1-a" in by  # no owner known yet: judged, never skipped on its word


def test_claims_are_left_only_to_a_listed_pod_whose_template_makes_them(policies: PolicySet) -> None:
    h100 = _one(scenarios.llm_template(NS, scenarios.H100), "uid-t-h100")
    a100 = _one(scenarios.llm_template(NS, scenarios.A100), "uid-t-a100")
    pod = _one(scenarios.llm_deployment(NS, scenarios.H100), "uid-dep")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": NS,
            "uid": "uid-p",
            "labels": pod["spec"]["template"]["metadata"]["labels"],
        },
        "spec": pod["spec"]["template"]["spec"],
    }
    honest = _claim("p-gpu-1", h100, "uid-p")
    other = _claim("p-gpu-2", a100, "uid-p")  # not what the pod's template makes
    ghost = _claim("q-gpu-1", h100, "uid-nobody")
    dra = [h100, a100, honest, other, ghost]
    by = _scan(policies, [[h100, a100], [pod], [honest, other, ghost]], dra)
    assert "Pod/p" in by
    assert "ResourceClaim/p-gpu-1" not in by
    assert "ResourceClaim/p-gpu-2" in by and "ResourceClaim/q-gpu-1" in by


def test_a_replicaset_running_more_pods_than_its_deployment_is_judged(policies: PolicySet) -> None:
    h100 = _one(scenarios.llm_template(NS, scenarios.H100), "uid-t-h100")
    dep = _one(scenarios.llm_deployment(NS, scenarios.H100, replicas=2), "uid-dep")
    old = _made_by(dep, "ReplicaSet", "llm-0", "uid-rs-0")
    old["spec"]["replicas"] = 0  # scaled down by a rollout: still the Deployment's
    big = _made_by(dep, "ReplicaSet", "llm-1", "uid-rs-1")
    big["spec"]["replicas"] = 1000
    by = _scan(policies, [[h100], [dep], [old, big]], [h100])
    assert "ReplicaSet/llm-0" not in by
    assert "ReplicaSet/llm-1" in by


def test_a_deleted_owner_vouches_for_what_it_made_until_the_garbage_collector_is_done(
    policies: PolicySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting a Deployment leaves its ReplicaSet and terminating pod for a while: they stay the
    deleted Deployment's (no new entries in the report), but only for what its template made and
    only for owners.RECENT_SECONDS."""
    from types import SimpleNamespace

    from webhook.audit import owners as owners_mod

    now = [1000.0]
    monkeypatch.setattr(owners_mod, "time", SimpleNamespace(monotonic=lambda: now[0]))
    h100 = _one(scenarios.llm_template(NS, scenarios.H100), "uid-t-h100")
    a100 = _one(scenarios.llm_template(NS, scenarios.A100), "uid-t-a100")
    dep = _one(scenarios.llm_deployment(NS, scenarios.H100), "uid-dep")
    rs = _made_by(dep, "ReplicaSet", "llm-1", "uid-rs")
    pod = _made_by(rs, "Pod", "llm-1-a", "uid-pod-a")
    slices = [o for o in yaml.safe_load_all((ROOT / "examples" / "inventory.yaml").read_text()) if o]
    inv = Inventory.from_objects([*slices, h100, a100])
    st = ClusterState(inv, {NS: {}}, frozenset({"v1"}), [h100, a100])

    def scan(objects: list[dict[str, Any]], namespace: str | None) -> set[str]:
        keep, owners = owner_filter(policies, st, frozenset, namespace)
        kept = {f"{o['kind']}/{o['metadata']['name']}" for o in objects if keep(o)}
        if namespace is None:
            st.owners = owners
        else:
            st.owners.replace_namespace(namespace, owners)
        return kept

    assert scan([dep, rs, pod], None) == {"Deployment/llm-inference-h100"}
    # The Deployment is deleted; a rescan of its namespace still lists the ReplicaSet and pod.
    now[0] += 5
    forged = _made_by(rs, "Pod", "llm-1-forged", "uid-pod-f")
    forged["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "llm-a100"
    assert scan([rs, pod, forged], NS) == {"Pod/llm-1-forged"}
    # The ReplicaSet is gone too, the pod still terminating: a full scan leaves it to them.
    now[0] += 5
    assert scan([pod, forged], None) == {"Pod/llm-1-forged"}
    # Long after the delete, what is still there is judged itself.
    now[0] += owners_mod.RECENT_SECONDS
    assert scan([pod, forged], NS) == {"Pod/llm-1-a", "Pod/llm-1-forged"}


def test_deleted_owners_remembered_are_bounded(policies: PolicySet, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant creating and deleting Deployments in a loop: the index keeps at most MAX_RECENT."""
    from webhook.audit import owners as owners_mod

    monkeypatch.setattr(owners_mod, "MAX_RECENT", 10)
    index = owners_mod.OwnerIndex(policies)
    for i in range(30):
        index = owners_mod.OwnerIndex(policies, previous=index, namespace=NS)
        doc = scenarios.llm_deployment(NS, scenarios.H100).replace("llm-inference", f"d{i}")
        index.add(_one(doc, f"u{i}"))
    nxt = owners_mod.OwnerIndex(policies, previous=index, namespace=NS)
    assert 0 < sum(len(r) for r in nxt._recent.values()) <= 10
