"""The inventory memo (derived facts per inventory, shared by every review against it) is bounded by
entry count and by bytes: a stream of distinct tenant-written selectors cannot grow it."""

from __future__ import annotations

import tracemalloc

from tests.engine.engine_helpers import SEED, run
from webhook.dra.inventory import _MEMO_BYTES, _MEMO_LIMIT, Inventory, Memo, approx_bytes, load_inventory


def _seed() -> Inventory:
    return load_inventory(SEED)


def _claim(name: str, selector: str) -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: team-a}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com-h100
        selectors:
        - cel: {{expression: "{selector}"}}
"""


def test_memo_evicts_the_oldest_to_stay_within_count_and_bytes() -> None:
    memo = Memo(max_entries=10, max_bytes=100_000)
    for i in range(50):
        memo.put(("match", (f"sel-{i}",)), list(range(1000)))  # ~8 KiB of pointers each
        assert len(memo) <= 10 and memo.nbytes <= 100_000
        assert memo.nbytes == sum(memo.sizes.values()) and set(memo.sizes) == set(memo)
    # Most recent kept, oldest gone.
    assert ("match", ("sel-49",)) in memo and ("match", ("sel-0",)) not in memo
    # An entry larger than the whole bound is not stored (and evicts nothing).
    before = dict(memo)
    memo.put("huge", "x" * 200_000)
    assert "huge" not in memo and dict(memo) == before
    # Count bound alone.
    small = Memo(max_entries=3, max_bytes=10**9)
    for i in range(10):
        small.put(i, i)
    assert list(small) == [7, 8, 9]


def test_sizes_count_the_selector_text_and_the_listed_devices() -> None:
    text = "device.attributes['gpu.nvidia.com'].productName == '" + "x" * 7000 + "'"
    assert approx_bytes(("match", (text,))) > 7000
    devices = _seed().devices
    assert approx_bytes(list(devices) * 100) >= 8 * len(devices) * 100


def test_a_stream_of_distinct_selectors_through_the_engine_keeps_the_memo_bounded() -> None:
    inv = _seed()
    # The real rule path memoises each claim's match under its selector text; a tight bound makes
    # the stream long enough to cross it many times in a unit test.
    memo = Memo(max_entries=_MEMO_LIMIT, max_bytes=64 * 1024)
    object.__setattr__(inv, "_memo", memo)
    peak = 0
    for i in range(60):
        pad = "y" * 2000
        sel = f"device.attributes['gpu.nvidia.com'].productName != '{pad}-{i}'"
        report = run(_claim(f"c{i}", sel), inventory=inv)
        assert not [f for f in report.findings if f.rule.startswith("internal/")], report.findings
        peak = max(peak, memo.nbytes)
        assert memo.nbytes <= 64 * 1024
    assert peak > 32 * 1024, "the stream did reach the bound"
    # The newest request's match is there (the memo still serves), the first ones are gone.
    keys = [k for k in memo if isinstance(k, tuple) and k[0] == "match"]
    assert any("-59'" in k[1][-1] for k in keys) and not any(k[1][-1].endswith("-0'") for k in keys)


def test_shipped_bounds_hold_against_large_matches_of_a_10000_device_inventory() -> None:
    """1,000 distinct ~7 KiB selectors, each matching 10,000 devices: what the count bound alone
    (4,096 entries) let grow to about 85 MiB here (350 MiB at 4,096) stays within the byte bound."""
    inv = Inventory()
    matched = [object() for _ in range(10_000)]
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for i in range(1_000):
            sel = f"device.attributes['gpu.nvidia.com'].uuid != '{i:05d}" + "z" * 7000 + "'"
            inv.cached(("match", (sel,)), lambda: list(matched))
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    memo = inv._memo
    assert memo.nbytes <= _MEMO_BYTES and len(memo) < _MEMO_LIMIT
    # Measured allocations agree with the bound (the estimate is not an undercount).
    assert grown <= _MEMO_BYTES * 1.25, f"{grown / 2**20:.1f} MiB held"
