"""components/network-policy: every pod of the bundle is covered, and each allowed port exists."""

from __future__ import annotations

import pytest
from kbundle import Obj, build, containers, find


def _selects(np: Obj, labels: dict[str, str]) -> bool:
    want = np["spec"]["podSelector"].get("matchLabels", {})
    return all(labels.get(k) == v for k, v in want.items())


def _pods(objs: tuple[Obj, ...]) -> list[Obj]:
    return [o for o in objs if o["kind"] in {"Deployment", "DaemonSet", "Job", "CronJob"}]


def _template_labels(o: Obj) -> dict[str, str]:
    t = o["spec"]["jobTemplate"]["spec"]["template"] if o["kind"] == "CronJob" else o["spec"]["template"]
    return dict(t["metadata"].get("labels", {}))


@pytest.mark.parametrize("overlay", ["aks", "gke", "eks"])
def test_policies_cover_every_pod_and_name_real_ports(overlay: str) -> None:
    objs = build(overlay, ("network-policy",))
    nps = find(objs, "NetworkPolicy")
    namespaces = {"draguard-system", "draguard-driver"}
    assert {n["metadata"]["namespace"] for n in nps} == namespaces
    deny = [n for n in nps if n["spec"]["podSelector"] == {}]
    assert {n["metadata"]["namespace"] for n in deny} == namespaces and len(deny) == 2
    assert all("ingress" not in n["spec"] for n in deny), "a default deny for each namespace"
    for workload in _pods(objs):
        labels = _template_labels(workload)
        ns = workload["metadata"]["namespace"]
        local = [n for n in nps if n["metadata"]["namespace"] == ns]
        allowing = [n for n in local if n["spec"]["podSelector"] and _selects(n, labels)]
        ports = {p["name"]: p["containerPort"] for c in containers(workload) for p in c.get("ports", [])}
        for np in allowing:
            for rule in np["spec"].get("ingress", []):
                # No rule admits every source; the admission port's sources per cloud are checked in
                # test_cloud_callers.py.
                assert rule.get("from"), (np["metadata"]["name"], rule)
                for port in rule["ports"]:
                    # A named port the pod does not declare opens nothing.
                    assert port["port"] in ports, (workload["metadata"]["name"], port)
                    if port["port"] != "https":
                        assert rule["from"] == [
                            {
                                "namespaceSelector": {
                                    "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                                }
                            }
                        ]
                    else:
                        assert workload["metadata"]["name"] == "draguard-webhook"
                        assert np["metadata"]["name"] == "draguard-webhook-callers", (
                            "admission callers per cloud"
                        )
        if workload["kind"] in {"Job", "CronJob"}:
            assert not allowing, "the certificate Job takes no connections"
        else:
            assert allowing, workload["metadata"]["name"]
    webhook = next(o for o in _pods(objs) if o["metadata"]["name"] == "draguard-webhook")
    https = [p for c in containers(webhook) for p in c.get("ports", []) if p["name"] == "https"]
    # GKE's overlay moves the port to 443; the policy follows it by name.
    assert https and https[0]["containerPort"] == (443 if overlay == "gke" else 8443)
