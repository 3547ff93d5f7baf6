"""The allocator against an exhaustive oracle: small seeded scenarios, every assignment tried.

The oracle below shares no search code with webhook/engine/allocate.py: it enumerates every way to
give each request its devices and checks the result against the rules the scheduler applies
(taints, exclusive devices, counters, consumable capacity, constraints, other claims' holdings).
Only the request-policy arithmetic (webhook/dra/capacity.py) is shared.
"""

from __future__ import annotations

import itertools
import random
from fractions import Fraction
from typing import Any

import pytest

from webhook.dra.capacity import consumed, parse_quantity, violates
from webhook.dra.device import Device
from webhook.dra.inventory import Inventory
from webhook.dra.objects import read_claim_spec
from webhook.dra.quantity import Quantity
from webhook.dra.taints import untolerated
from webhook.engine.allocate import allocate, choices_of

SCENARIOS = 400
DRIVER = "gpu.nvidia.com"


def _scenario(seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rnd = random.Random(seed)
    devices: list[dict[str, Any]] = []
    for i in range(rnd.randint(2, 5)):
        dev: dict[str, Any] = {
            "name": f"d{i}",
            "attributes": {
                "type": {"string": rnd.choice(["gpu", "gpu", "mig"])},
                "g": {"int": rnd.randint(0, 1)},
            },
        }
        if rnd.random() < 0.3:
            dev["allowMultipleAllocations"] = True
            policy = {"validRange": {"min": "2", "step": "2"}} if rnd.random() < 0.5 else None
            dev["capacity"] = {"mem": {"value": "8", **({"requestPolicy": policy} if policy else {})}}
        elif rnd.random() < 0.5:
            dev["capacity"] = {"mem": {"value": str(rnd.choice([4, 8]))}}
        if rnd.random() < 0.4:
            dev["consumesCounters"] = [
                {"counterSet": "s", "counters": {"c": {"value": str(rnd.randint(1, 3))}}}
            ]
        if rnd.random() < 0.3:
            dev["taints"] = [
                {"key": rnd.choice(["k1", "k2"]), "effect": rnd.choice(["NoSchedule", "NoExecute", "None"])}
            ]
        devices.append(dev)
    objs: list[dict[str, Any]] = [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": t},
         "spec": {"selectors": [{"cel": {"expression": f"device.attributes['{DRIVER}'].type == '{t}'"}}]}}
        for t in ("gpu", "mig")
    ]  # fmt: skip
    objs.append(
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
         "spec": {"driver": DRIVER, "pool": {"name": "p"}, "nodeName": "n",
                  "sharedCounters": [{"name": "s", "counters": {"c": {"value": str(rnd.randint(2, 5))}}}],
                  "devices": devices}}
    )  # fmt: skip
    if rnd.random() < 0.3:
        held = rnd.choice(devices)
        result: dict[str, Any] = {"request": "x", "driver": DRIVER, "pool": "p", "device": held["name"]}
        if held.get("allowMultipleAllocations"):
            # A share as the scheduler records it: without a shareID it would hold the device whole.
            result["shareID"] = "00000000-0000-0000-0000-000000000001"
            result["consumedCapacity"] = {"mem": str(rnd.choice([2, 4, 6]))}
        objs.append(
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "o", "namespace": "x"},
             "status": {"allocation": {"devices": {"results": [result]}}}}
        )  # fmt: skip

    def body() -> dict[str, Any]:
        b: dict[str, Any] = {"deviceClassName": rnd.choice(["gpu", "gpu", "mig"]), "count": rnd.randint(1, 2)}
        if rnd.random() < 0.3:
            b["tolerations"] = [{"key": rnd.choice(["k1", "k2"]), "operator": "Exists"}]
        if rnd.random() < 0.3:
            b["capacity"] = {"requests": {"mem": str(rnd.randint(1, 5))}}
        return b

    requests: list[dict[str, Any]] = []
    for r in range(rnd.randint(1, 3)):
        if rnd.random() < 0.25:
            requests.append(
                {"name": f"r{r}", "firstAvailable": [{"name": f"s{k}", **body()} for k in range(2)]}
            )
        else:
            requests.append({"name": f"r{r}", "exactly": body()})
    claim: dict[str, Any] = {"devices": {"requests": requests}}
    if rnd.random() < 0.4:
        kind = rnd.choice(["matchAttribute", "distinctAttribute"])
        claim["devices"]["constraints"] = [{kind: f"{DRIVER}/g"}]
    return objs, claim


