"""Workload CRDs in the audit without a server: which objects it judges (owners as for the built-in
controllers), and the cut that keeps a hostile list page decodable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from webhook.audit.evaluate import auditable
from webhook.audit.owners import OwnerIndex
from webhook.audit.source import shallow
from webhook.dra.workloads import using_crd_table
from webhook.policy.load import load_policies

ROOT = Path(__file__).resolve().parents[2]
GPU = {"limits": {"nvidia.com/gpu": 1}}


def _pod(owner_kind: str, owner_api: str) -> dict[str, Any]:
    ref = {"apiVersion": owner_api, "kind": owner_kind, "name": "j", "uid": "u", "controller": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "ownerReferences": [ref]},
        "spec": {"containers": [{"name": "c", "image": "cuda", "resources": GPU}]},
    }


def _mxjob() -> dict[str, Any]:
    spec = {"containers": [{"name": "c", "image": "cuda", "resources": GPU}]}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "MXJob",
        "metadata": {"name": "m", "namespace": "ml"},
        "spec": {"mxReplicaSpecs": {"Worker": {"replicas": 2, "template": {"spec": spec}}}},
    }


def _pytorchjob(image: str = "cuda") -> dict[str, Any]:
    spec = {"containers": [{"name": "c", "image": image, "resources": GPU}]}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j", "namespace": "ml", "uid": "u"},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": {"spec": spec}}}},
    }


def test_pods_of_a_listed_workload_crd_are_judged_through_it() -> None:
    listed = frozenset({("kubeflow.org", "PyTorchJob")})
    owners = OwnerIndex()
    owners.add(_pytorchjob())
    assert not auditable(_pod("PyTorchJob", "kubeflow.org/v1"), listed, owners)
    # not listed (not served, or forbidden)
    assert auditable(_pod("PyTorchJob", "kubeflow.org/v1"), frozenset(), owners)
    # The group counts: a same-named kind of another group is not the audited one.
    assert auditable(_pod("PyTorchJob", "example.com/v1"), listed, owners)
    # A pod that runs what no template of its named owner runs is judged itself.
    other = OwnerIndex()
    other.add(_pytorchjob(image="other"))
    assert auditable(_pod("PyTorchJob", "kubeflow.org/v1"), listed, other)


def test_a_kind_a_workload_kind_policy_adds_is_read_under_its_table() -> None:
    policies = load_policies(ROOT / "tests" / "fixtures" / "workload-kinds" / "mxjob.yaml")
    assert not auditable(_mxjob())  # the built-in table does not know MXJob
    with using_crd_table(policies.crd_table):
        assert auditable(_mxjob())


def test_shallow_cuts_only_what_is_too_deep() -> None:
    page = {"items": [{"metadata": {"name": "a"}, "spec": {"s": '[{\\"', "x": [[[[1]]]]}}]}
    text = json.dumps(page).encode()
    assert json.loads(shallow(text, 64)) == page
    assert json.loads(shallow(text, 5)) == {
        "items": [{"metadata": {"name": "a"}, "spec": {"s": '[{\\"', "x": [None]}}]
    }
    deep = b'{"items":[{"spec":' + b'{"d":' * 5000 + b"1" + b"}" * 5000 + b',"n":2}]}'
    out = json.loads(shallow(deep, 10))
    assert out["items"][0]["n"] == 2
