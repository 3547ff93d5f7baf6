"""A rebuilt inventory is warmed before it is published: the first review after a ResourceSlice,
DeviceClass or policy change finds the engine's per-inventory memos already built, and decides
exactly what a review against an unwarmed inventory decides."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import review, write_policies
from tests.server.test_overlay import Clock, Harness
from webhook.dra.inventory import Inventory
from webhook.server import admission
from webhook.server.admission import Snapshot

H100 = "gpu.nvidia.com-h100"
SELECTOR = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"


def selector_claim(name: str = "c1") -> dict[str, Any]:
    request = {"deviceClassName": H100, "selectors": [{"cel": {"expression": SELECTOR}}]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def class_exprs(inv: Inventory, name: str) -> tuple[str, ...]:
    return tuple(s.expression for s in inv.classes[name].selectors)


def decide(inv: Inventory, policies: Any, obj: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps(review(obj, group="resource.k8s.io", kind="ResourceClaim")).encode()
    out = admission.review(
        "validate", admission.parse_review(body), Snapshot(policies=policies, inventory=inv)
    )
    return out.document()


def add_slice(h: Harness) -> None:
    """A ResourceSlice change: one more node, a copy of an existing slice."""
    store = h.cache.reflectors["resourceslices"].store
    (ns, name), obj = next(iter(store.items()))
    new = copy.deepcopy(obj)
    new["metadata"].update(name=name + "-copy", resourceVersion="500")
    spec = new.get("spec") or {}
    if "nodeName" in spec:
        spec["nodeName"] = str(spec["nodeName"]) + "-copy"
    store[(ns, name + "-copy")] = new


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return Harness(write_policies(tmp_path / "policies"), Clock())


def test_rebuilt_inventory_has_every_class_matched_before_publication(harness: Harness) -> None:
    inv = harness.rb.build().inventory
    assert inv.classes
    for name in inv.classes:
        assert ("match", class_exprs(inv, name)) in inv._memo, name


def test_selectors_recent_claims_used_are_matched_again_on_a_new_inventory(harness: Harness) -> None:
    policies = harness.wh.snapshot.policies
    old = harness.rb.build().inventory
    decide(old, policies, selector_claim())
    key = ("match", (*class_exprs(old, H100), SELECTOR))
    assert key in old._memo  # the review memoised its match on the old inventory

    add_slice(harness)
    new = harness.rb.build().inventory
    assert new is not old and len(new.devices) > len(old.devices)
    assert key in new._memo  # ready before any review against the new inventory

    cold = Inventory(devices=new.devices, classes=new.classes, claims=new.claims, templates=new.templates)
    assert not cold._memo
    assert decide(new, policies, selector_claim()) == decide(cold, policies, selector_claim())


def test_unchanged_facts_keep_the_warmed_inventory(harness: Harness) -> None:
    first = harness.rb.build().inventory
    assert harness.rb.build().inventory is first


def test_policy_reload_warms_the_current_inventory(tmp_path: Path, harness: Harness) -> None:
    wh = harness.wh
    inv = harness.rb.build().inventory
    cold = Inventory(devices=inv.devices, classes=inv.classes, claims=inv.claims, templates=inv.templates)
    wh.set_inventory(cold)
    (Path(wh.opts.policies) / "tier.yaml").write_text(
        (Path(wh.opts.policies) / "tier.yaml").read_text().replace("enforce", "warn")
    )
    assert wh.load_policies()
    assert wh.snapshot.inventory is cold
    for name in cold.classes:
        assert ("match", class_exprs(cold, name)) in cold._memo, name