def _q(text: str) -> Fraction:
    q = parse_quantity(text)
    assert q is not None
    return q.value


def _takes(choice: Any, name: str, capacity: str, policy: Any) -> Fraction:
    """What one allocation consumes of a capacity (the request rounded by the policy)."""
    asked = choice.capacity_requests.get(name)
    return consumed(parse_quantity(asked) if asked else None, Quantity(_q(capacity)), policy).value


def _oracle(inv: Inventory, spec: Any) -> bool:
    """Whether any assignment of devices to the claim's requests satisfies every rule."""
    devices = list(inv.devices)
    held: dict[str, Any] = {}
    for rec in inv.claims.values():
        for r in rec.obj["status"]["allocation"]["devices"]["results"]:
            held[r["device"]] = r
    totals = {k[2]: {c: _q(v) for c, v in cs.items()} for k, cs in inv.counter_sets.items()}

    def fits(assignment: list[tuple[Any, tuple[Device, ...]]]) -> bool:
        exclusive: list[str] = []
        shares: dict[str, list[Any]] = {}
        for choice, devs in assignment:
            for d in devs:
                if d.attributes[DRIVER]["type"] != choice.device_class:
                    return False
                if untolerated(d.taints, choice.tolerations):
                    return False
                if d.allow_multiple_allocations:
                    shares.setdefault(d.name, []).append(choice)
                else:
                    if d.name in held:
                        return False
                    exclusive.append(d.name)
                for key in choice.capacity_requests:
                    if key not in d.capacity.get(DRIVER, {}):
                        return False
                for name, text in d.capacity.get(DRIVER, {}).items():
                    policy = d.capacity_policy.get(DRIVER, {}).get(name)
                    amount = _takes(choice, name, text, policy)
                    if violates(Quantity(amount), policy) or amount > _q(text):
                        return False
        if len(exclusive) != len(set(exclusive)):
            return False
        by_name = {d.name: d for d in devices}
        for name, choices in shares.items():
            d = by_name[name]
            for cap, text in d.capacity.get(DRIVER, {}).items():
                policy = d.capacity_policy.get(DRIVER, {}).get(cap)
                total = sum((_takes(c, cap, text, policy) for c in choices), Fraction(0))
                if name in held:
                    total += _q(held[name].get("consumedCapacity", {}).get(cap, "0"))
                if total > _q(text):
                    return False
        # Counters are checked for the devices being allocated: what other claims hold counts
        # against them, a set overdrawn before this claim does not stop a claim that takes none.
        spent: dict[str, Fraction] = {}
        touched: set[str] = set()
        for name in {*exclusive, *shares, *held}:
            for u in by_name[name].consumes_counters:
                for c, v in u.counters.items():
                    spent[c] = spent.get(c, Fraction(0)) + _q(v)
                    if name not in held:
                        touched.add(c)
        if any(spent[c] > totals["s"].get(c, Fraction(0)) for c in touched):
            return False
        for con in spec.constraints:
            values = [d.attributes[DRIVER]["g"] for _, devs in assignment for d in devs]
            if con.match_attribute and len(set(values)) > 1:
                return False
            if con.distinct_attribute and len(set(values)) != len(values):
                return False
        return True

    per_request = []
    for alts in choices_of(spec):
        options = []
        for ch in alts:
            options.extend((ch, combo) for combo in itertools.combinations(devices, ch.count))
        per_request.append(options)
    return any(fits(list(pick)) for pick in itertools.product(*per_request))


@pytest.mark.parametrize("block", range(8))
def test_the_allocator_agrees_with_an_exhaustive_search(block: int) -> None:
    disagreements = []
    verdicts = set()
    for seed in range(block * SCENARIOS // 8, (block + 1) * SCENARIOS // 8):
        objs, claim = _scenario(seed)
        inv = Inventory.from_objects(objs)
        spec = read_claim_spec(claim, "resource.k8s.io/v1")
        want = _oracle(inv, spec)
        verdicts.add(want)
        got = allocate(spec, inv).allocatable
        if got is not want:
            disagreements.append(f"seed {seed}: oracle {want}, allocator {got}")
    assert not disagreements, "\n".join(disagreements)
    assert verdicts == {True, False}  # the block holds claims of both kinds, not one answer
