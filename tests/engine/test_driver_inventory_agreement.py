"""`draguard explain` on what the bundled driver publishes in its sharing modes, against kube-scheduler.

The inventory is the driver's own: `draguard driver inventory --sim TOPOLOGY` with
`--share-by-capacity all` (eight H100s published for sharing) or `--dynamic-mig` (two A100 80GB in MIG
mode published as partitionable devices). The DeviceClasses are the bundle's: the base's and the
gpu-sharing component's `<class>-shared`. Each claim goes to `draguard explain` (exit 0: it can be
allocated, 1: it cannot) and to tools/schedoracle, Kubernetes v1.37.2's structured allocator as
kube-scheduler runs it for one node; both must give the answer the case names, and for a share the
same memory charged.

"One GPU" cases keep only gpu-0 of the driver's slices (and its counter set), so that two requests
have to meet on one GPU, as they do when the other GPUs are taken.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gotool import run_tool
from webhook.cli import main

REPO = Path(__file__).resolve().parents[2]
SIM = REPO / "driver" / "sim" / "topologies"
NODE = "node-a"
DRIVER = "gpu.nvidia.com"
Obj = dict[str, Any]
SH = "gpu.nvidia.com-h100-shared"  # the gpu-sharing component's class for H100 shares
A100 = "gpu.nvidia.com-a100-80gb"  # the base's class for whole A100 80GB GPUs

# A class for the media-extension partitions, which the bundle gives none (its header says why).
ANY_MIG = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "any-mig"},
    "spec": {"selectors": [{"cel": {"expression":
        f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'"}}]},
}  # fmt: skip


@cache
def driver_slices(mode: str) -> tuple[Obj, ...]:
    """The ResourceSlices `draguard driver inventory` prints in a mode, named as the API server would."""
    flags, topology = {
        "cap": (["--share-by-capacity", "all"], "h100-8x-nvlink.yaml"),
        "mig": (["--dynamic-mig"], "a100-2x-dynamic-mig.yaml"),
    }[mode]
    proc = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "driver", "inventory", "--sim", str(SIM / topology),
         "--node-name", NODE, "-o", "json", *flags],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    items: list[Obj] = json.loads(proc.stdout)["items"]
    for i, s in enumerate(items):
        s["metadata"]["name"] = f"{s['metadata'].pop('generateName')}{i}"
    return tuple(items)


def one_gpu(slices: tuple[Obj, ...]) -> list[Obj]:
    """The slices with gpu-0's devices and counter set only."""
    out = copy.deepcopy(list(slices))
    for s in out:
        spec = s["spec"]
        if "devices" in spec:
            spec["devices"] = [
                d for d in spec["devices"] if d["name"] == "gpu-0" or d["name"].startswith("gpu-0-")
            ]
        if "sharedCounters" in spec:
            spec["sharedCounters"] = [c for c in spec["sharedCounters"] if c["name"] == "gpu-0-counter-set"]
    return out


@cache
def bundle_classes() -> tuple[Obj, ...]:
    files = (
        REPO / "kustomize" / "base" / "deviceclasses" / "deviceclasses.yaml",
        REPO / "kustomize" / "components" / "gpu-sharing" / "deviceclasses.yaml",
    )
    return (*(d for f in files for d in yaml.safe_load_all(f.read_text()) if d), ANY_MIG)


def request(name: str, cls: str, memory: str | None = None, count: int = 1) -> Obj:
    body: Obj = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count}
    if memory is not None:
        body["capacity"] = {"requests": {"memory": memory}}
    return {"name": name, "exactly": body}


def profile_request(name: str, profile: str) -> Obj:
    sel = [{"cel": {"expression": f"device.attributes['{DRIVER}'].profile == '{profile}'"}}]
    return {"name": name, "exactly": {"deviceClassName": "any-mig", "selectors": sel}}


def held(device: str, memory: str, i: int = 0) -> Obj:
    """A claim another pod holds: a share of `device` as the scheduler records it."""
    result = {"request": "r", "driver": DRIVER, "pool": NODE, "device": device,
              "shareID": f"00000000-0000-0000-0001-{i:012d}",
              "consumedCapacity": {"memory": memory}}  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"held-{i}", "namespace": "other", "uid": f"00000000-0000-0000-0002-{i:012d}"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": SH}}]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }  # fmt: skip


