"""The allocator (webhook/engine/allocate.py): a claim judged as a whole on one node, as the scheduler."""

from __future__ import annotations

from typing import Any

import yaml

from webhook.dra.inventory import Inventory, parse_inventory_text
from webhook.dra.objects import read_claim_spec
from webhook.engine.allocate import allocate, describe_picks

CLASSES = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com}
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: mig.nvidia.com}
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
"""


def gpu(name: str, **extra: Any) -> dict[str, Any]:
    dev: dict[str, Any] = {
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{name}"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }
    dev.update(extra)
    return dev


def slice_(node: str | None, devices: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "driver": "gpu.nvidia.com",
        "pool": {"name": node or "pool", "generation": 1, "resourceSliceCount": 1},
    }
    if node is not None:
        body["nodeName"] = node
    body["devices"] = devices
    body.update(spec)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"s-{node}"},
        "spec": body,
    }


def inventory(*objs: dict[str, Any]) -> Inventory:
    return parse_inventory_text(CLASSES + "".join("---\n" + yaml.safe_dump(o) for o in objs))


def claim(text: str) -> Any:
    return read_claim_spec(yaml.safe_load(text), "resource.k8s.io/v1")


TWO_GPUS = claim("""
devices:
  requests:
  - name: gpus
    exactly: {deviceClassName: gpu.nvidia.com, count: 2}
""")


# -- taints ------------------------------------------------------------------------------------


def test_a_noschedule_taint_without_toleration_blocks_the_device() -> None:
    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    inv = inventory(slice_("node-a", [gpu("gpu-0"), gpu("gpu-1", taints=[taint])]))
    v = allocate(TWO_GPUS, inv)
    assert v.allocatable is False
    assert "gpu-1 has taint gpu.nvidia.com/xid=79:NoSchedule" in v.reasons[0]
    assert "2 match there, 1 usable" in v.reasons[0]
    tolerated = claim("""
devices:
  requests:
  - name: gpus
    exactly:
      deviceClassName: gpu.nvidia.com
      count: 2
      tolerations: [{key: gpu.nvidia.com/xid, operator: Exists, effect: NoSchedule}]
""")
    assert allocate(tolerated, inv).allocatable is True


def test_none_effect_never_blocks_and_noexecute_does() -> None:
    info = {"key": "gpu.nvidia.com/unmonitored", "effect": "None"}
    inv = inventory(slice_("node-a", [gpu("gpu-0"), gpu("gpu-1", taints=[info])]))
    assert allocate(TWO_GPUS, inv).allocatable is True
    rule = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "drain"},
        "spec": {"deviceSelector": {"device": "gpu-0"}, "taint": {"key": "drain", "effect": "NoExecute"}},
    }
    v = allocate(TWO_GPUS, inventory(slice_("node-a", [gpu("gpu-0"), gpu("gpu-1")]), rule))
    assert v.allocatable is False and "drain:NoExecute (DeviceTaintRule drain)" in v.reasons[0]


def _tolerating(toleration: str) -> Any:
    return claim(f"""
devices:
  requests:
  - name: gpu
    exactly:
      deviceClassName: gpu.nvidia.com
      tolerations: [{toleration}]
