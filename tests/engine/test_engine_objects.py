"""The object model: three API versions in, one internal form, written back in the sender's version."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from webhook.dra.device import Version
from webhook.dra.inventory import Inventory, InventoryError, load_inventory, parse_inventory_text
from webhook.dra.objects import (
    ClaimSpec,
    claim_spec_of,
    convert_claim_spec,
    read_claim_spec,
    read_device_class,
    read_slice_devices,
    write_claim_spec,
)
from webhook.dra.workloads import pod_spec_of, replicas_of

V1_SPEC = yaml.safe_load("""
devices:
  requests:
  - name: gpus
    exactly:
      deviceClassName: gpu.nvidia.com-h100
      count: 2
      selectors:
      - cel: {expression: "device.attributes['gpu.nvidia.com'].architecture == 'Hopper'"}
      tolerations: [{key: maintenance, operator: Exists}]
  - name: any
    firstAvailable:
    - {name: big, deviceClassName: gpu.nvidia.com-h100}
    - {name: small, deviceClassName: gpu.nvidia.com-a100-mig-3g20gb, count: 2}
  constraints:
  - requests: [gpus]
    matchAttribute: gpu.nvidia.com/nvlinkDomain
  config:
  - requests: [gpus]
    opaque:
      driver: gpu.nvidia.com
      parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig}
""")

V1BETA1_SPEC = yaml.safe_load("""
devices:
  requests:
  - name: gpus
    deviceClassName: gpu.nvidia.com-h100
    count: 2
    selectors:
    - cel: {expression: "device.attributes['gpu.nvidia.com'].architecture == 'Hopper'"}
    tolerations: [{key: maintenance, operator: Exists}]
  - name: any
    firstAvailable:
    - {name: big, deviceClassName: gpu.nvidia.com-h100}
    - {name: small, deviceClassName: gpu.nvidia.com-a100-mig-3g20gb, count: 2}
  constraints:
  - requests: [gpus]
    matchAttribute: gpu.nvidia.com/nvlinkDomain
  config:
  - requests: [gpus]
    opaque:
      driver: gpu.nvidia.com
      parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig}
