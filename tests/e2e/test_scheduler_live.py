"""`explain`'s allocator against the running kube-scheduler, not only against its code.

tests/engine/test_scheduler_differential.py asks Kubernetes' structured allocator (tools/schedoracle)
the scheduler's question offline. Here the same seeded scenarios (tests/engine/sched_scenarios.py)
go to the local control plane's kube-scheduler v1.37.2 with the feature gates the cluster runs
(1.37 defaults: consumable capacity, partitionable devices, device taints and DeviceTaintRules,
binding conditions): DeviceClasses, ResourceSlices, DeviceTaintRules, claims other pods hold (with
their `status.allocation`), the pod's claims, and a pod naming them. The pod has no nodeName: a
nodeSelector on a label only the scenario's simulated node carries leaves the choice to the scheduler,
whose decision is either the claims allocated for the pod or the pod `PodScheduled=False/Unschedulable`.
Simulated nodes have no kubelet, so a scheduled pod never runs: the allocation is the decision.

Each scenario gets names of its own (`sched_scenarios.renamed`: driver, classes, claims) so scenarios
in one batch never see each other's devices. The engine judges the same renamed objects, offline.

A pod the scheduler places on a device with a NoExecute taint that its request tolerates without
naming the effect is deleted at once by kube-controller-manager's device taint eviction controller:
its decision is read from the events, and explain must warn of the eviction.

`DRAGUARD_LIVE_SCENARIOS` sets how many scenarios run (500 by default, `DRAGUARD_LIVE_FIRST_SEED` the
first); docs/dra-1.37.md has the figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.helpers import wait_for
from tests.engine import sched_scenarios as sc
from tests.engine.test_scheduler_differential import SEED0, engine, undecidable_class
from webhook.dev.cluster import LocalCluster
from webhook.dev.kube import ApiError, Kube
from webhook.dev.nodes import HEARTBEAT_SECONDS, SimNode, heartbeat, register_nodes

SCENARIOS = int(os.environ.get("DRAGUARD_LIVE_SCENARIOS", "500"))
FIRST = int(os.environ.get("DRAGUARD_LIVE_FIRST_SEED", str(SEED0)))  # to pose one scenario again
BATCH = 25  # scenarios whose objects and pods are in the cluster at once
# Scenarios per namespace: a namespace is a team of its own, and the shipped quota policy gives a team
# 32 GPU-equivalents, which 5 scenarios' claims stay within.
PER_NAMESPACE = 5
NODE_LABEL = "draguard.io/sched-live"
BATCH_LABEL = "draguard.io/sched-live-batch"
# One simulated node per zone a scenario's node "n" can be in; "m" is the node of the other zone.
NODES = {"a": "sched-live-a", "b": "sched-live-b"}
ADMIN_ACCESS = "resource.kubernetes.io/admin-access"
TEAM_LABEL = "draguard.io/team"
RES = "/apis/resource.k8s.io/v1"
PATHS = {
    "DeviceClass": f"{RES}/deviceclasses",
    "ResourceSlice": f"{RES}/resourceslices",
    "DeviceTaintRule": f"{RES}/devicetaintrules",
}
DECISION_TIMEOUT = 60.0  # decisions come within seconds; a batch that waits this long has a pod stuck
# The scheduler's refusals: no node fits, or an error while filtering (a CEL selector failing at run
# time), which leaves the pod pending just the same; the offline differential counts both as "does not fit".
REFUSED = {("PodScheduled", "False", "Unschedulable"), ("PodScheduled", "False", "SchedulerError")}
# draguard's own admission webhook runs in the cluster and judges claims against its watch caches; a
# claim created a moment after its slices may meet a cache that has not seen them yet.
STALE_INVENTORY = "is published by no device in the inventory"
EVICTED = "DeviceTaintManagerEviction"  # the event of kube-controller-manager's device taint eviction
WEBHOOK_CATCH_UP = 20.0
# The one refusal at admission a scenario may meet: draguard's webhook denies a claim whose constraint
# names an attribute no device publishes (structure/interconnect, enforced by the shipped policies).
# Such a scenario is counted apart, not compared; any other refusal of a generated object fails the test
# (the generator writes only what kube-apiserver accepts).


@dataclass
class Live:
    """One scenario as posed to the cluster."""

    scenario: sc.Scenario  # renamed: what is created, and what the engine judges
    node: str  # the node the pod may go to (the scenario's "n")
    pod: str
    rejected: str = ""  # why the API server refused one of its objects, if it did


@pytest.fixture(scope="module")
def live_nodes(cluster: LocalCluster) -> Iterator[dict[str, str]]:
    """Two simulated nodes kept Ready by a heartbeat for the module, removed afterwards."""
    kube = cluster.kube()
    register_nodes(kube, [SimNode(n, "", {NODE_LABEL: zone, "zone": zone}) for zone, n in NODES.items()])
    stop = threading.Event()

    def beat() -> None:
        # Without renewed leases the node-lifecycle controller would taint the nodes unreachable,
        # and every pod would be refused for that rather than for its claims.
        while not stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(ApiError, OSError):  # the next beat, well inside the lease, retries
                heartbeat(kube, list(NODES.values()))

    thread = threading.Thread(target=beat, name="sched-live-heartbeat", daemon=True)
    thread.start()
    try:
        yield NODES
    finally:
        stop.set()
        thread.join(timeout=30)
        for name in NODES.values():
            kube.delete(f"/api/v1/nodes/{name}")


def _labelled(obj: dict[str, Any], batch: str) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k != "uid"}
    meta["labels"] = {**meta.get("labels", {}), BATCH_LABEL: batch}
    return {k: v for k, v in {**obj, "metadata": meta}.items() if k != "status"}


def _unpublished(s: sc.Scenario) -> str | None:
    """A constraint's attribute that no device of the scenario publishes, if there is one: the
    webhook's structure/interconnect refuses such a claim for good, so its refusal is final at once."""
    published = {(sl["spec"]["driver"], a) for sl in s.slices for d in sl["spec"].get("devices", [])
                 for a in d.get("attributes", {})}  # fmt: skip
    for claim in s.claims:
        for con in claim["spec"]["devices"].get("constraints", []):
            attr = con.get("matchAttribute")
            if attr and tuple(attr.rsplit("/", 1)) not in published:
                return str(attr)
    return None