""")


def test_a_pod_given_a_noexecute_device_is_evicted_unless_its_toleration_names_noexecute() -> None:
    # kube-scheduler v1.37.2 allocates a NoExecute-tainted device to a toleration without an effect;
    # the device taint eviction controller then deletes the pod at once (seen on the local cluster).
    taint = {"key": "maintenance", "effect": "NoExecute"}
    inv = inventory(slice_("node-a", [gpu("gpu-0", taints=[taint])]))
    bare = allocate(_tolerating("{key: maintenance, operator: Exists}"), inv)
    assert bare.allocatable is True
    assert [n for n in bare.notes if "eviction" in n] == [
        "request 'gpu' gets gpu-0, tainted maintenance:NoExecute: the device taint eviction controller "
        "deletes the pod as soon as it is scheduled; no toleration of the request names effect NoExecute "
        "(one without an effect lets the scheduler allocate the device, not the pod stay)"
    ]
    seconds = "{key: maintenance, operator: Exists, effect: NoExecute, tolerationSeconds: 30}"
    timed = allocate(_tolerating(seconds), inv)
    assert timed.allocatable is True
    assert any("deletes the pod 30 s after the taint was added" in n for n in timed.notes)
    kept = allocate(_tolerating("{key: maintenance, operator: Exists, effect: NoExecute}"), inv)
    assert kept.allocatable is True and not any("eviction" in n for n in kept.notes)
    # The scheduler may pick another matching device than the one shown: a tainted one is named too.
    two = inventory(slice_("node-a", [gpu("gpu-0"), gpu("gpu-1", taints=[taint])]))
    either = allocate(_tolerating("{key: maintenance, operator: Exists}"), two)
    assert either.allocatable is True and [p.device.name for p in either.picks] == ["gpu-0"]
    assert [n for n in either.notes if "eviction" in n] == [
        "request 'gpu' may get gpu-1 instead (the scheduler's choice among the matching devices), tainted "
        "maintenance:NoExecute: the device taint eviction controller deletes the pod as soon as it is "
        "scheduled; no toleration of the request names effect NoExecute (one without an effect lets the "
        "scheduler allocate the device, not the pod stay)"
    ]
    # A NoSchedule taint evicts nobody, tolerated with or without an effect.
    inv = inventory(slice_("node-a", [gpu("gpu-0", taints=[{"key": "maintenance", "effect": "NoSchedule"}])]))
    quiet = allocate(_tolerating("{key: maintenance, operator: Exists}"), inv)
    assert quiet.allocatable is True and not any("eviction" in n for n in quiet.notes)


# -- counters ----------------------------------------------------------------------------------

COUNTERS = slice_(
    "node-a",
    [],
    sharedCounters=[{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}],
)
del COUNTERS["spec"]["devices"]
PARTITIONS = slice_(
    "node-a",
    [
        gpu(
            "gpu-0",
            consumesCounters=[{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}],
        ),
        {
            "name": "gpu-0-mig-3g40gb-0",
            "attributes": {"type": {"string": "mig"}, "profile": {"string": "3g.40gb"}},
            "capacity": {"memory": {"value": "40Gi"}},
            "consumesCounters": [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "40Gi"}}}],
        },
    ],
)
PARTITIONS["metadata"]["name"] = "devices"

FULL_PLUS_MIG = claim("""
devices:
  requests:
  - name: full
    exactly: {deviceClassName: gpu.nvidia.com}
  - name: part
    exactly: {deviceClassName: mig.nvidia.com}