""")


@pytest.mark.parametrize("version", ["v1", "v1beta2"])
def test_v1_and_v1beta2_read_like_v1beta1(version: str) -> None:
    a = read_claim_spec(V1_SPEC, f"resource.k8s.io/{version}", "")
    b = read_claim_spec(V1BETA1_SPEC, "resource.k8s.io/v1beta1", "")

    def strip(s: ClaimSpec) -> list[Any]:
        return [
            (
                r.name,
                r.device_class,
                r.count,
                [x.expression for x in r.selectors],
                [(x.name, x.device_class, x.count) for x in r.first_available],
            )
            for r in s.requests
        ]

    assert strip(a) == strip(b)
    assert a.requests[0].device_class == "gpu.nvidia.com-h100" and a.requests[0].count == 2
    assert a.requests[0].pointer == "/devices/requests/0/exactly"
    assert b.requests[0].pointer == "/devices/requests/0"
    assert a.requests[1].device_classes() == ("gpu.nvidia.com-h100", "gpu.nvidia.com-a100-mig-3g20gb")
    assert a.constraints[0].match_attribute == "gpu.nvidia.com/nvlinkDomain"
    assert a.config[0].parameters["kind"] == "GpuConfig"


def test_round_trip_in_each_version_is_lossless() -> None:
    assert write_claim_spec(read_claim_spec(V1_SPEC, "resource.k8s.io/v1"), "resource.k8s.io/v1") == V1_SPEC
    assert (
        write_claim_spec(read_claim_spec(V1BETA1_SPEC, "resource.k8s.io/v1beta1"), "resource.k8s.io/v1beta1")
        == V1BETA1_SPEC
    )


def test_conversion_between_versions() -> None:
    assert convert_claim_spec(V1BETA1_SPEC, "resource.k8s.io/v1beta1", "resource.k8s.io/v1") == V1_SPEC
    assert convert_claim_spec(V1_SPEC, "resource.k8s.io/v1", "resource.k8s.io/v1beta1") == V1BETA1_SPEC


def test_all_mode_has_no_count_and_admin_access_is_read() -> None:
    spec = read_claim_spec(
        {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "exactly": {"deviceClassName": "c", "allocationMode": "All", "adminAccess": True},
                    }
                ]
            }
        },
        "resource.k8s.io/v1",
    )
    (r,) = spec.requests
    assert (r.allocation_mode, r.count, r.admin_access) == ("All", 0, True)
    assert "count" not in write_claim_spec(spec, "resource.k8s.io/v1")["devices"]["requests"][0]["exactly"]


def test_template_and_claim_pointers() -> None:
    tmpl = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {"spec": V1_SPEC},
    }
    read = claim_spec_of(tmpl)
    assert read is not None and read[1] == "/spec/spec"
    assert (
        read[0].requests[0].selectors[0].pointer
        == "/spec/spec/devices/requests/0/exactly/selectors/0/cel/expression"
    )
    assert claim_spec_of({"apiVersion": "v1", "kind": "ResourceClaim"}) is None


def test_wrong_types_are_treated_as_absent() -> None:
    spec = read_claim_spec(
        {"devices": {"requests": [5, {"name": 3, "exactly": "x", "count": "two"}], "constraints": "no"}},
        "resource.k8s.io/v1",
    )
    assert len(spec.requests) == 2 and spec.requests[1].count == 1 and spec.constraints == ()


def _slice(version: str) -> dict[str, Any]:
    body = {
        "attributes": {
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "index": {"int": 0},
            "driverVersion": {"version": "550.54.15"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0"},
            "coherent": {"bool": False},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }
    dev: dict[str, Any] = (
        {"name": "gpu-0", "basic": body} if version == "v1beta1" else {"name": "gpu-0", **body}
    )
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1", "pool": {"name": "n1"}, "devices": [dev]},
    }


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_slice_devices_in_every_version(version: str) -> None:
    (d,) = read_slice_devices(_slice(version))
    assert (d.driver, d.pool, d.name, d.node) == ("gpu.nvidia.com", "n1", "gpu-0", "n1")
    attrs = d.attributes["gpu.nvidia.com"]
    assert (
        attrs["productName"] == "NVIDIA H100 80GB HBM3" and attrs["index"] == 0 and attrs["coherent"] is False
    )
    assert isinstance(attrs["driverVersion"], Version)
    assert d.attributes["resource.kubernetes.io"]["pcieRoot"] == "pci0"
    assert d.capacity["gpu.nvidia.com"]["memory"] == "80Gi"


def test_device_class() -> None:
    dc = read_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "x"},
            "spec": {
                "selectors": [{"cel": {"expression": "true"}}],
                "extendedResourceName": "nvidia.com/gpu",
            },
        }
    )
    assert (dc.name, dc.selectors[0].expression, dc.extended_resource_name) == ("x", "true", "nvidia.com/gpu")


WORKLOADS = {
    "Pod": ({"spec": {"containers": []}}, "/spec", 1),
    "PodTemplate": ({"template": {"spec": {"containers": []}}}, "/template/spec", 1),
    "Deployment": ({"spec": {"replicas": 6, "template": {"spec": {}}}}, "/spec/template/spec", 6),
    "ReplicaSet": ({"spec": {"template": {"spec": {}}}}, "/spec/template/spec", 1),
    "StatefulSet": ({"spec": {"replicas": 3, "template": {"spec": {}}}}, "/spec/template/spec", 3),
    "DaemonSet": ({"spec": {"template": {"spec": {}}}}, "/spec/template/spec", 1),
    "Job": (
        {"spec": {"parallelism": 4, "completions": 2, "template": {"spec": {}}}},
        "/spec/template/spec",
        2,
    ),
    "ReplicationController": ({"spec": {"replicas": 0, "template": {"spec": {}}}}, "/spec/template/spec", 0),
    "CronJob": (
        {"spec": {"jobTemplate": {"spec": {"parallelism": 5, "template": {"spec": {}}}}}},
        "/spec/jobTemplate/spec/template/spec",
        5,
    ),
}


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_pod_spec_of_every_workload_kind(kind: str) -> None:
    body, pointer, replicas = WORKLOADS[kind]
    obj = {"kind": kind, **body}
    found = pod_spec_of(obj)
    assert found is not None and found[0] == pointer
    assert replicas_of(obj) == replicas


def test_pod_spec_of_other_kinds_and_broken_specs() -> None:
    assert pod_spec_of({"kind": "Service", "spec": {}}) is None
    assert pod_spec_of({"kind": "Deployment", "spec": {"template": "x"}}) is None


INVENTORY_LIST = """
apiVersion: v1
kind: List
items:
- apiVersion: resource.k8s.io/v1beta1
  kind: ResourceSlice
  metadata: {name: a}
  spec:
    driver: gpu.nvidia.com
    nodeName: n1
    pool: {name: n1}
    devices:
    - name: gpu-0
      basic: {attributes: {productName: {string: A100}}}
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {name: gpu.nvidia.com-a100}
  spec: {selectors: [{cel: {expression: "true"}}]}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: ignored}
