"""CEL attribute lint judged by the driver serving the cluster: what NVIDIA's DRA driver publishes is
known (its Fabric Manager attributes, the standard `resource.kubernetes.io/numaNode`, IMEX
channels), and suggestions name only attributes the inventory, or that driver's schema, has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.rules.conftest import FIXTURES, load_docs, read_sources
from webhook.core.findings import Finding, Mode
from webhook.core.source import SourceObject
from webhook.dra.drivers import detect
from webhook.dra.inventory import Inventory, load_inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.model import CelLintPolicy, PolicySet

NV = Path(__file__).parent / "fixtures" / "nvidia"
ENFORCE = PolicySet(cel_lint=(CelLintPolicy(name="strict", mode=Mode.ENFORCE),))


@pytest.fixture(scope="module")
def nv_inventory() -> Inventory:
    return load_inventory(NV / "inventory.yaml")


def _run(objs: list[SourceObject], inventory: Inventory | None = None, **ctx: Any) -> list[Finding]:
    r = evaluate(objs, ENFORCE, inventory or Inventory.empty(), Context(**ctx), rule_modules=("cel_lint",))
    assert not [f for f in r.findings if f.rule.startswith("internal/")], r.findings
    return list(r.findings)


def _template(expression: str, cls: str = "gpu.nvidia.com") -> SourceObject:
    return SourceObject({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": cls, "selectors": [{"cel": {"expression": expression}}]}}]}}},
    })


NVIDIA_SELECTORS = [
    "device.attributes['resource.kubernetes.io'].numaNode == 0",
    "device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:17'",
    "device.attributes['gpu.nvidia.com'].gpuModuleID <= 2",
    "device.attributes['gpu.nvidia.com'].partition2 == 9",
]


@pytest.mark.parametrize("expression", NVIDIA_SELECTORS)
def test_nvidia_attributes_are_known_with_its_inventory(nv_inventory: Inventory, expression: str) -> None:
    classes = read_sources(NV / "deviceclasses.yaml")
    assert [f for f in _run([*classes, _template(expression)], nv_inventory)
            if f.rule == "cel/unknown-attribute"] == []
    # Reviewed without an inventory beside NVIDIA's chart classes: the same verdict.
    assert [f for f in _run([*classes, _template(expression)]) if f.rule.startswith("cel/")] == []


@pytest.mark.parametrize("expression", NVIDIA_SELECTORS[2:])
def test_nvidia_only_attributes_are_unknown_to_the_bundled_driver(expression: str) -> None:
    found = [f for f in _run([_template(expression)], driver_schema="draguard")
             if f.rule == "cel/unknown-attribute"]
    assert found and found[0].mode is Mode.ENFORCE


def test_suggestions_come_from_nvidias_schema_not_the_bundled_one() -> None:
    classes = read_sources(NV / "deviceclasses.yaml")
    # `nvlink` is an alias of the bundled driver's `nvlinkDomain`, which NVIDIA's driver does not publish.
    [f] = [f for f in _run([*classes, _template("device.attributes['gpu.nvidia.com'].nvlink == 'x'")])
           if f.rule == "cel/unknown-attribute"]
    assert "nvlinkDomain" not in f.message + (f.fix or "")
    assert "gpuModuleID" in (f.fix or "")  # the names listed are NVIDIA's
    [f] = [f for f in _run([*classes, _template("device.attributes['gpu.nvidia.com'].moduleID == 1")])
           if f.rule == "cel/unknown-attribute"]
    assert "did you mean `gpuModuleID`" in (f.fix or "")


def test_numa_node_in_the_driver_domain_points_at_the_standard_key(nv_inventory: Inventory) -> None:
    [f] = [f for f in _run([_template("device.attributes['gpu.nvidia.com'].numaNode == 0")], nv_inventory)
           if f.rule == "cel/unknown-attribute"]
    assert "'numaNode' is published in domain 'resource.kubernetes.io'" in f.message
    assert f.fix == "use device.attributes['resource.kubernetes.io'].numaNode"


def test_suggestions_with_an_inventory_name_only_what_it_publishes() -> None:
    # The bundled driver's schema knows `nvlinkDomain`, but these devices do not publish it: naming it
    # would make the selector match nothing.
    inventory = Inventory.from_objects(load_docs(FIXTURES / "inventory.yaml"))
    expression = "device.attributes['gpu.nvidia.com'].nvlink == 'x'"
    [f] = [f for f in _run([_template(expression, "a100")], inventory) if f.rule == "cel/unknown-attribute"]
    assert "nvlinkDomain" not in f.message + (f.fix or "")
    published = {n for d in inventory.devices for n in d.attributes.get("gpu.nvidia.com", {})}
    listed = (f.fix or "").split(": ", 1)[1].split(", ")
    assert set(listed) <= published


def test_imex_channel_class_is_clean_and_typos_get_the_channel_attribute(nv_inventory: Inventory) -> None:
    classes = read_sources(NV / "deviceclasses.yaml")
    assert [f for f in _run(classes, nv_inventory) if f.rule.startswith("cel/")] == []
    typo = ("device.driver == 'compute-domain.nvidia.com' && "
            "device.attributes['compute-domain.nvidia.com'].ID == 0")
    [f] = [f for f in _run([_template(typo, "compute-domain-default-channel.nvidia.com")], nv_inventory)
           if f.rule == "cel/unknown-attribute"]
    assert "did you mean `id`" in (f.fix or "")


def test_detection_evidence(nv_inventory: Inventory) -> None:
    assert detect(None).schema.name == "draguard"
    assert detect(None, nv_inventory.devices).schema.name == "nvidia"
    bundled = Inventory.from_objects(load_docs(FIXTURES / "inventory.yaml"))
    assert detect("nvidia", bundled.devices).reason == "set to nvidia"
    assert detect(None, requested=["vfio.gpu.nvidia.com"]).schema.name == "nvidia"
    # `gpu.nvidia.com` alone is also the driver's name: no evidence either way.
    assert detect(None, requested=["gpu.nvidia.com"]).schema.name == "draguard"
    with pytest.raises(ValueError, match="unknown driver schema 'amd'; use one of: draguard, nvidia"):
        detect("amd")


# -- matchAttribute constraints (structure/interconnect) ----------------------------------------------


def _structure(objs: list[SourceObject], inventory: Inventory | None = None, **ctx: Any) -> list[Finding]:
    r = evaluate(objs, PolicySet.empty(), inventory or Inventory.empty(), Context(**ctx),
                 rule_modules=("structure",))
    assert not [f for f in r.findings if f.rule.startswith("internal/")], r.findings
    return [f for f in r.findings if f.rule == "structure/interconnect"]


def test_fabric_manager_partition_constraint_is_an_interconnect(nv_inventory: Inventory) -> None:
    fm = read_sources(NV / "fm-partition-templates.yaml")
    assert _structure(fm) == []
    assert _structure(fm, nv_inventory) == []
    # The bundled driver publishes no partitions: there the constraint never holds.
    [f] = _structure(fm, driver_schema="draguard")
    assert f.mode is Mode.ENFORCE and "partition2" in f.message


def test_interconnect_fixes_name_the_drivers_own_attribute(nv_inventory: Inventory) -> None:
    doc = load_docs(NV / "fm-partition-templates.yaml")[0]
    doc["spec"]["spec"]["devices"]["constraints"][0]["matchAttribute"] = "gpu.nvidia.com/partiton2"
    [f] = _structure([SourceObject(doc)], nv_inventory)
    assert f.fix == "constrain on 'gpu.nvidia.com/partition2' (matchAttribute: gpu.nvidia.com/partition2)"
    del doc["spec"]["spec"]["devices"]["constraints"]
    [f] = _structure([SourceObject(doc)], nv_inventory)
    assert f.mode is Mode.WARN and "matchAttribute: gpu.nvidia.com/partition2" in (f.fix or "")
    assert "nvlinkDomain" not in (f.fix or "")


def test_nvidia_chart_classes_guard_the_driver_where_no_file_defines_them() -> None:
    # As NVIDIA's own test specs write it: a selector without a driver check on the chart's class.
    selector = 'device.attributes["gpu.nvidia.com"].productName == "NONEXISTENT-GPU-XYZ"'
    findings = _run([_template(selector, "gpu.nvidia.com")])
    assert [f for f in findings if f.rule == "cel/driver-guard"] == []
    # A class no installation creates, reviewed with its definition: it pins nothing, so the claim's
    # selector is warned about (on the claim; the class gets its own warning).
    loose = SourceObject({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                          "metadata": {"name": "my-gpus"},
                          "spec": {"selectors": [{"cel": {"expression": selector}}]}})
    findings = _run([loose, _template(selector, "my-gpus")])
    guards = [f.object.kind for f in findings if f.rule == "cel/driver-guard"]
    assert guards == ["DeviceClass", "ResourceClaimTemplate"]
    # The same class where review cannot see it: whether it pins the driver is unknown, no advice.
    findings = _run([_template(selector, "my-gpus")])
    assert [f for f in findings if f.rule == "cel/driver-guard"] == []


def test_attributes_of_older_nvidia_releases_are_known() -> None:
    # v25.3 published index/minor/parentIndex/pcieBusID in the driver domain (removed in v25.8).
    classes = read_sources(NV / "deviceclasses.yaml")
    for expression in ("device.attributes['gpu.nvidia.com'].index == 0",
                       "device.attributes['gpu.nvidia.com'].parentIndex == 1"):
        assert [f for f in _run([*classes, _template(expression, "mig.nvidia.com")])
                if f.rule == "cel/unknown-attribute"] == []
