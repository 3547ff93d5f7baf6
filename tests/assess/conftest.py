"""Plain-data clusters for the assess unit tests: the seed inventory, the bundle's DeviceClasses and
the shipped policies, with workloads and pods written as the API server returns them."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.assess.analyze import Assessor
from webhook.policy.load import load_policies
from webhook.policy.model import PolicySet

ROOT = Path(__file__).resolve().parents[2]


def _items(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for d in yaml.safe_load_all(path.read_text()):
        if isinstance(d, dict):
            out.extend(d.get("items", [d]))
    return out


SLICES = [
    o for o in _items(ROOT / "tests/fixtures/seed/cluster-inventory.yaml") if o["kind"] == "ResourceSlice"
]
CLASSES = [
    o for o in _items(ROOT / "kustomize/base/deviceclasses/deviceclasses.yaml") if o["kind"] == "DeviceClass"
]


def pod_template(
    image: str,
    resources: Mapping[str, Any] | None = None,
    claims: list[Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "main", "image": image}
    if resources:
        c["resources"] = dict(resources)
    spec: dict[str, Any] = {"containers": [c]}
    if claims:
        spec["resourceClaims"] = claims
        c.setdefault("resources", {})["claims"] = [{"name": x["name"]} for x in claims]
    return {"metadata": {"labels": dict(labels or {"app": "w"})}, "spec": spec}


def deployment(ns: str, name: str, template: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-d-{name}"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": template["metadata"]["labels"]},
            "template": template,
        },
    }


def owned(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(obj))
    out["metadata"]["ownerReferences"] = [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"].get("uid", "x"),
            "controller": True,
        }
    ]
    return out


def replicaset(d: Mapping[str, Any]) -> dict[str, Any]:
    rs = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"namespace": d["metadata"]["namespace"], "name": d["metadata"]["name"] + "-7d9f"},
        "spec": copy.deepcopy(d["spec"]),
    }
    return owned(rs, d)


def pod_of(owner: Mapping[str, Any], i: int, phase: str = "Running") -> dict[str, Any]:
    tmpl = owner["spec"]["template"]
    pod = {
        # As a list returns them: no apiVersion/kind on the items.
        "metadata": {
            "namespace": owner["metadata"]["namespace"],
            "name": f"{owner['metadata']['name']}-{i}",
            "uid": f"uid-p-{owner['metadata']['name']}-{i}",
            "labels": tmpl["metadata"]["labels"],
        },
        "spec": copy.deepcopy(tmpl["spec"]),
        "status": {"phase": phase},
    }
    return owned(pod, owner)


class Objects:
    """A lookup over a fixed set of objects, counting calls."""

    def __init__(self, *objs: Mapping[str, Any]) -> None:
        self.objs = {
            (o["apiVersion"], o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
            for o in objs
        }
        self.calls = 0

    def __call__(self, api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.calls += 1
        return self.objs.get((api_version, kind, namespace, name))


@pytest.fixture(scope="session")
def policies() -> PolicySet:
    return load_policies(ROOT / "policies")


def assessor(policies: PolicySet, lookup: Objects, namespaces: Mapping[str, Mapping[str, str]]) -> Assessor:
    a = Assessor(policies, served_versions=frozenset({"v1"}), lookup=lookup)
    a.add_namespaces([{"metadata": {"name": n, "labels": dict(lab)}} for n, lab in namespaces.items()])
    a.add_slices(copy.deepcopy(SLICES))
    a.add_classes(copy.deepcopy(CLASSES))
    return a