@dataclass(frozen=True)
class Case:
    id: str
    mode: str  # "cap": --share-by-capacity all on 8 H100s; "mig": --dynamic-mig on 2 A100 80GB
    requests: list[Obj]
    fits: bool
    gpus: str = "all"  # or "one": gpu-0 alone
    held: list[Obj] = field(default_factory=list)

    def slices(self) -> list[Obj]:
        s = driver_slices(self.mode)
        return one_gpu(s) if self.gpus == "one" else copy.deepcopy(list(s))

    def claim(self) -> Obj:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": self.id, "namespace": "team"},
                "spec": {"devices": {"requests": self.requests}}}  # fmt: skip


def mig(name: str, profile: str, count: int = 1) -> Obj:
    """A request through the base's A100 MIG class of a profile (`3g40gb`)."""
    return request(name, f"gpu.nvidia.com-a100-mig-{profile}", count=count)


CASES = [
    # Consumable capacity: eight H100s shared in 1Gi steps (79Gi at most per GPU).
    Case("share-10Gi", "cap", [request("gpu", SH, "10Gi")], True),
    Case("share-rounded-up-to-the-step", "cap", [request("gpu", SH, "1536Mi")], True),
    Case("two-shares-fill-one-gpu", "cap", [request("a", SH, "39Gi"), request("b", SH, "40Gi")], True, "one"),
    Case("two-shares-overfill-one-gpu", "cap", [request("a", SH, "40Gi"), request("b", SH, "40Gi")], False,
         "one"),
    Case("two-shares-on-two-gpus", "cap", [request("a", SH, "40Gi"), request("b", SH, "40Gi")], True),
    Case("share-beside-held-share", "cap", [request("gpu", SH, "9Gi")], True, "one", [held("gpu-0", "70Gi")]),
    Case("share-overfills-beside-a-held-share", "cap", [request("gpu", SH, "10Gi")], False, "one",
         [held("gpu-0", "70Gi")]),
    # A request that asks no memory is charged the default (the whole GPU): nothing fits beside it.
    Case("no-memory-asked-takes-the-gpu", "cap", [request("a", SH), request("b", SH, "1Gi")], False, "one"),
    # The share classes match only GPUs published for sharing; the full-GPU class matches them too.
    Case("share-class-on-exclusive-gpus", "mig", [request("gpu", "gpu.nvidia.com-a100-shared", "10Gi")],
         False),
    Case("full-gpu-class-on-a-shared-gpu", "cap", [request("gpu", "gpu.nvidia.com-h100")], True),
    # Dynamic MIG: two A100 80GB, each one counter set (8 memory slices, 98 SMs, one media engine set).
    Case("partition-3g40gb", "mig", [mig("gpu", "3g40gb")], True),
    Case("article-class-partition", "mig", [request("gpu", "mig-1g10gb.nvidia.com")], True),
    Case("full-gpu-and-a-partition-of-it", "mig", [request("full", A100), mig("part", "1g10gb")], False,
         "one"),
    Case("full-gpu-and-a-partition-of-the-other", "mig", [request("full", A100), mig("part", "1g10gb")],
         True),
    Case("two-3g40gb-fill-one-gpu", "mig", [mig("p", "3g40gb", 2)], True, "one"),
    Case("two-3g40gb-and-a-1g10gb-overfill", "mig", [mig("p", "3g40gb", 2), mig("q", "1g10gb")], False,
         "one"),
    Case("4g40gb-beside-3g40gb", "mig", [mig("a", "4g40gb"), mig("b", "3g40gb")], True, "one"),
    Case("seven-1g10gb", "mig", [mig("p", "1g10gb", 7)], True, "one"),
    Case("eight-1g10gb", "mig", [mig("p", "1g10gb", 8)], False, "one"),
    Case("one-media-extension-per-gpu", "mig",
         [profile_request("a", "1g.10gb+me"), profile_request("b", "1g.10gb+me")], False, "one"),
    Case("media-extension-beside-plain-1g10gb", "mig",
         [profile_request("a", "1g.10gb+me"), profile_request("b", "1g.10gb")], True, "one"),
]  # fmt: skip


