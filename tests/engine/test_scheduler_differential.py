"""webhook/engine/allocate.py against Kubernetes' own structured allocator (tools/schedoracle).

tools/schedoracle runs k8s.io/dynamic-resource-allocation/structured v0.37.2, the code
kube-scheduler's DynamicResources plugin calls for each node, with the DRA features v1.37.2 turns on
by default. Both get the same objects (tests/engine/sched_scenarios.py): seeded random inventories
with shared counters in their own slices, multi-allocatable devices with request policies, taints,
per-pool node selection and claims other pods hold; pods with one or two claims of several requests
(firstAvailable, All/ExactCount, selectors, tolerations, capacity requests, constraints, admin
access). The question compared is the scheduler's: do all the pod's claims fit on node "n" (and, asked
again, on node "m")?

A scheduler error (a selector failing at run time, a constraint that rules out one of "All" devices)
counts as "does not fit": the pod stays unschedulable. The engine may answer "cannot be decided"
only for the case classes listed in UNDECIDABLE, each with why; anything else is a disagreement.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from tests.engine import sched_scenarios as sc
from tests.gotool import run_tool
from webhook.dra.inventory import Inventory
from webhook.dra.objects import read_claim_spec
from webhook.engine.allocate import Verdict, allocate

SCENARIOS = 600
SEED0 = 29_000

# Answers the engine gives as "cannot be decided offline" on purpose: (reason text it starts with,
# why no offline answer can be right).
UNDECIDABLE = {
    "runtime-error": (
        "a selector fails at run time on some devices",
        "a selector fails at run time on a device the claim could use: the scheduler evaluates selectors "
        "device by device in its own order and refuses the claim at the first error it meets, so "
        "whether it allocates first or fails first is not a property of the objects",
    ),
    "all-against-constraint": (
        "breaks the claim's constraint",
        "an allocationMode All request whose devices a constraint rules out: the scheduler refuses the "
        "claim if it gets there before it finds another choice that fits; its order within a pool "
        "follows slice names, which the inventory does not keep",
    ),
}


def oracle(scenarios: list[sc.Scenario], node: str = sc.NODE) -> list[dict[str, Any]]:
    res = run_tool("schedoracle", stdin="".join(json.dumps(s.oracle_input(node)) + "\n" for s in scenarios),
                   timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = [json.loads(line) for line in res.stdout.splitlines()]
    assert [o["id"] for o in out] == [s.seed for s in scenarios]
    bad = [o for o in out if o.get("error", "").startswith("bad input")]
    assert not bad, bad[:3]
    return out


def engine(s: sc.Scenario, node: str = sc.NODE) -> tuple[bool | None, Verdict]:
    """The engine's answer for one node: True/False, or None when it says it cannot decide."""
    v = allocate(
        read_claim_spec(s.merged_claim(), "resource.k8s.io/v1"), Inventory.from_objects(s.inventory_objects())
    )
    if node in v.unsure:
        return None, v
    if v.allocatable is True:
        return node in v.nodes, v
    if v.allocatable is None and v.unsure:
        return False, v  # undecided elsewhere; this node was judged and does not fit
    return v.allocatable, v


def undecidable_class(v: Verdict) -> str | None:
    """The listed class of an undecided answer (said as the reason, or as a note when other nodes
    fit), or None."""
    said = " ".join((*v.reasons, *v.notes))
    if not said.startswith("may be refused: ") and "may refuse the claim" not in said:
        return None
    for name, (marker, _why) in UNDECIDABLE.items():
        if marker in said:
            return name
    return None


def compare(scenarios: list[sc.Scenario], node: str = sc.NODE) -> tuple[Counter[str], list[str]]:
    tally: Counter[str] = Counter()
    problems: list[str] = []
    for s, o in zip(scenarios, oracle(scenarios, node), strict=True):
        fits = bool(o["allocated"]) and not o.get("error")
        got, v = engine(s, node)
        tally["scheduler allocates" if fits else "scheduler refuses (error)" if o.get("error") else
              "scheduler: does not fit"] += 1  # fmt: skip
        if got is None:
            cls = undecidable_class(v)
            tally[f"undecided: {cls}"] += 1
            if cls is None:
                why = "; ".join(v.reasons)
                problems.append(f"seed {s.seed}: engine cannot decide on {node} ({why}), scheduler "
                                f"{'allocates' if fits else 'does not'} {o.get('error', '')}")  # fmt: skip
        elif got == fits:
            tally["agree"] += 1
        else:
            tally["disagree"] += 1
            said = f"allocates {json.dumps(o.get('results'))}" if fits else f"does not {o.get('error', '')}"
            problems.append(
                f"seed {s.seed}: engine {'allocates' if got else 'does not'} on {node}, scheduler {said}; "
                f"engine reasons: {'; '.join(v.reasons)[:400]}"
            )
    return tally, problems