"""


def test_inventory_from_kubectl_list(tmp_path: Any) -> None:
    p = tmp_path / "inv.yaml"
    p.write_text(INVENTORY_LIST)
    inv = load_inventory(p)
    assert [d.name for d in inv.devices] == ["gpu-0"] and list(inv.classes) == ["gpu.nvidia.com-a100"]
    assert inv.devices_by_node() == {"n1": list(inv.devices)}
    assert ("gpu.nvidia.com", "productName") in inv.published_attributes()
    j = tmp_path / "inv.json"
    import json

    j.write_text(json.dumps(yaml.safe_load(INVENTORY_LIST)))
    assert load_inventory(j).devices == inv.devices
    assert Inventory.empty().is_empty


def test_inventory_errors_name_the_file(tmp_path: Any) -> None:
    with pytest.raises(InventoryError, match=r"missing\.yaml: inventory file not found"):
        load_inventory(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("items: [\n")
    with pytest.raises(InventoryError, match=r"bad.yaml:\d+: not valid YAML"):
        load_inventory(bad)
    with pytest.raises(InventoryError, match="expected Kubernetes objects"):
        parse_inventory_text("- 1\n- 2\n", "x.yaml")


def test_per_node_capacity_groups_by_constraint_and_counts_shared_devices() -> None:
    from webhook.dra.device import Device
    from webhook.engine.resolve import per_node_capacity

    def dev(node: str | None, dom: str | None) -> Device:
        attrs = {"gpu.nvidia.com": {"nvlinkDomain": dom}} if dom else {"gpu.nvidia.com": {}}
        return Device("gpu.nvidia.com", "p", f"{node}-{dom}", node, attrs, {})  # type: ignore[arg-type]

    devices = [
        dev("n1", "a"),
        dev("n1", "a"),
        dev("n1", "b"),
        dev("n2", None),
        dev("n2", None),
        dev("n2", None),
    ]
    assert per_node_capacity(devices)[0] == 3  # n1 and n2 both have three
    assert per_node_capacity(devices, ["gpu.nvidia.com/nvlinkDomain"]) == (2, "n1")
    # A device without a node (network-attached) is reachable from every node.
    assert per_node_capacity([*devices, dev(None, "a")], ["gpu.nvidia.com/nvlinkDomain"]) == (3, "n1")
    assert per_node_capacity([], []) == (0, None)


def test_pod_labels_merge_workload_and_template() -> None:
    from webhook.dra.workloads import containers_of, pod_labels_and_annotations

    obj = {
        "kind": "Deployment",
        "metadata": {"labels": {"a": "1", "b": "1"}, "annotations": {"x": "1"}},
        "spec": {
            "template": {
                "metadata": {"labels": {"b": "2"}, "annotations": {"y": 2}},
                "spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "c"}, "junk"]},
            }
        },
    }
    labels, annotations = pod_labels_and_annotations(obj)
    assert labels == {"a": "1", "b": "2"}
    assert annotations == {"x": "1"}  # non-string values are not annotations
    found = pod_spec_of(obj)
    assert found is not None
    refs = list(containers_of(*found))
    assert [(r.pointer, r.init) for r in refs] == [
        ("/spec/template/spec/initContainers/0", True),
        ("/spec/template/spec/containers/0", False),
    ]


# -- the v1.37 fields ----------------------------------------------------------------------------

V137_INVENTORY = """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: counters}
spec:
  driver: gpu.nvidia.com
  pool: {name: node-a, generation: 1, resourceSliceCount: 2}
  nodeName: node-a
  sharedCounters:
  - name: gpu-0-counters
    counters: {memory: {value: 80Gi}, multiprocessors: {value: "132"}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: devices}