def _post(kube: Kube, obj: dict[str, Any], batch: str, stale_retry: bool = True) -> None:
    if obj["kind"] == "ResourceClaim":
        path = f"{RES}/namespaces/{obj['metadata']['namespace']}/resourceclaims"
    elif obj["kind"] == "Pod":
        path = f"/api/v1/namespaces/{obj['metadata']['namespace']}/pods"
    else:
        path = PATHS[obj["kind"]]
    deadline = time.monotonic() + WEBHOOK_CATCH_UP
    while True:
        try:
            kube.request("POST", path, _labelled(obj, batch))
            break
        except ApiError as exc:
            # Retried until the webhook's inventory holds the slices created just before (bounded).
            if (not stale_retry or exc.status != 403 or STALE_INVENTORY not in str(exc)
                    or time.monotonic() > deadline):  # fmt: skip
                raise
            time.sleep(0.5)
    if obj.get("status"):
        # A claim another pod holds: its allocation, as the scheduler would have written it.
        name = obj["metadata"]["name"]
        kube.merge_patch(f"{path}/{name}/status", {"status": obj["status"]})


def _pod(live: Live, namespace: str, zone: str, batch: str) -> dict[str, Any]:
    claims = [c["metadata"]["name"] for c in live.scenario.claims]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": live.pod, "namespace": namespace, "labels": {BATCH_LABEL: batch}},
        "spec": {
            "nodeSelector": {NODE_LABEL: zone},  # the scenario's node only; the scheduler decides
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": f"c{k}"} for k in range(len(claims))]}}],
            "resourceClaims": [{"name": f"c{k}", "resourceClaimName": n} for k, n in enumerate(claims)],
        },
    }  # fmt: skip