def oracle(cases: list[Case]) -> dict[str, Obj]:
    lines = "".join(
        json.dumps({"id": c.id, "deviceClasses": list(bundle_classes()), "resourceSlices": c.slices(),
                    "claims": [c.claim()], "allocatedClaims": c.held, "deviceTaintRules": [],
                    "node": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}) + "\n"
        for c in cases
    )  # fmt: skip
    res = run_tool("schedoracle", stdin=lines, timeout=300)
    assert res.returncode == 0, res.stderr
    out = {o["id"]: o for o in map(json.loads, res.stdout.splitlines())}
    bad = [o for o in out.values() if o.get("error", "").startswith("bad input")]
    assert not bad, bad
    return out


def explain(case: Case, tmp: Path) -> tuple[int, list[Obj]]:
    """`draguard explain --inventory <driver's slices + held claims + node> <classes + claim>`."""
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}  # fmt: skip
    inventory = tmp / f"{case.id}-inventory.yaml"
    inventory.write_text(yaml.safe_dump_all([*case.slices(), *case.held, node]))
    claim = tmp / f"{case.id}.yaml"
    claim.write_text(yaml.safe_dump_all([*bundle_classes(), case.claim()]))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["explain", "--inventory", str(inventory), "-f", "json", str(claim)])
    return rc, [e for e in json.loads(out.getvalue()) if e.get("claim") == case.id]


@pytest.fixture(scope="module")
def scheduler() -> dict[str, Obj]:
    return oracle(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_explain_answers_as_kube_scheduler_on_the_drivers_slices(
    case: Case, scheduler: dict[str, Obj], tmp_path: Path
) -> None:
    o = scheduler[case.id]
    fits = bool(o["allocated"]) and not o.get("error")
    assert fits == case.fits, f"the scheduler {'allocates' if fits else 'refuses'} {case.id}: {o}"
    rc, entries = explain(case, tmp_path)
    assert entries, "explain reported nothing for the claim"
    reasons = [r for e in entries for r in e["reasons"]]
    assert (rc == 0) == fits, f"explain exit {rc}, scheduler {'allocates' if fits else 'refuses'}: {reasons}"
    assert all(e["satisfiable"] is fits for e in entries), entries
    if fits:
        # The memory each share is charged: what the scheduler records as consumedCapacity.
        charged = sorted(
            r["consumedCapacity"]["memory"] for rs in o["results"] for r in rs if r.get("consumedCapacity")
        )
        # Every request's entry lists the whole claim's picks ("<request>: <device> (memory 10Gi)").
        picks = {d for e in entries for d in e["devices"]}
        shown = sorted(d.split("(memory ", 1)[1].rstrip(")") for d in picks if "(memory " in d)
        assert shown == charged, (entries, o["results"])


def test_the_cases_use_what_the_driver_publishes() -> None:
    """The modes publish what the cases rely on (so a change in the driver shows here, not as a riddle)."""
    shared = [d for s in driver_slices("cap") for d in s["spec"].get("devices", [])]
    assert len(shared) == 8 and all(d.get("allowMultipleAllocations") for d in shared)
    assert {d["capacity"]["memory"]["requestPolicy"]["validRange"]["max"] for d in shared} == {"79Gi"}
    mig = [d for s in one_gpu(driver_slices("mig")) for d in s["spec"].get("devices", [])]
    assert sum(d["name"].startswith("gpu-0-mig-1g10gb-19-") for d in mig) == 7
    assert all(d["consumesCounters"][0]["counterSet"] == "gpu-0-counter-set" for d in mig)


def test_a_claim_through_a_full_gpu_class_on_a_shared_gpu_is_a_share_of_the_whole_gpu(
    scheduler: dict[str, Obj],
) -> None:
    """The scheduler makes every allocation of a multi-allocatable device a share (a shareID, which
    schedoracle reports as `shared`), charged the default when the request asks no memory: a claim
    through gpu.nvidia.com-h100 becomes a share of 79Gi, and carries that class's TimeSlicing config."""
    (results,) = scheduler["full-gpu-class-on-a-shared-gpu"]["results"]
    (r,) = results
    assert r.get("shared") is True and r["consumedCapacity"] == {"memory": "79Gi"}, r
