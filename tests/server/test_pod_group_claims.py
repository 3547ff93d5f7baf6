"""Claims the control plane makes for a PodGroup (KEP-5729, `PodGroup.spec.resourceClaims`) keep to
the workload class of the group's pods, as a pod's own claims keep to the pod's.

The order trick: the group's pods name a template that does not exist yet (admitted, nothing to
judge), the template is then created with A100s, and the PodGroup's claim is made from it. That
claim names no pod: it is owned by the PodGroup, so it is traced through the group's pods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from webhook.dra.inventory import Inventory
from webhook.engine.resolve import owner_pod_group, pods_in_group
from webhook.policy.load import load_policies
from webhook.server import admission, lookups
from webhook.server.admission import Snapshot

REPO = Path(__file__).resolve().parents[2]
VLLM = "vllm/vllm-openai:v0.6.3"


def _snapshot() -> Snapshot:
    return Snapshot(
        policies=load_policies(REPO / "policies"), inventory=Inventory.empty(), namespace_labels={"ml": {}}
    )


def group_claim(
    device_class: str, group: str = "llama-gang", api: str = "scheduling.k8s.io/v1beta1"
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{group}-gpus-7x2k9",
            "namespace": "ml",
            "ownerReferences": [
                {"apiVersion": api, "kind": "PodGroup", "name": group, "uid": "g1", "controller": True}
            ],
        },
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": device_class}}]}},
    }


def member(name: str, group: str = "llama-gang", image: str = VLLM) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "schedulingGroup": {"podGroupName": group},
            "containers": [{"name": "server", "image": image, "resources": {"claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "gang-gpus"}],
        },
    }


def request(claim: dict[str, Any]) -> dict[str, Any]:
    return {
        "uid": "r",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
        "operation": "CREATE",
        "namespace": "ml",
        "object": claim,
    }


def test_a_pod_group_claim_is_traced_through_the_groups_pods() -> None:
    snap = _snapshot()
    req = request(group_claim("gpu.nvidia.com-a100"))
    # Admission asks the API server for the group's unscheduled pods.
    assert lookups.wanted(req, snap) == [("GroupPods", "ml", "llama-gang")]
    pods = tuple(member(f"worker-{i}") for i in range(4))
    out = admission.review("validate", req, snap, None, lookups.Lookups(pods, {}))
    assert out.verdict == "denied"
    message = out.response["status"]["message"]
    assert "tier/gpu-tiers" in message and "class 'llm'" in message
    assert "the claim made for pod group llama-gang" in message and "gpu.nvidia.com-a100" in message
    # Four alike pods, one verdict.
    assert len([f for f in out.findings if f.rule == "tier/gpu-tiers"]) == 1


def test_the_llm_tiers_classes_and_other_workloads_pass() -> None:
    snap = _snapshot()
    allowed = admission.review(
        "validate", request(group_claim("gpu.nvidia.com-h100")), snap, None,
        lookups.Lookups((member("worker-0"),), {}),
    )  # fmt: skip
    assert allowed.verdict != "denied", allowed.response
    batch = admission.review(
        "validate", request(group_claim("gpu.nvidia.com-a100")), snap, None,
        lookups.Lookups((member("worker-0", image="example.com/batch/trainer:1"),), {}),
    )  # fmt: skip
    assert batch.verdict != "denied", batch.response
    # Pods of another group in the namespace are not this claim's business.
    other = admission.review(
        "validate", request(group_claim("gpu.nvidia.com-a100")), snap, None,
        lookups.Lookups((member("worker-0", group="someone-else"),), {}),
    )  # fmt: skip
    assert other.verdict != "denied", other.response


def test_unreadable_group_pods_fail_closed() -> None:
    snap = _snapshot()
    out = admission.review(
        "validate", request(group_claim("gpu.nvidia.com-a100")), snap, None,
        lookups.Lookups((), {("GroupPods", "ml", "llama-gang"): "unreadable"}),
    )  # fmt: skip
    assert out.verdict == "denied"
    assert (
        "the pods of pod group 'llama-gang' this claim is made for could not all be read"
        in (out.response["status"]["message"])
    )


def test_only_a_controller_reference_to_a_scheduling_pod_group_counts() -> None:
    assert owner_pod_group(group_claim("x")) == "llama-gang"
    assert owner_pod_group(group_claim("x", api="scheduling.k8s.io/v1alpha3")) == "llama-gang"
    assert owner_pod_group(group_claim("x", api="example.com/v1")) is None  # someone else's PodGroup kind
    claim = group_claim("x")
    claim["metadata"]["ownerReferences"][0]["controller"] = False
    assert owner_pod_group(claim) is None
    # Hostile shapes are not errors.
    for refs in (None, "x", [None], [{"kind": "PodGroup", "controller": True, "name": 7}]):
        assert owner_pod_group({"metadata": {"ownerReferences": refs}}) is None
    pods = [member("a"), member("b", group="other"), {"kind": "Pod", "apiVersion": "v1", "spec": "junk"}]
    assert [p["metadata"]["name"] for p in pods_in_group(pods, "ml", "llama-gang")] == ["a"]


class ListedPods:
    """What the API server answers for `GET /api/v1/namespaces/ml/pods?fieldSelector=spec.nodeName=`."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.paths: list[tuple[str, Any]] = []

    def get_json(self, path: str, query: Any = None, timeout: float = 0) -> Any:
        self.paths.append((path, query))
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": self.items}


def test_the_lookup_keeps_only_the_groups_pods() -> None:
    listed = [member("w0"), member("w1", group="other"), "junk", {"spec": {"schedulingGroup": "junk"}}]
    api = ListedPods(listed)
    got = lookups.fetch(api, [("GroupPods", "ml", "llama-gang")], _snapshot())
    assert [p["metadata"]["name"] for p in got.related] == ["w0"]
    assert got.looked_up == {}
    assert api.paths == [
        ("/api/v1/namespaces/ml/pods", [("fieldSelector", "spec.nodeName="), ("limit", 500)])
    ]