def _fence(kube: Kube, namespace: str, batch: str, node: str) -> None:
    """Wait until the scheduler has read every object of the batch created so far.

    A pod that needs a device from a slice, a class and a claim created after all of the batch's
    can only be allocated once the scheduler's watches of slices, classes and claims have delivered
    those three, and a watch delivers in order: everything created before them is then in its view
    too. DeviceTaintRules are created first in a batch, before anything the fence pod proves seen.
    """
    driver = f"{batch}.fence.draguard.io"
    name = f"{batch}-fence"
    objs: list[dict[str, Any]] = [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
         "spec": {"driver": driver, "nodeName": node, "pool": {"name": "fence", "generation": 1,
                  "resourceSliceCount": 1}, "devices": [{"name": "f0"}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
         "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": name, "namespace": namespace},
         "spec": {"devices": {"requests": [{"name": "f", "exactly": {"deviceClassName": name}}]}}},
    ]  # fmt: skip
    for o in objs:
        _post(kube, o, batch)
    zone = next(z for z, n in NODES.items() if n == node)
    pod = _pod(Live(sc.Scenario(0, [], [], [], [], [objs[2]]), node, name), namespace, zone, batch)
    _post(kube, pod, batch)
    claim_path = f"{RES}/namespaces/{namespace}/resourceclaims/{name}"
    wait_for(lambda: kube.get(claim_path).get("status", {}).get("allocation"),
             f"the scheduler to allocate batch {batch}'s fence claim", timeout=DECISION_TIMEOUT)  # fmt: skip


Decision = tuple[bool | None, str]  # allocated (None: no decision), what the scheduler said


def _decisions(kube: Kube, batch: str, lives: list[Live]) -> dict[str, Decision]:
    """Per pod: (allocated, what the scheduler said) once the scheduler decided on every pod, or after
    DECISION_TIMEOUT (None, the pod's state) for the pods it did not decide on."""
    sel = f"labelSelector={BATCH_LABEL}%3D{batch}"
    want = {lv.pod: lv for lv in lives if not lv.rejected}
    out: dict[str, Decision] = {}
    deadline = time.monotonic() + DECISION_TIMEOUT
    while True:
        listed = kube.get(f"/api/v1/pods?{sel}")["items"]  # names are unique across the batch
        pods = {p["metadata"]["name"]: p for p in listed}
        listed = kube.get(f"{RES}/resourceclaims?{sel}")["items"]
        claims = {c["metadata"]["name"]: c for c in listed}
        out.clear()
        for name, lv in want.items():
            pod = pods.get(name, {})
            mine = [claims.get(c["metadata"]["name"], {}) for c in lv.scenario.claims]
            uid = pod.get("metadata", {}).get("uid")
            if all(
                c.get("status", {}).get("allocation")
                and any(r.get("uid") == uid for r in c["status"].get("reservedFor") or [])
                for c in mine
            ):
                out[name] = (True, json.dumps([c["status"]["allocation"]["devices"] for c in mine]))
                continue
            conds = pod.get("status", {}).get("conditions") or []
            for cond in conds:
                if (cond["type"], cond["status"], cond.get("reason")) in REFUSED:
                    out[name] = (False, f"{cond.get('reason')}: {cond.get('message', '')}")
            if name not in out:
                status = [c.get("status", {}) for c in mine]
                out[name] = (None, f"pod conditions {json.dumps(conds)}; claims' status {json.dumps(status)}")
        undecided = {n for n, v in out.items() if v[0] is None}
        if undecided:
            # A pod scheduled onto a NoExecute-tainted device its toleration names no effect for is
            # deleted at once by the device taint eviction controller, and its claim deallocated: the
            # scheduler's decision survives in the events.
            # Evictions are rare: the scheduler's events (one per pod of the run) are read only for them.
            query = "/api/v1/events?fieldSelector=reason%3D"
            evicted = undecided & {e["involvedObject"]["name"] for e in kube.get(query + EVICTED)["items"]}
            if evicted:
                scheduled = {e["involvedObject"]["name"] for e in kube.get(query + "Scheduled")["items"]}
                for name in evicted & scheduled:
                    out[name] = (True, EVICTED)
        if all(v[0] is not None for v in out.values()) or time.monotonic() > deadline:
            return out
        time.sleep(0.3)