@pytest.mark.parametrize(
    ("node", "min_allocates"),
    [
        (sc.NODE, SCENARIOS // 5),  # the node every scenario publishes devices on
        (sc.OTHER, SCENARIOS // 10),  # another node: remote, fabric, zonal and per-device pools only
    ],
)
def test_the_engine_agrees_with_kube_schedulers_allocator(
    node: str, min_allocates: int, capsys: pytest.CaptureFixture[str]
) -> None:
    scenarios = [sc.generate(seed) for seed in range(SEED0, SEED0 + SCENARIOS)]
    tally, problems = compare(scenarios, node)
    decided = tally["agree"] + tally["disagree"]
    with capsys.disabled():
        print(f"\nscheduler differential on node {node}: {tally['agree']}/{SCENARIOS} agree "
              f"({100 * tally['agree'] / SCENARIOS:.1f} %), {tally['disagree']} disagree, "
              f"{SCENARIOS - decided} undecided; {dict(sorted(tally.items()))}")  # fmt: skip
    assert not problems, "\n".join(problems[:20])
    # The sample exercises both answers and the scheduler's errors, not one verdict.
    assert tally["scheduler allocates"] >= min_allocates
    assert tally["scheduler: does not fit"] >= SCENARIOS // 5
    assert tally["scheduler refuses (error)"] >= 5
    assert tally["agree"] >= 0.97 * SCENARIOS


# -- the disagreements the differential test found, as cases of their own -------------------------


def _one(s: sc.Scenario) -> tuple[bool, bool | None, Verdict, dict[str, Any]]:
    o = oracle([s])[0]
    got, v = engine(s)
    return bool(o["allocated"]) and not o.get("error"), got, v, o


def _gpu(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "gpu"}, "g": {"int": 0}},
            "capacity": {"memory": {"value": "80Gi"}}, **extra}  # fmt: skip


def _exactly(**body: Any) -> dict[str, Any]:
    return {"deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 1, **body}


def test_a_result_without_share_id_holds_a_multi_allocatable_device_whole() -> None:
    held = sc.held_claim([{"request": "r", "driver": sc.DRIVER, "pool": "local", "device": "g0",
                           "consumedCapacity": {"memory": "8Gi"}}])  # fmt: skip
    s = sc.Scenario(
        1,
        sc.classes(),
        [sc.local_slice([_gpu("g0", allowMultipleAllocations=True)])],
        [held],
        sc.nodes(),
        [
            sc.pod_claim(
                {"requests": [{"name": "r", "exactly": _exactly(capacity={"requests": {"memory": "8Gi"}})}]}
            )
        ],
    )
    fits, got, v, _ = _one(s)
    assert (fits, got) == (False, False)
    assert any("allocated to claim other/held-0" in r for r in v.reasons), v.reasons
    # With the shareID the scheduler writes, the same result is a share and leaves room.
    held["status"]["allocation"]["devices"]["results"][0]["shareID"] = "00000000-0000-0000-0001-000000000000"
    assert _one(s)[:2] == (True, True)


def test_all_leaves_out_devices_too_small_for_the_capacity_request() -> None:
    small = _gpu("g1", capacity={"memory": {"value": "10Gi"}})
    request = {"name": "r", "exactly": {"deviceClassName": "gpu", "allocationMode": "All",
                                        "capacity": {"requests": {"memory": "16Gi"}}}}  # fmt: skip
    s = sc.Scenario(2, sc.classes(), [sc.local_slice([_gpu("g0"), small])], [], sc.nodes(),
                    [sc.pod_claim({"requests": [request]})])  # fmt: skip
    fits, got, v, o = _one(s)
    assert (fits, got) == (True, True), v.reasons
    assert [p["device"] for p in o["results"][0]] == ["g0"] == [p.device.name for p in v.picks]


def test_a_constraint_that_rules_out_one_of_all_devices_refuses_the_claim() -> None:
    devices = [_gpu("g0"), _gpu("g1", attributes={"type": {"string": "gpu"}, "g": {"int": 1}})]
    claim = {"requests": [{"name": "r", "firstAvailable": [
        {"name": "all", "deviceClassName": "gpu", "allocationMode": "All"},
        {"name": "one", "deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 1}]}],
        "constraints": [{"matchAttribute": f"{sc.DRIVER}/g"}]}  # fmt: skip
    s = sc.Scenario(3, sc.classes(), [sc.local_slice(devices)], [], sc.nodes(), [sc.pod_claim(claim)])
    fits, got, v, o = _one(s)
    assert "constraint would not be satisfied" in o["error"] and not fits
    # The fallback subrequest fits: whether the scheduler gets to it depends on its device order.
    assert got is None and undecidable_class(v) == "all-against-constraint", v
    # With no other choice, the claim cannot be allocated whatever the order.
    claim["requests"][0]["firstAvailable"].pop()
    fits, got, v, o = _one(s)
    assert "constraint would not be satisfied" in o["error"] and not fits
    assert got is False
    assert any("breaks the claim's constraint" in r for r in v.reasons), v.reasons


def test_a_selector_failing_at_run_time_is_undecided_not_allocatable() -> None:
    claim = {"requests": [{"name": "r", "exactly": _exactly(
        selectors=[{"cel": {"expression": sc.RUNTIME_ERROR_SELECTOR}}])}]}  # fmt: skip
    with_model = _gpu(
        "g1", attributes={"type": {"string": "gpu"}, "g": {"int": 0}, "model": {"string": "a100"}}
    )
    s = sc.Scenario(4, sc.classes(), [sc.local_slice([_gpu("g0"), with_model])], [], sc.nodes(),
                    [sc.pod_claim(claim)])  # fmt: skip
    fits, got, v, o = _one(s)
    assert "no such key" in o["error"] and not fits
    assert got is None and undecidable_class(v) == "runtime-error", v