""")


def test_a_full_gpu_and_its_own_partition_overdraw_the_counter_set() -> None:
    inv = inventory(COUNTERS, PARTITIONS)
    v = allocate(FULL_PLUS_MIG, inv)
    assert v.allocatable is False
    (reason,) = v.reasons
    assert "cannot be satisfied together" in reason
    assert "needs 40Gi of counter gpu-0-counters/memory; 0 of 80Gi left" in reason
    # Each alone fits.
    for name in ("full", "part"):
        alone = claim(
            f"devices: {{requests: [{{name: {name}, exactly: {{deviceClassName: "
            f"{'gpu' if name == 'full' else 'mig'}.nvidia.com}}}}]}}"
        )
        assert allocate(alone, inv).allocatable is True


def test_counters_held_by_another_claim_are_not_free() -> None:
    other = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "held", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "p", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "p",
                            "driver": "gpu.nvidia.com",
                            "pool": "node-a",
                            "device": "gpu-0-mig-3g40gb-0",
                        }
                    ]
                }
            }
        },
    }
    inv = inventory(COUNTERS, PARTITIONS, other)
    full = claim("devices: {requests: [{name: full, exactly: {deviceClassName: gpu.nvidia.com}}]}")
    v = allocate(full, inv)
    assert v.allocatable is False and "40Gi of 80Gi left" in v.reasons[0]
    part = claim("devices: {requests: [{name: p, exactly: {deviceClassName: mig.nvidia.com}}]}")
    v = allocate(part, inv)
    assert v.allocatable is False and "allocated to claim ml/held" in v.reasons[0]
    # Its own allocation does not count against the claim itself.
    assert allocate(part, inv, claim_key=("ml", "held")).allocatable is True


# -- per-device node selection -------------------------------------------------------------------


def test_devices_selected_per_node_count_only_on_their_node() -> None:
    def on(node: str) -> dict[str, Any]:
        return {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
            ]
        }

    inv = inventory(
        slice_(
            None,
            [gpu("gpu-0", nodeSelector=on("node-a")), gpu("gpu-1", nodeSelector=on("node-b"))],
            perDeviceNodeSelection=True,
        )
    )
    v = allocate(TWO_GPUS, inv)
    assert v.allocatable is False
    assert any("on node-a; 1 match there" in r for r in v.reasons)
    one = claim("devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com}}]}")
    assert allocate(one, inv).nodes == ("node-a", "node-b")
    everywhere = inventory(
        slice_(
            None, [gpu("gpu-0", allNodes=True), gpu("gpu-1", nodeName="node-b")], perDeviceNodeSelection=True
        )
    )
    assert allocate(TWO_GPUS, everywhere).nodes == ("node-b",)


def test_a_selector_on_labels_without_node_objects_is_not_guessed() -> None:
    rack = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]
    }
    devs = [gpu("gpu-0", nodeName="node-a"), gpu("gpu-1", nodeSelector=rack)]
    inv = inventory(slice_(None, devs, perDeviceNodeSelection=True))
    v = allocate(TWO_GPUS, inv)
    assert v.allocatable is None and "without the labels of node-a" in v.reasons[0]
    assert any("kubectl get nodes" in n for n in v.notes)
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": {"rack": "r1"}}}
    assert allocate(TWO_GPUS, inventory(slice_(None, devs, perDeviceNodeSelection=True), node)).nodes == (
        "node-a",
    )


# -- consumable capacity -------------------------------------------------------------------------

SHARED = gpu(
    "gpu-0",
    allowMultipleAllocations=True,
    capacity={
        "memory": {
            "value": "80Gi",
            "requestPolicy": {"default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}},
        }
    },
)


def shares(n: int, memory: str) -> Any:
    reqs = [
        {
            "name": f"s{i}",
            "exactly": {"deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": memory}}},
        }
        for i in range(n)
    ]
    return read_claim_spec({"devices": {"requests": reqs}}, "resource.k8s.io/v1")


def test_shares_are_rounded_up_by_the_request_policy() -> None:
    inv = inventory(slice_("node-a", [SHARED]))
    ok = allocate(shares(4, "15Gi"), inv)  # 4 x 20Gi
    assert ok.allocatable is True
    assert next(iter(describe_picks(ok.picks))) == "s0: gpu-0 (memory 20Gi)"
    v = allocate(shares(5, "15Gi"), inv)  # 5 x 20Gi > 80Gi
    assert v.allocatable is False and "capacity memory: needs 20Gi, 0 of 80Gi left" in v.reasons[0]
    over = allocate(shares(1, "90Gi"), inv)
    assert over.allocatable is False and "needs 90Gi, 80Gi of 80Gi left" in over.reasons[0]


def test_distinct_attribute_keeps_shares_on_different_devices() -> None:
    spec = shares(2, "10Gi")
    distinct = read_claim_spec(
        {
            "devices": {
                "requests": [
                    {
                        "name": r.name,
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "capacity": {"requests": {"memory": "10Gi"}},
                        },
                    }
                    for r in spec.requests
                ],
                "constraints": [{"distinctAttribute": "gpu.nvidia.com/uuid"}],
            }
        },
        "resource.k8s.io/v1",
    )
    assert allocate(spec, inventory(slice_("node-a", [SHARED]))).allocatable is True
    v = allocate(distinct, inventory(slice_("node-a", [SHARED])))
    assert v.allocatable is False and "distinctAttribute" in v.reasons[0]
    second = dict(SHARED, name="gpu-1", attributes={**SHARED["attributes"], "uuid": {"string": "GPU-1"}})
    assert allocate(distinct, inventory(slice_("node-a", [SHARED, second]))).allocatable is True


# -- the claim as a whole --------------------------------------------------------------------------


def test_first_available_falls_back_when_the_first_choice_breaks_a_constraint() -> None:
    devs = [
        gpu("gpu-0", attributes={"type": {"string": "gpu"}, "domain": {"string": "a"}}),
        gpu("gpu-1", attributes={"type": {"string": "gpu"}, "domain": {"string": "b"}}),
        gpu("gpu-2", attributes={"type": {"string": "gpu"}, "domain": {"string": "b"}}),
    ]
    spec = claim("""
devices:
  requests:
  - name: a
    exactly: {deviceClassName: gpu.nvidia.com}
  - name: b
    firstAvailable:
    - {name: two, deviceClassName: gpu.nvidia.com, count: 2}
    - {name: one, deviceClassName: gpu.nvidia.com}
  constraints:
  - {requests: [a, b], matchAttribute: gpu.nvidia.com/domain}
""")
    v = allocate(spec, inventory(slice_("node-a", devs)))
    assert v.allocatable is True
    assert [p.request for p in v.picks] == ["a", "b/one"]


def test_admin_access_may_use_a_device_another_claim_holds() -> None:
    other = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "x", "namespace": "ml"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "g", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}
                    ]
                }
            }
        },
    }
    inv = inventory(slice_("node-a", [gpu("gpu-0")]), other)
    user = claim("devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com}}]}")
    admin = claim(
        "devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com, adminAccess: true}}]}"
    )
    assert allocate(user, inv).allocatable is False
    assert allocate(admin, inv).allocatable is True


def test_a_search_past_its_bound_is_undecided_not_guessed() -> None:
    devs = [gpu(f"gpu-{i}", attributes={"type": {"string": "gpu"}, "slot": {"int": i}}) for i in range(16)]
    spec = claim("""
