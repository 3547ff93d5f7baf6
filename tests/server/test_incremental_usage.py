"""The rebuild thread's quota usage is incremental (a claim's charge is computed once per
resourceVersion, and again for all claims only when devices or classes change), and its inventory
keeps the engine's memo when only claims or templates changed. Both must decide exactly what a
from-scratch computation decides, through any sequence of cluster changes."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest

from tests.server.test_overlay import Clock, Harness, claim
from webhook.dra.inventory import Inventory
from webhook.engine.quota import compute_usage

ROOT = Path(__file__).resolve().parents[2]
CLASSES = ["gpu.nvidia.com-h100", "gpu.nvidia.com-a100", "gpu.nvidia.com-a100-mig-3g20gb"]
NAMESPACES = ["team-a", "team-b", "team-c", "research"]


def _claim(rng: random.Random, i: int) -> dict[str, Any]:
    c = claim(f"c{i}", rng.choice(CLASSES), ns=rng.choice(NAMESPACES))
    exactly = c["spec"]["devices"]["requests"][0]["exactly"]
    if rng.random() < 0.2:
        exactly["allocationMode"] = "All"
    else:
        exactly["count"] = rng.randint(1, 4)
    return c


def _bigger_node(h: Harness, rv: int) -> None:
    """A new node with twice the devices of an existing one: All-mode charges grow."""
    store = h.cache.reflectors["resourceslices"].store
    (ns, name), obj = sorted(store.items(), key=lambda kv: kv[0])[0]
    new = copy.deepcopy(obj)
    new["metadata"].update(name=f"{name}-big{rv}", resourceVersion=str(rv))
    spec = new["spec"]
    spec["nodeName"] = f"{spec.get('nodeName', 'node')}-big{rv}"
    spec["pool"] = {**spec.get("pool", {}), "name": spec["nodeName"]}
    twins = [{**d, "name": d["name"] + "-x"} for d in copy.deepcopy(spec["devices"])]
    spec["devices"] = spec["devices"] + twins
    store[(ns, new["metadata"]["name"])] = new


def _from_scratch(h: Harness) -> Any:
    """What compute_usage says over the cached objects, on an inventory built without any memo."""
    view = h.rb.build_base()
    fresh = Inventory(devices=view.inventory.devices, classes=dict(view.inventory.classes))
    claims = h.cache.objects("resourceclaims")
    return compute_usage(claims, view.namespace_labels, h.wh.snapshot.policies, fresh), view


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_usage_equals_a_full_recount(seed: int) -> None:
    rng = random.Random(seed)
    h = Harness(ROOT / "policies", Clock())
    store = h.cache.reflectors["resourceclaims"].store
    ns_store = h.cache.reflectors["namespaces"].store
    for ns in NAMESPACES:
        ns_store[("", ns)] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {}}}
    rv = 1000
    memo_kept = memo_new = 0
    for step in range(120):
        rv += 1
        op = rng.random()
        expect = "claims"
        if op < 0.55 or not store:  # a new claim
            c = _claim(rng, step)
            c["metadata"]["resourceVersion"] = str(rv)
            store[(c["metadata"]["namespace"], c["metadata"]["name"])] = c
        elif op < 0.75:  # a claim changed (new resourceVersion, other count)
            key = rng.choice(sorted(store))
            c = copy.deepcopy(store[key])
            c["metadata"]["resourceVersion"] = str(rv)
            c["spec"]["devices"]["requests"][0]["exactly"]["count"] = rng.randint(1, 4)
            c["spec"]["devices"]["requests"][0]["exactly"].pop("allocationMode", None)
            store[key] = c
        elif op < 0.9:  # a claim deleted
            del store[rng.choice(sorted(store))]
        elif op < 0.95:  # a namespace joins or leaves a team
            expect = "none"
            ns = rng.choice(NAMESPACES)
            labels = {"draguard.io/team": rng.choice(["ml", "vision"])} if rng.random() < 0.7 else {}
            ns_store[("", ns)] = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": labels, "resourceVersion": str(rv)},
            }
        else:  # more devices: All-mode charges and class matches change
            expect = "devices"
            _bigger_node(h, rv)
        before = h.rb._inventory
        expected, view = _from_scratch(h)
        assert view.usage == expected, f"step {step}"
        assert h.rb.last_change == expect, f"step {step}"
        if before is not None and view.inventory is not before:
            if before.devices is view.inventory.devices:
                assert view.inventory._memo is before._memo
                memo_kept += 1
            else:
                assert view.inventory._memo is not before._memo
                memo_new += 1
    # The sequence exercised both paths, and usage was non-trivial.
    assert memo_kept > 20 and memo_new >= 1
    assert sum(view.usage.claims.values()) >= len(store)
