"""The CEL compile cache is bounded by memory, and one request compiles a bounded amount of new text."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from webhook.cel import env
from webhook.cel.issues import CelIssue


def selector(i: int, terms: int) -> str:
    parts = " || ".join(
        f"device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 {i}-{j}'" for j in range(terms)
    )
    return f"device.driver == 'gpu.nvidia.com' && ({parts})"


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    env.clear_cache()
    yield
    env.clear_cache()


def test_cache_is_bounded_by_estimated_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "CACHE_BYTES", 4 * 1024 * 1024)
    big = [selector(i, 20) for i in range(40)]  # ~1.5 KiB each: ~230 KiB estimated per entry
    for text in big:
        assert not isinstance(env.compile_or_issue(text), CelIssue)
    entries, size = env.cache_stats()
    assert size <= 4 * 1024 * 1024
    assert 0 < entries < len(big)
    # The most recent entries are the ones kept.
    assert env._cache.get(big[-1]) is not None and env._cache.get(big[0]) is None


def test_one_request_compiles_at_most_its_budget() -> None:
    texts = [selector(i, 30) for i in range(40)]  # ~2.2 KiB each, 88 KiB in all
    with env.compile_budget(16 * 1024):
        results = [env.compile_or_issue(t) for t in texts]
    compiled = [r for r in results if not isinstance(r, CelIssue)]
    skipped = [r for r in results if isinstance(r, CelIssue)]
    assert 5 <= len(compiled) <= 8
    assert skipped and all(r.check == "cel/unsupported" and "budget" in r.message for r in skipped)
    assert env.cache_stats()[0] == len(compiled)  # nothing cached for the skipped ones
    # Known text costs nothing: a later request sees the cached results and compiles the rest.
    with env.compile_budget(64 * 1024):
        again = [env.compile_or_issue(t) for t in texts[:20]]
    assert not any(isinstance(r, CelIssue) for r in again)


def test_texts_over_the_api_limit_are_refused_without_spending_the_budget() -> None:
    huge = "device.driver == '" + "x" * (11 * 1024) + "'"
    with env.compile_budget(1024):
        issue = env.compile_or_issue(huge)
        assert isinstance(issue, CelIssue) and issue.check == "cel/limits"
        small = env.compile_or_issue("device.driver == 'gpu.nvidia.com'")
    assert not isinstance(small, CelIssue)


def test_one_request_runs_a_bounded_number_of_device_evaluations() -> None:
    from tests.server.conftest import seed_inventory
    from webhook.cel.match import match_compiled

    devices = list(seed_inventory().devices)
    assert len(devices) >= 12
    # Reads a value every device has its own of: one evaluation per device.
    sel = env.compile_selector("device.attributes['gpu.nvidia.com'].uuid != ''")
    free = match_compiled([sel], devices)
    assert len(free.matched) == len(devices) and not free.errors
    with env.compile_budget(evaluations=5):
        bounded = match_compiled([sel], devices)
    assert len(bounded.matched) == 5
    assert bounded.errors and all(e.limit for e in bounded.errors)


def test_new_cel_text_is_rate_limited_per_identity_and_for_all() -> None:
    from webhook.server.admission import CelRate

    now = [100.0]
    rate = CelRate(per_identity=1000, burst=4000, total=3000, total_burst=6000, clock=lambda: now[0])
    assert rate.allowance("a") == 4000
    rate.charge("a", 4000)
    assert rate.allowance("a") == 0  # a's burst is spent ...
    assert rate.allowance("b") == 2000  # ... and so is most of everyone's
    rate.charge("b", 2000)
    assert rate.allowance("c") == 0  # a third identity gets nothing until the shared bucket refills
    now[0] += 1.0
    assert rate.allowance("a") == 1000 and rate.allowance("c") == 3000


def test_the_budget_holds_only_inside_its_block_even_when_the_block_raises() -> None:
    assert env._budget.get() is None
    with env.compile_budget(100, evaluations=7) as outer:
        assert env._budget.get() is outer and (outer.left, outer.evaluations) == (100, 7)
        with pytest.raises(RuntimeError), env.compile_budget(5) as inner:
            assert env._budget.get() is inner
            raise RuntimeError("boom")
        assert env._budget.get() is outer
    assert env._budget.get() is None
