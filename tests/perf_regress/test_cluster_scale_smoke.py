"""bench/cluster_scale.py: its growth arithmetic, its usage errors, and a tiny run on the local control plane.

Timings are never judged here; what is checked is that a run builds the cluster it says it builds,
measures every component at every step, and reports growth and sizing from those rows.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import cluster_scale as cs

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "bench/cluster_scale.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def rows_of(per_node: dict[str, float], fixed: float, power: float = 1.0) -> list[dict[str, Any]]:
    """Synthetic rows: every metric = fixed + per_node[m] * nodes**power, with a baseline at 0."""
    out = []
    for n in (0, 200, 1000, 2000):
        row: dict[str, Any] = {"nodes": n, "devices": 8 * n, "claims": 25 * n, "pods": 50 * n}
        row["namespaces"] = math.ceil(n / 10)
        for m in cs.METRICS:
            row[m] = fixed + per_node.get(m, 0.01) * n**power
        out.append(row)
    return out


def test_linear_growth_reads_one_and_quadratic_reads_the_size_ratio() -> None:
    linear = cs.growth(rows_of({}, fixed=100.0))
    assert [(g["from"], g["to"]) for g in linear] == [(200, 1000), (1000, 2000)]
    for g in linear:
        for m in cs.METRICS:
            assert g[m] == pytest.approx(1.0), m
    quadratic = cs.growth(rows_of({}, fixed=100.0, power=2.0))
    # Over the baseline, n**2 grows by the size ratio once more than linear does.
    assert quadratic[0]["audit_s"] == pytest.approx(5.0)
    assert quadratic[1]["audit_s"] == pytest.approx(2.0)


def test_extrapolation_and_sizing_follow_the_last_two_steps() -> None:
    rows = rows_of({"webhook_rss_loaded_mib": 0.3}, fixed=120.0)
    at, fixed, per_k = cs.extrapolate(rows, "webhook_rss_loaded_mib", 10_000)
    assert fixed == pytest.approx(120.0)
    assert per_k == pytest.approx(300.0)
    assert at == pytest.approx(120.0 + 3000.0)
    # A figure that fell between the last two steps is carried flat, never below what was measured.
    rows[-1]["admit_p50_ms"] = rows[-2]["admit_p50_ms"] - 5
    at, _fixed, per_k = cs.extrapolate(rows, "admit_p50_ms", 10_000)
    assert per_k == 0.0 and at == pytest.approx(rows[-2]["admit_p50_ms"])
    text = "\n".join(cs.report(rows, cs.growth(rows), 50.0))
    assert "120 MiB +     300 MiB per 1,000 nodes" in text


def test_sizes_follow_the_nodes() -> None:
    s = cs.Size(2000)
    assert (s.devices, s.claims, s.pods, s.namespaces) == (16_000, 50_000, 100_000, 200)


def test_each_node_gets_the_drivers_slice_with_its_own_gpus() -> None:
    maker = cs.SliceMaker()
    a = maker.slices("sim-gpu-00000", "uid-a")
    b = maker.slices("sim-gpu-00001", "uid-b")
    assert len(a) == 1 and a[0]["spec"]["nodeName"] == "sim-gpu-00000"
    assert a[0]["spec"]["pool"]["name"] == "sim-gpu-00000"
    assert a[0]["metadata"]["ownerReferences"][0]["uid"] == "uid-a"
    devs_a, devs_b = a[0]["spec"]["devices"], b[0]["spec"]["devices"]
    assert len(devs_a) == cs.GPUS_PER_NODE
    uuids = {d["attributes"]["uuid"]["string"] for d in devs_a + devs_b}
    assert len(uuids) == 2 * cs.GPUS_PER_NODE
    assert all(u.startswith("GPU-") for u in uuids)


@pytest.mark.parametrize("steps", ["1000,200", "abc", "0,200", "200,200", ""])
def test_bad_steps_are_refused_in_plain_words(steps: str) -> None:
    proc = run("--steps", steps)
    assert proc.returncode != 0
    assert "--steps" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_report_reprints_a_saved_run_and_refuses_other_files(tmp_path: Path) -> None:
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({"rows": rows_of({}, fixed=10.0), "rate": 50}))
    proc = run("--report", str(saved))
    assert proc.returncode == 0, proc.stderr
    assert "200->1000" in proc.stdout and "1000->2000" in proc.stdout
    assert "@10,000" in proc.stdout and "per 1,000 nodes" in proc.stdout
    other = tmp_path / "other.json"
    other.write_text("[1, 2]")
    proc = run("--report", str(other))
    assert proc.returncode != 0 and "--report" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_quick_run_builds_the_cluster_and_measures_every_step(tmp_path: Path) -> None:
    from webhook.dev.cluster import ClusterError, find_bin_dir

    try:
        find_bin_dir()
    except ClusterError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "scale.json"
    proc = run("--quick", "--json", str(out), "--state-dir", str(tmp_path / "state"), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert [r["nodes"] for r in rows] == [0, 2, 4]
    for r in rows:
        # Two arms of 20 creates (10/s for 2 s): with the webhook and without it.
        # assess, reading the live cluster, finds the driver's devices this step published.
        assert r["assess_devices"] == r["devices"] == 8 * r["nodes"]
        assert r["assess_driver_nodes"] == r["nodes"]
        assert r["admit_n"] == 40 and r["admit_error_count"] == 0
        assert r["audit_rc"] == 0 and r["assess_rc"] == 0
        for m in cs.METRICS:
            assert math.isfinite(r[m]) and r[m] > 0, (r["nodes"], m, r[m])
    assert [(g["from"], g["to"]) for g in res["growth"]] == [(2, 4)]
    assert [s["errors"] for s in res["setup"]] == [0, 0, 0]
    for line in ("webhook cache sync", "audit full scan", "assess peak RSS", "memory to request"):
        assert line in proc.stdout


def test_judging_claim_after_claim_reads_each_allocation_once_not_once_per_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by this bench: the audit's scan grew with the square of the claims, because every
    claim's verdict read every other claim's allocation again. What other claims hold is now built
    once per inventory; an allocated claim takes only its own devices back out of it."""
    import webhook.engine.allocate as alloc
    from webhook.dra.inventory import parse_inventory_text
    from webhook.dra.objects import read_claim_spec

    maker = cs.SliceMaker()
    nodes = [maker.slices(cs.node_name(i), f"uid-{i}")[0] for i in range(38)]  # 304 GPUs
    for i, sl in enumerate(nodes):
        sl["metadata"]["name"] = f"s-{i}"
    cls = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": cs.CLASS},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
    }
    n = 300
    claims = [cs.claim("team-0000", f"c-{i}") for i in range(n + 2)]
    for i in range(n):  # one GPU each, in node order: the last node keeps 4 free
        sl = nodes[i // cs.GPUS_PER_NODE]
        result = {
            "request": "gpu",
            "driver": "gpu.nvidia.com",
            "pool": sl["spec"]["pool"]["name"],
            "device": sl["spec"]["devices"][i % cs.GPUS_PER_NODE]["name"],
        }
        claims[i]["status"] = {"allocation": {"devices": {"results": [result]}}}
    for c in claims[n:]:  # pending, 8 GPUs on one node: none has them free any more
        c["spec"]["devices"]["requests"][0]["exactly"]["count"] = 8
    items = [cls, *nodes, *claims]
    inv = parse_inventory_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    reads = 0
    real = alloc.read_allocation

    def counted(obj: Any) -> Any:
        nonlocal reads
        reads += 1
        return real(obj)

    monkeypatch.setattr(alloc, "read_allocation", counted)
    verdicts = []
    for i, c in enumerate(claims):
        spec = read_claim_spec(c["spec"], "resource.k8s.io/v1")
        verdicts.append(alloc.allocate(spec, inv, claim_key=("team-0000", f"c-{i}")).allocatable)
    # Each allocated claim fits on its own GPU; the pending ones find too few free on any node.
    assert set(verdicts[:n]) == {True}
    assert verdicts[n:] == [False, False]
    # Before: a read of every claim per verdict (91,204 here); now a few per claim.
    assert reads <= 4 * len(claims), reads


def test_a_claims_own_devices_come_out_of_the_shared_baseline_exactly() -> None:
    """The shared baseline with one allocated claim taken out equals one built without that claim:
    exclusive holders (two claims on one device included), shares, consumed capacity, counters."""
    from webhook.dra.inventory import parse_inventory_text
    from webhook.engine.allocate import _Baseline, _baseline

    def dev(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "attributes": {"type": {"string": "gpu"}}, **extra}

    uses = [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "40Gi"}}}]
    devices = [
        dev("gpu-0", consumesCounters=uses),
        dev("gpu-0-mig-0", consumesCounters=uses),
        dev("gpu-0-mig-1", consumesCounters=uses),
        dev("shared-0", allowMultipleAllocations=True, capacity={"memory": {"value": "80Gi"}}),
        dev("gpu-1"),
    ]
    counters = {"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}
    slices = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"s-{i}"},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": "node-a",
                "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 2},
                **body,
            },
        }
        for i, body in enumerate(({"sharedCounters": [counters]}, {"devices": devices}))
    ]

    def held(name: str, *results: dict[str, Any]) -> dict[str, Any]:
        c = cs.claim("ml", name)
        base = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a"}
        c["status"] = {"allocation": {"devices": {"results": [{**base, **r} for r in results]}}}
        return c

    share = {"device": "shared-0", "shareID": "s", "consumedCapacity": {"memory": "10Gi"}}
    claims = [
        held("a", {"device": "gpu-0"}),
        held("b", {"device": "gpu-0"}, {"device": "gpu-1"}),  # the same device twice: a conflict
        held("c", share),
        held("d", share, {**share, "consumedCapacity": {"memory": "20Gi"}}),
        held("e", {"device": "gpu-0-mig-0"}),
        held("f", {"device": "gpu-0-mig-1", "adminAccess": True}),
        held("g", {"device": "gpu-0-mig-1"}),
        cs.claim("ml", "pending"),
    ]
    inv = parse_inventory_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [*slices, *claims]}))
    by_key = {d.key: d for d in inv.devices}

    def view(b: Any) -> tuple[Any, ...]:
        return (
            dict(b.taken),
            set(b.shared),
            dict(b.capacity),
            {k: sorted(v) for k, v in b.capacity_of.items()},
            dict(b.counters),
            bool(b.taken or b.shared or b.counters),
        )

    for c in claims:
        key = ("ml", c["metadata"]["name"])
        assert view(_baseline(inv, by_key, key)) == view(_Baseline(inv, by_key, key)), key
    assert view(_baseline(inv, by_key, None)) == view(_Baseline(inv, by_key, None))