def _namespaces(cluster: LocalCluster, batch: str, count: int) -> list[str]:
    """`count` namespaces for one batch, each a team of its own. Some scenarios' claims ask for admin
    access, which the API server allows only in namespaces labelled for it."""
    kube = cluster.kube()
    out = []
    for k in range(count):
        name = f"{batch}-{k}"
        labels = {ADMIN_ACCESS: "true", TEAM_LABEL: name, BATCH_LABEL: batch}
        meta = {"name": name, "labels": labels}
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
        out.append(name)
    for name in out:
        cluster.wait_default_sa(name)  # a pod is refused until its namespace's ServiceAccount exists
    return out


def _clean(kube: Kube, namespaces: list[str], batch: str) -> None:
    sel = f"labelSelector={BATCH_LABEL}%3D{batch}"
    # No kubelet confirms a pod's end on a simulated node: pods go at once, then their claims are
    # deallocated by the resource claim controller and go with their namespace.
    for ns in namespaces:
        with contextlib.suppress(ApiError):  # a namespace the batch could not create
            kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods?{sel}&gracePeriodSeconds=0")
            kube.request("DELETE", f"/api/v1/namespaces/{ns}")
    for path in PATHS.values():
        kube.request("DELETE", f"{path}?{sel}")


def _run_batch(
    kube: Kube, namespaces: list[str], batch: str, seeds: range
) -> list[tuple[Live, bool | None, str]]:
    lives: list[Live] = []
    for k, seed in enumerate(seeds):
        s = sc.generate(seed)
        zone = s.nodes[0]["metadata"]["labels"]["zone"]  # the zone of the scenario's node "n"
        other = "b" if zone == "a" else "a"
        prefix = f"{batch}-{seed}"
        ns = namespaces[k // PER_NAMESPACE]
        r = sc.renamed(s, prefix, {sc.NODE: NODES[zone], sc.OTHER: NODES[other]}, ns)
        lives.append(Live(r, NODES[zone], f"{prefix}-pod"))
    # Rules first (see _fence), then what the pods' claims are allocated from, then the claims.
    for kinds in (("DeviceTaintRule",), ("ResourceSlice", "DeviceClass", "ResourceClaim")):
        for lv in lives:
            s = lv.scenario
            objs = s.taint_rules if len(kinds) == 1 else [*s.slices, *s.classes, *s.held, *s.claims]
            final = _unpublished(s) is not None  # the webhook's refusal of its claim is no stale view
            for o in objs:
                if lv.rejected:
                    break
                try:
                    _post(kube, o, batch, stale_retry=not (final and o["kind"] == "ResourceClaim"))
                except ApiError as exc:
                    lv.rejected = f"{o['kind']} {o['metadata']['name']}: {exc}"
    _fence(kube, namespaces[0], batch, NODES["a"])
    for k, lv in enumerate(lives):
        if not lv.rejected:
            zone = next(z for z, n in NODES.items() if n == lv.node)
            _post(kube, _pod(lv, namespaces[k // PER_NAMESPACE], zone, batch), batch)
    got = _decisions(kube, batch, lives)
    return [(lv, *got.get(lv.pod, (None, ""))) for lv in lives]


@pytest.mark.timeout(max(300, 3 * SCENARIOS))  # about 1 s a scenario on two shared cores
def test_explain_agrees_with_the_running_kube_scheduler(
    cluster: LocalCluster, live_nodes: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    kube = cluster.kube()
    run = uuid.uuid4().hex[:5]
    tally: Counter[str] = Counter()
    problems: list[str] = []
    rejected: list[str] = []
    unknown: list[str] = []  # refusals the scenario does not explain
    refusals: list[tuple[Live, str]] = []
    t0 = time.monotonic()
    for start in range(FIRST, FIRST + SCENARIOS, BATCH):
        batch = f"l{run}-{(start - FIRST) // BATCH}"
        seeds = range(start, min(start + BATCH, FIRST + SCENARIOS))
        # Namespaces of their own per batch: claims of the batch before may still be on their way
        # out, charged to their team.
        namespaces: list[str] = []
        try:
            namespaces = _namespaces(cluster, batch, -(-len(seeds) // PER_NAMESPACE))
            results = _run_batch(kube, namespaces, batch, seeds)
        finally:
            _clean(kube, namespaces, batch)
        for lv, allocated, said in results:
            seed = lv.scenario.seed
            if lv.rejected:
                rejected.append(f"seed {seed}: {lv.rejected}")
                if not (STALE_INVENTORY in lv.rejected and _unpublished(lv.scenario)):
                    unknown.append(rejected[-1])
                continue
            if allocated is None:
                problems.append(
                    f"seed {seed}: no decision from the scheduler in {DECISION_TIMEOUT:.0f} s: {said[:600]}"
                )
                tally["no decision"] += 1
                continue
            tally["scheduler allocates" if allocated else "scheduler refuses"] += 1
            tally["scheduler refuses with an error"] += said.startswith("SchedulerError")
            if not allocated:
                refusals.append((lv, said))
            got, v = engine(lv.scenario, lv.node)
            if got is None:
                cls = undecidable_class(v)
                tally[f"undecided: {cls}"] += 1
                if cls is None:
                    problems.append(f"seed {seed}: engine cannot decide ({'; '.join(v.reasons)}), scheduler "
                                    f"{'allocates' if allocated else 'refuses'}")  # fmt: skip
            elif got == allocated:
                tally["agree"] += 1
                warned = any("eviction controller deletes the pod as soon" in n for n in v.notes)
                if said == EVICTED:
                    tally["scheduled, then evicted: explain warns" if warned else
                          "scheduled, then evicted: explain does not warn"] += 1  # fmt: skip
                    if not warned:
                        notes = "; ".join(v.notes)[:300]
                        problems.append(f"seed {seed}: the pod was evicted for a NoExecute device taint "
                                        f"at once; explain gives no warning ({notes})")  # fmt: skip
                elif warned:
                    # explain's pick is one allocation; the scheduler may pick an untainted device.
                    tally["explain warns of eviction, scheduler's pick kept the pod"] += 1
            else:
                tally["disagree: explain allocates, scheduler refuses" if got else
                      "disagree: scheduler allocates, explain refuses"] += 1  # fmt: skip
                problems.append(f"seed {seed}: explain {'allocates' if got else 'refuses'}, scheduler "
                                f"{'allocates ' if allocated else 'refuses: '}{said[:300]}; explain: "
                                f"{'; '.join(v.reasons)[:300]}")  # fmt: skip
    took = time.monotonic() - t0
    decided = tally["agree"] + sum(n for k, n in tally.items() if k.startswith("disagree"))
    with capsys.disabled():
        print(f"\nlive scheduler differential: {tally['agree']}/{decided} decided cases agree, "
              f"{SCENARIOS - len(rejected) - decided} undecided, {len(rejected)} refused by the API server; "
              f"{dict(sorted(tally.items()))}; {took:.0f} s ({took / SCENARIOS:.1f} s each)")  # fmt: skip
        for line in problems + rejected:
            print("  " + line)
        for lv, said in refusals[:40]:
            print(f"  refused {lv.scenario.seed}: {said[:200]}")
    assert not unknown, "\n".join(unknown[:10])
    assert tally["disagree: explain allocates, scheduler refuses"] == 0, "\n".join(problems[:20])
    assert decided and tally["agree"] >= 0.99 * decided, "\n".join(problems[:20])
    unexplained = [p for p in problems if "cannot decide" in p or "no decision" in p or "evicted" in p]
    assert not unexplained, "\n".join(unexplained[:20])
    # Both answers occur: the sample is not one verdict repeated.
    assert tally["scheduler allocates"] >= SCENARIOS // 10
    assert tally["scheduler refuses"] >= SCENARIOS // 10
