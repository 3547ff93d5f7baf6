"""structure/interconnect gives NVLink advice only for NVIDIA GPUs: not for another driver's devices
(the DRA example driver's partitionable GPUs), nor for a class review cannot see."""

from __future__ import annotations

from typing import Any

from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.model import PolicySet


def _class(name: str, expression: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}  # fmt: skip


def _template(cls: str, count: int = 2) -> dict[str, Any]:
    # As the DRA example driver's partitionable-devices demo writes it: two devices, no constraint.
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "pair", "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": cls, "count": count}}]}}}}  # fmt: skip


def _advice(*objs: dict[str, Any]) -> list[str]:
    report = evaluate([SourceObject(o) for o in objs], PolicySet(), Inventory.empty(), Context(),
                      rule_modules=("structure",))
    return [f.message for f in report.findings if f.rule == "structure/interconnect"]


def test_nvidia_gpus_get_the_advice() -> None:
    # NVIDIA's chart's class, draguard's bundle classes, and a class of any name pinned to the driver.
    assert len(_advice(_template("gpu.nvidia.com"))) == 1
    assert len(_advice(_template("gpu.nvidia.com-h100"))) == 1
    pinned = _class("big-gpus", "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com']"
                                ".productName.startsWith('NVIDIA H100')")
    [msg] = _advice(pinned, _template("big-gpus"))
    assert "asks for 2 GPUs" in msg and "NVLink" in msg
    # One device needs no interconnect.
    assert _advice(_template("gpu.nvidia.com", count=1)) == []


def test_other_drivers_get_no_nvlink_advice() -> None:
    example = _class("gpu.example.com", "device.driver == 'gpu.example.com'")
    assert _advice(example, _template("gpu.example.com")) == []
    # Written the other way round, too.
    flipped = _class("fpga", '"fpga.example.com" == device.driver')
    assert _advice(flipped, _template("fpga")) == []


def test_classes_review_cannot_see_get_no_advice() -> None:
    # The example driver's class where no file defines it: review does not guess what it holds.
    assert _advice(_template("gpu.example.com")) == []
    # A class that pins nothing it can read (an `||` may let NVIDIA's GPUs in or not): no guess either,
    # unless its selectors read NVIDIA's attributes.
    either = _class("any", "device.driver == 'a.example.com' || device.driver == 'b.example.com'")
    assert _advice(either, _template("any")) == []
    nv_attrs = _class("h100s", "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'")
    assert len(_advice(nv_attrs, _template("h100s"))) == 1
