"""explain() on KEP-5004 extended resources: a pod asking for `deviceclass.resource.kubernetes.io/<class>`
or for a name a DeviceClass declares as its `extendedResourceName` gets the claim the scheduler would make
for it explained (the DRA example driver's and NVIDIA's samples in tests/corpus, against
examples/inventory.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.explain import explain

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus"
EXAMPLE = (ROOT / "examples" / "inventory.yaml").read_text()
INVENTORY = Inventory.from_objects(list(yaml.safe_load_all(EXAMPLE)))


def _objs(*docs: dict[str, Any]) -> list[SourceObject]:
    return [SourceObject(d) for d in docs]


def _file(rel: str) -> list[SourceObject]:
    return _objs(*(d for d in yaml.safe_load_all((CORPUS / rel).read_text()) if isinstance(d, dict)))


def _pod(limits: dict[str, Any]) -> dict[str, Any]:
    container = {"name": "c", "image": "x", "resources": {"limits": limits}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [container]}}  # fmt: skip


def test_the_implicit_class_name_is_explained() -> None:
    # The example driver's class is not in the example inventory: the request cannot be allocated.
    ex = explain(_file("dra-example-driver/extended-resource-request.yaml"), INVENTORY)
    [e] = ex  # pod1's example.com/gpu is served by no class of the input: a device-plugin resource
    assert e.object.name == "pod0" and e.satisfiable is False
    assert e.request == "deviceclass.resource.kubernetes.io/gpu.example.com"
    assert "DeviceClass gpu.example.com does not exist" in e.alternatives[0].reasons
    assert "KEP-5004" in e.render() and "CANNOT be allocated" in e.render()


def test_a_class_serving_a_name_is_explained_through_it() -> None:
    # NVIDIA's sample: its own DeviceClass serves nvidia.com/mig-1g.12gb; the example inventory has
    # no such MIG device.
    [e] = explain(_file("nvidia-dra-driver/extended-resources-mig-1g-12gb.yaml"), INVENTORY)
    assert e.request == "nvidia.com/mig-1g.12gb" and e.satisfiable is False
    [alt] = e.alternatives
    assert alt.device_class == "mig-1g-12gb.gpu.nvidia.com" and alt.class_found and alt.matched == 0
    assert "extendedResourceName of mig-1g-12gb.gpu.nvidia.com" in e.source


def test_what_the_inventory_has_can_be_allocated_and_counts_add_up() -> None:
    h100 = "deviceclass.resource.kubernetes.io/gpu.nvidia.com-h100"
    [e] = explain(_objs(_pod({h100: 8})), INVENTORY)
    assert e.satisfiable is True and e.alternatives[0].count == 8 and e.nodes
    # Two containers of one pod: one claim of their sum, more than any node has.
    pod = _pod({h100: 8})
    pod["spec"]["containers"].append({"name": "d", "image": "x", "resources": {"limits": {h100: 1}}})
    [e] = explain(_objs(pod), INVENTORY)
    assert e.satisfiable is False and e.alternatives[0].count == 9


def test_device_plugin_resources_are_not_explained() -> None:
    assert explain(_objs(_pod({"nvidia.com/gpu": 1, "cpu": "2"})), INVENTORY) == []
