"""Sustained load on one webhook process pinned to one core: no 5xx, no dropped connection, flat RSS.

CI: up to 20,000 reviews or 30 s, whichever comes first (DRAGUARD_LOAD_SECONDS changes the 30).
DRAGUARD_SOAK=1: at least 20,000 reviews and at least 60 s, both.
Figures are printed and, with DRAGUARD_RELIABILITY_OUT=DIR, written to DIR/load.json.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import psutil
import pytest

from tests.reliability.conftest import SOAK, WebhookProcess, sample_reviews
from tests.reliability.loadgen import run_load


def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]


@pytest.mark.timeout(900)
def test_sustained_load_one_core(tmp_path: Path, certs: Path, inventory_file: Path) -> None:
    cpus = _cpus()
    server_cpu = cpus[0]
    wh = WebhookProcess(tmp_path, certs, inventory_file).start(cpu=server_cpu)
    proc = psutil.Process(wh.pid)
    if SOAK:
        limits = {"max_requests": 20000, "max_seconds": 60.0, "min_requests": 20000, "min_seconds": 60.0}
    else:
        secs = float(os.environ.get("DRAGUARD_LOAD_SECONDS", "30"))
        limits = {"max_requests": 20000, "max_seconds": secs}
    bodies = sample_reviews(400)
    old_aff = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        if old_aff is not None and len(cpus) > 1:
            os.sched_setaffinity(0, set(cpus[1:]))  # the client stays off the server's core
        # Warm-up (imports, CEL compile cache, first allocations) before the baseline.
        asyncio.run(
            run_load(
                f"https://127.0.0.1:{wh.port}",
                bodies,
                ssl_context=wh.ssl_context(),
                max_requests=800,
                max_seconds=30,
                paths=("/validate", "/mutate"),
            )
        )
        base_rss = proc.memory_info().rss / 2**20
        res = asyncio.run(
            run_load(
                f"https://127.0.0.1:{wh.port}",
                bodies,
                ssl_context=wh.ssl_context(),
                concurrency=8,
                sample=lambda: proc.memory_info().rss / 2**20,
                paths=("/validate", "/mutate"),
                **limits,  # type: ignore[arg-type]
            )
        )
    finally:
        if old_aff is not None:
            os.sched_setaffinity(0, old_aff)
        alive = wh.alive()
        wh.stop()
    end_rss = max(m for _t, m in res.rss_samples)
    growth = (end_rss - base_rss) / base_rss
    summary = {
        **res.summary(),
        "rss_base_mib": round(base_rss, 1),
        "rss_max_mib": round(end_rss, 1),
        "rss_growth_pct": round(growth * 100, 2),
        "soak": SOAK,
        "server_cpu": server_cpu,
    }
    print("load:", json.dumps(summary))
    out = os.environ.get("DRAGUARD_RELIABILITY_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "load.json").write_text(json.dumps(summary, indent=2))
    assert alive, wh.log()[-3000:]
    assert res.five_xx == 0, summary
    assert not res.errors, f"dropped connections or timeouts: {summary}"
    assert res.bad_uid == 0, summary
    assert set(res.statuses) == {200}, summary
    assert growth < 0.10, f"RSS grew {growth:.1%}: {summary}"
    if SOAK:
        assert res.sent >= 20000 and res.seconds >= 60, summary
