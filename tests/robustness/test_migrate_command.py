"""`draguard migrate` on large and hostile manifests: a clean error or a diff, in bounded time."""

from __future__ import annotations

import difflib
import random
import time
from pathlib import Path

import yaml

from tests.robustness.conftest import POLICIES
from webhook.review import rewrite
from webhook.review.rewrite import RewriteError, migrate_paths, unified_diff


def _apply(a: list[str], diff: list[str]) -> list[str]:
    """Apply a unified diff (the format written here) to `a`."""
    out: list[str] = []
    i = 0
    for line in diff[2:]:
        if line.startswith("@@"):
            old = line.split()[1][1:].split(",")
            start = int(old[0]) - 1 if len(old) == 1 or int(old[1]) > 0 else int(old[0])
            out.extend(a[i:start])
            i = start
        elif line[0] == " ":
            out.append(a[i])
            i += 1
        elif line[0] == "-":
            i += 1
        else:
            out.append(line[1:])
    return out + a[i:]


def test_anchored_diff_is_a_correct_unified_diff() -> None:
    rng = random.Random(7)
    old_small = rewrite.SMALL_DIFF
    rewrite.SMALL_DIFF = 0  # force the anchored path on small inputs
    try:
        identical = 0
        for _ in range(200):
            a = [f"l{rng.randint(0, 40)}\n" for _ in range(rng.randint(0, 60))]
            b = list(a)
            for _ in range(rng.randint(0, 8)):
                k = rng.randint(0, len(b))
                roll = rng.random()
                if roll < 0.4:
                    b.insert(k, f"n{rng.randint(0, 99)}\n")
                elif b:
                    b[min(k, len(b) - 1)] = f"r{rng.randint(0, 9)}\n"
            for n in (0, 3):
                diff = list(unified_diff(a, b, "a/x", "b/x", n))
                assert _apply(a, diff) == b
                identical += diff == list(difflib.unified_diff(a, b, "a/x", "b/x", n=n))
        assert identical > 300  # mostly the very same text difflib writes
    finally:
        rewrite.SMALL_DIFF = old_small


def test_diff_of_a_migrated_3000_container_pod_is_fast() -> None:
    def pod(claims: bool) -> list[str]:
        def res(i: int) -> dict[str, object]:
            return {"claims": [{"name": f"c{i}-gpu"}]} if claims else {"limits": {"nvidia.com/gpu": "1"}}

        containers = [{"name": f"c{i}", "image": "x", "resources": res(i)} for i in range(3000)]
        return yaml.safe_dump({"spec": {"containers": containers}}).splitlines(keepends=True)

    a, b = pod(False), pod(True)
    t0 = time.perf_counter()
    diff = list(unified_diff(a, b, "a/p.yaml", "b/p.yaml"))
    took = time.perf_counter() - t0
    assert _apply(a, diff) == b
    assert took < 1.0, f"{took:.2f} s (difflib alone took about 14 s)"


def test_unreadable_legacy_manifest_is_an_error_with_its_line(tmp_path: Path) -> None:
    f = tmp_path / "bomb.yaml"
    f.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n"
        "  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]\n"
        "  x0: &x0 [a, b, c, d]\n"
        + "".join(f"  x{i}: &x{i} [*x{i - 1}, *x{i - 1}, *x{i - 1}, *x{i - 1}]\n" for i in range(1, 14))
    )
    t0 = time.perf_counter()
    try:
        migrate_paths([str(f)], policies=str(POLICIES), policies_required=False, strategy=None, write=False)
    except RewriteError as exc:
        assert "bomb.yaml:" in str(exc) and "YAML alias expansion too large" in str(exc)
    else:
        raise AssertionError("an alias bomb was migrated")
    assert time.perf_counter() - t0 < 2.0
