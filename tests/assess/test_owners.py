"""A pod resolves to the object a person edits, through ownerReferences."""

from __future__ import annotations

from typing import Any

from tests.assess.conftest import Objects, deployment, owned, pod_of, pod_template, replicaset
from webhook.assess.owners import MAX_DEPTH, OwnerRef, controller_of, may_own_pods, resolve


def _obj(api: str, kind: str, name: str, ns: str = "ml") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"namespace": ns, "name": name, "uid": f"u-{name}"}}


def test_replicaset_resolves_to_its_deployment() -> None:
    d = deployment("ml", "trainer", pod_template("img", {"limits": {"nvidia.com/gpu": 1}}))
    rs = replicaset(d)
    res = resolve(pod_of(rs, 0), Objects(d, rs))
    assert res.owner == OwnerRef("apps/v1", "Deployment", "ml", "trainer")
    assert [str(c) for c in res.chain] == ["ReplicaSet/ml/trainer-7d9f", "Deployment/ml/trainer"]
    assert res.obj is d and res.note == ""


def test_job_resolves_to_its_cronjob() -> None:
    cron = _obj("batch/v1", "CronJob", "nightly")
    job = owned(_obj("batch/v1", "Job", "nightly-2893"), cron)
    pod = owned({"metadata": {"namespace": "ml", "name": "nightly-2893-x"}}, job)
    res = resolve(pod, Objects(cron, job))
    assert res.owner == OwnerRef("batch/v1", "CronJob", "ml", "nightly")


def test_statefulset_daemonset_and_crds_resolve_directly() -> None:
    for api, kind in (
        ("apps/v1", "StatefulSet"),
        ("apps/v1", "DaemonSet"),
        ("kubeflow.org/v1", "PyTorchJob"),
    ):
        top = _obj(api, kind, "w")
        res = resolve(owned({"metadata": {"namespace": "ml", "name": "w-0"}}, top), Objects(top))
        assert res.owner == OwnerRef(api, kind, "ml", "w"), kind


def test_jobset_owning_jobs_owning_pods() -> None:
    js = _obj("jobset.x-k8s.io/v1alpha2", "JobSet", "pretrain")
    job = owned(_obj("batch/v1", "Job", "pretrain-workers-0"), js)
    pod = owned({"metadata": {"namespace": "ml", "name": "p"}}, job)
    assert resolve(pod, Objects(js, job)).owner.kind == "JobSet"


def test_a_bare_pod_is_its_own_owner() -> None:
    pod = {"metadata": {"namespace": "ml", "name": "solo"}}
    res = resolve(pod, Objects())
    assert res.owner == OwnerRef("v1", "Pod", "ml", "solo") and res.chain == () and res.obj is pod


def test_a_missing_owner_stops_there_with_a_note() -> None:
    d = deployment("ml", "gone", pod_template("img"))
    rs = replicaset(d)
    res = resolve(pod_of(rs, 0), Objects(rs))  # the Deployment was deleted (orphaned ReplicaSet)
    assert res.owner == OwnerRef("apps/v1", "Deployment", "ml", "gone")
    assert res.obj is None and "not readable" in res.note


def test_non_controller_references_are_ignored_when_a_controller_exists() -> None:
    pod = {
        "metadata": {
            "namespace": "ml",
            "name": "p",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm"},
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "controller": True},
            ],
        }
    }
    assert controller_of(pod) == OwnerRef("apps/v1", "ReplicaSet", "ml", "rs")
    two = {"metadata": {"ownerReferences": [{"kind": "A", "name": "a"}, {"kind": "B", "name": "b"}]}}
    assert controller_of(two) is None  # ambiguous without a controller: treated as unowned


def test_a_loop_or_an_endless_chain_stops() -> None:
    a, b = _obj("example.com/v1", "A", "a"), _obj("example.com/v1", "B", "b")
    a = owned(a, b)
    b = owned(b, a)
    res = resolve(owned({"metadata": {"namespace": "ml", "name": "p"}}, a), Objects(a, b))
    assert "loop" in res.note
    chain = [_obj("example.com/v1", "K", f"k{i}") for i in range(MAX_DEPTH + 3)]
    for i in range(len(chain) - 1):
        chain[i] = owned(chain[i], chain[i + 1])
    look = Objects(*chain)
    res = resolve(owned({"metadata": {"namespace": "ml", "name": "p"}}, chain[0]), look)
    assert "deeper than" in res.note and look.calls == MAX_DEPTH


def test_a_forged_reference_to_a_secret_or_role_is_not_followed() -> None:
    # ownerReferences are the pod author's to write: assess must not read what they point at.
    for api, kind in (
        ("v1", "Secret"),
        ("v1", "ConfigMap"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("resource.k8s.io/v1", "ResourceClaim"),
    ):
        target = _obj(api, kind, "t")
        look = Objects(target)
        res = resolve(owned({"metadata": {"namespace": "ml", "name": "p"}}, target), look)
        assert look.calls == 0, kind
        assert res.obj is None and "not a workload kind" in res.note
    assert may_own_pods("v1", "ReplicationController")
    assert may_own_pods("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert may_own_pods("ray.io/v1", "RayCluster")