spec:
  driver: gpu.nvidia.com
  pool: {name: node-a, generation: 1, resourceSliceCount: 2}
  perDeviceNodeSelection: true
  devices:
  - name: gpu-0
    nodeName: node-a
    allowMultipleAllocations: true
    attributes:
      productName: {string: NVIDIA H100 80GB HBM3}
      resource.kubernetes.io/numaNode: {ints: [0, 1]}
    capacity:
      memory:
        value: 80Gi
        requestPolicy:
          default: 10Gi
          validRange: {min: 10Gi, step: 10Gi}
    consumesCounters:
    - counterSet: gpu-0-counters
      counters: {memory: {value: 80Gi}}
    taints:
    - {key: gpu.nvidia.com/xid, value: "79", effect: NoSchedule, timeAdded: "2026-12-01T00:00:00Z"}
    bindsToNode: true
    bindingConditions: [attached]
  - name: remote
    nodeSelector:
      nodeSelectorTerms:
      - matchExpressions: [{key: rack, operator: In, values: [r1]}]
  - name: everywhere
    allNodes: true
---
apiVersion: resource.k8s.io/v1
kind: DeviceTaintRule
metadata: {name: drain-gpu-0}
spec:
  deviceSelector: {driver: gpu.nvidia.com, device: gpu-0}
  taint: {key: maintenance, effect: NoExecute}
---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {rack: r1}}
"""


def test_v137_slice_fields_are_read_not_dropped() -> None:
    inv = parse_inventory_text(V137_INVENTORY)
    assert inv.counter_sets[("gpu.nvidia.com", "node-a", "gpu-0-counters")] == {
        "memory": "80Gi",
        "multiprocessors": "132",
    }
    gpu, remote, everywhere = inv.devices
    assert gpu.node == "node-a" and gpu.allow_multiple_allocations
    assert gpu.list_attributes["resource.kubernetes.io"]["numaNode"] == (0, 1)
    assert "numaNode" not in gpu.attributes.get("resource.kubernetes.io", {})
    policy = gpu.capacity_policy["gpu.nvidia.com"]["memory"]
    assert str(policy.default) == "10Gi" and str(policy.step) == "10Gi"
    (use,) = gpu.consumes_counters
    assert use.counter_set == "gpu-0-counters" and use.counters == {"memory": "80Gi"}
    assert [t.describe() for t in inv.taints_of(gpu)] == [
        "gpu.nvidia.com/xid=79:NoSchedule",
        "maintenance:NoExecute (DeviceTaintRule drain-gpu-0)",
    ]
    assert gpu.binds_to_node and gpu.binding_conditions == ("attached",)
    assert remote.node is None and remote.node_selector is not None and not remote.all_nodes
    assert everywhere.node is None and everywhere.all_nodes
    assert inv.node_labels == {"node-a": {"rack": "r1"}}
    assert inv.taints_of(remote) == ()


def test_request_tolerations_and_capacity_are_read_and_written_back() -> None:
    raw = yaml.safe_load("""
devices:
  requests:
  - name: share
    exactly:
      deviceClassName: gpu.nvidia.com
      capacity: {requests: {memory: 10Gi}}
      tolerations: [{key: gpu.nvidia.com/xid, operator: Exists, effect: NoSchedule}]
  - name: alt
    firstAvailable:
    - name: one
      deviceClassName: gpu.nvidia.com
      capacity: {requests: {memory: 20Gi}}
      tolerations: [{operator: Exists}]
  constraints:
  - {requests: [share, alt], distinctAttribute: gpu.nvidia.com/uuid}
""")
    spec = read_claim_spec(raw, "resource.k8s.io/v1")
    share, alt = spec.requests
    assert share.capacity_requests == {"memory": "10Gi"}
    assert share.tolerations[0].key == "gpu.nvidia.com/xid" and share.tolerations[0].operator == "Exists"
    assert alt.first_available[0].capacity_requests == {"memory": "20Gi"}
    assert alt.first_available[0].tolerations[0].operator == "Exists"
    assert spec.constraints[0].distinct_attribute == "gpu.nvidia.com/uuid"
    assert write_claim_spec(spec, "resource.k8s.io/v1") == raw