devices:
  requests:
  - name: g
    exactly: {deviceClassName: gpu.nvidia.com, count: 8}
  constraints:
  - {matchAttribute: gpu.nvidia.com/slot}
""")
    inv = inventory(slice_("node-a", devs))
    assert allocate(spec, inv).allocatable is False
    v = allocate(spec, inv, max_steps=50)
    assert v.allocatable is None and "too large to decide offline" in v.reasons[0]


def test_a_missing_class_names_the_request() -> None:
    spec = claim("devices: {requests: [{name: g, exactly: {deviceClassName: nope}}]}")
    v = allocate(spec, inventory(slice_("node-a", [gpu("gpu-0")])))
    assert v.allocatable is False and v.reasons == ("request 'g': DeviceClass nope does not exist",)


# -- structure/unsatisfiable -------------------------------------------------------------------------


def test_structure_unsatisfiable_reports_a_claim_that_fits_only_request_by_request() -> None:
    from engine_helpers import run

    text = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c, namespace: ml}
spec:
  devices:
    requests:
    - {name: full, exactly: {deviceClassName: gpu.nvidia.com}}
    - {name: part, exactly: {deviceClassName: mig.nvidia.com}}
"""
    r = run(text, modules=("structure",), inventory=inventory(COUNTERS, PARTITIONS))
    (f,) = [f for f in r.findings if f.rule == "structure/unsatisfiable"]
    assert "cannot be allocated as a whole" in f.message and "counter gpu-0-counters/memory" in f.message
    assert f.line == 6  # spec.devices
    alone = text.replace("    - {name: part, exactly: {deviceClassName: mig.nvidia.com}}\n", "")
    r = run(alone, modules=("structure",), inventory=inventory(COUNTERS, PARTITIONS))
    assert not [f for f in r.findings if f.rule == "structure/unsatisfiable"]


def test_counters_published_in_slices_the_inventory_lacks_leave_the_answer_open() -> None:
    v = allocate(FULL_PLUS_MIG, inventory(PARTITIONS))
    assert v.allocatable is None
    assert "gpu-0 consumes counter set gpu-0-counters of pool node-a" in v.reasons[0]


def test_nodes_with_the_same_devices_are_judged_once_and_all_named() -> None:
    inv = inventory(*(slice_(n, [gpu("gpu-0")]) for n in ("node-a", "node-b", "node-c")))
    one = claim("devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com}}]}")
    assert allocate(one, inv).nodes == ("node-a", "node-b", "node-c")
    v = allocate(TWO_GPUS, inv)
    assert v.allocatable is False
    assert "on node-a; 1 match there, 1 usable" in v.reasons[0]
    assert v.reasons[-1] == "2 more node(s) with the same devices fail alike: node-b, node-c"


def test_hostile_claims_get_an_answer_not_a_traceback() -> None:
    devs = [gpu(f"gpu-{i}", attributes={"type": {"string": "gpu"}, "d": {"int": i % 7}}) for i in range(64)]
    inv = inventory(slice_("node-a", devs))
    alike = [{"name": f"s{j}", "deviceClassName": "gpu.nvidia.com", "count": 2} for j in range(8)]
    reqs = [{"name": f"r{i}", "firstAvailable": alike} for i in range(32)]
    wide = read_claim_spec(
        {"devices": {"requests": reqs, "constraints": [{"matchAttribute": "gpu.nvidia.com/d"}]}},
        "resource.k8s.io/v1",
    )
    v = allocate(wide, inv, max_steps=2_000)
    assert v.allocatable is None and v.reasons[0].startswith("too large to decide offline")
    bad_quantity = claim("""
devices:
  requests:
  - name: g
    exactly: {deviceClassName: gpu.nvidia.com, count: 1000000000, capacity: {requests: {memory: 1e99999}}}
""")
    v = allocate(bad_quantity, inv)
    assert v.allocatable is False and "needs 1000000000 device(s)" in v.reasons[0]
    assert "capacity request memory: '1e99999' is not a quantity" in v.reasons[0]
    policy = {"validRange": {"min": "-1", "step": "0"}}
    odd_policy = gpu(
        "gpu-0",
        allowMultipleAllocations=True,
        capacity={"memory": {"value": "80Gi", "requestPolicy": policy}},
    )
    assert allocate(shares(2, "10Gi"), inventory(slice_("node-a", [odd_policy]))).allocatable is True
