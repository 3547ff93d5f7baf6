"""explain(): class, matching devices per node and product, and why a request would not be allocated."""

from __future__ import annotations

from engine_helpers import SEED, objs

from webhook.dra.inventory import Inventory
from webhook.engine.explain import explain
from webhook.policy.load import source_objects


def seed(*names: str) -> list:  # type: ignore[type-arg]
    out = []
    for n in names:
        out.extend(source_objects((SEED / n).read_text(encoding="utf-8"), n))
    return out


def test_training_claim_matches_a100s_on_node1_but_the_constraint_blocks_it(
    seed_inventory: Inventory,
) -> None:
    ex = explain(seed("deviceclasses.yaml", "training-claim.yaml"), seed_inventory)
    claim = next(e for e in ex if e.object.kind == "ResourceClaim")
    (alt,) = claim.alternatives
    assert alt.device_class == "gpu.nvidia.com-a100" and alt.class_found
    assert ("node1", "NVIDIA A100 80GB PCIe", 4) in [(m.node, m.product, m.count) for m in alt.by_node]
    assert claim.satisfiable is False
    assert "gpu.nvidia.com/nvlinkInterconnect is published by no device" in claim.reasons[0]
    pod = next(e for e in ex if e.object.kind == "Pod")
    assert pod.source == "ResourceClaim training-gpu-claim" and pod.claim == "training-gpus"
    assert "CANNOT be allocated" in pod.render()


def test_mig_class_with_wrong_attribute_matches_nothing(seed_inventory: Inventory) -> None:
    ex = explain(seed("deviceclasses.yaml", "inference-deployment.yaml"), seed_inventory)
    dep = next(e for e in ex if e.object.kind == "Deployment")
    (alt,) = dep.alternatives
    assert alt.matched == 0 and dep.satisfiable is False
    assert "match no device" in alt.reasons[0]
    assert alt.errors  # migProfile is not a key of the MIG devices' attributes


def test_satisfiable_request_and_missing_class_and_unresolved_template(seed_inventory: Inventory) -> None:
    text = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c, namespace: ml}
spec:
  devices:
    requests:
    - name: h
      exactly: {deviceClassName: gpu.nvidia.com-h100, count: 8}
    - name: b
      exactly: {deviceClassName: gpu.nvidia.com-b200}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml}
spec:
  containers: [{name: c, image: x}]
  resourceClaims: [{name: g, resourceClaimTemplateName: nowhere}]
"""
    ex = explain(seed("deviceclasses.yaml") + objs(text), seed_inventory)
    by_req = {(e.object.kind, e.request): e for e in ex}
    h = by_req[("ResourceClaim", "h")]
    # h alone fits on one node, but the claim is allocated as a whole: b's missing class stops it.
    assert h.alternatives[0].satisfiable is True and h.alternatives[0].per_node_max == 8
    assert h.satisfiable is False and h.reasons == (
        "request 'b': DeviceClass gpu.nvidia.com-b200 does not exist",
    )
    b = by_req[("ResourceClaim", "b")]
    assert b.satisfiable is False and "does not exist" in b.alternatives[0].reasons[0]
    p = by_req[("Pod", None)]
    assert p.satisfiable is False and "ml/nowhere is in neither" in p.reasons[0]
    assert p.to_json()["source"] == "unresolved ResourceClaimTemplate"


def test_without_inventory_nothing_is_judged() -> None:
    ex = explain(seed("deviceclasses.yaml", "training-claim.yaml"), Inventory.empty())
    assert all(e.satisfiable is None for e in ex if e.request)
    assert "not checked" in ex[0].render()


# -- the claim as a whole (Kubernetes 1.37 DRA) ---------------------------------------------------


def _explain_claim(spec: str, *inventory_objs: dict) -> list:  # type: ignore[type-arg]
    from test_allocate import inventory

    text = f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: c, namespace: ml}}
spec:
{spec}
"""
    return explain(objs(text), inventory(*inventory_objs))


def test_a_tainted_gpu_is_not_counted_for_a_claim_without_toleration() -> None:
    from test_allocate import gpu, slice_

    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    (ex,) = _explain_claim(
        "  devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 2}}]}",
        slice_("node-a", [gpu("gpu-0"), gpu("gpu-1", taints=[taint])]),
    )
    assert ex.satisfiable is False
    text = ex.render()
    assert "CANNOT be allocated" in text and "gpu-1 has taint gpu.nvidia.com/xid=79:NoSchedule" in text


def test_a_full_gpu_and_its_partition_over_the_counter_set_cannot_be_allocated() -> None:
    from test_allocate import COUNTERS, PARTITIONS

    full, part = _explain_claim(
        """  devices:
    requests:
    - {name: full, exactly: {deviceClassName: gpu.nvidia.com}}
    - {name: part, exactly: {deviceClassName: mig.nvidia.com}}""",
        COUNTERS,
        PARTITIONS,
    )
    # Each request alone matches a device on node-a; together they need 120Gi of an 80Gi set.
    assert full.alternatives[0].satisfiable and part.alternatives[0].satisfiable
    assert full.satisfiable is False and part.satisfiable is False
    assert "counter gpu-0-counters/memory" in full.render()


def test_per_device_node_selection_counts_each_device_on_its_own_node() -> None:
    from test_allocate import gpu, slice_

    def on(node: str) -> dict:  # type: ignore[type-arg]
        return {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }

    devices = [gpu("gpu-0", nodeSelector=on("node-a")), gpu("gpu-1", nodeSelector=on("node-b"))]
    (ex,) = _explain_claim(
        "  devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 2}}]}",
        slice_(None, devices, perDeviceNodeSelection=True),
    )
    assert ex.satisfiable is False and "on node-a; 1 match there" in ex.render()
    (one,) = _explain_claim(
        "  devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.nvidia.com}}]}",
        slice_(None, devices, perDeviceNodeSelection=True),
    )
    assert one.satisfiable is True and one.nodes == ("node-a", "node-b")
    assert "fits on: node-a, node-b" in one.render() and "device: gpus: gpu-0" in one.render()
