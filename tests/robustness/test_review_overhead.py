"""`draguard review` costs time in proportion to its input: no per-item rescans of line maps."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from tests.robustness.conftest import POLICIES, run_review
from webhook.review.inputs import read_file


def _list(n: int) -> str:
    items = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i}"}, "data": {"a": "b"}}
        for i in range(n)
    ]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}, sort_keys=False)


def test_list_items_keep_their_own_lines(tmp_path: Path) -> None:
    f = tmp_path / "list.yaml"
    f.write_text(_list(3))
    objs = read_file(f).objects
    assert [o.obj["metadata"]["name"] for o in objs] == ["c0", "c1", "c2"]
    text = f.read_text().splitlines()
    for o in objs:
        assert set(o.lines) == {"/apiVersion", "/kind", "/metadata", "/metadata/name", "/data", "/data/a"}
        assert text[o.lines["/metadata/name"] - 1].strip() == f"name: {o.obj['metadata']['name']}"
        assert o.line == o.lines["/apiVersion"]


def test_a_4000_item_list_reads_in_linear_time(tmp_path: Path) -> None:
    f = tmp_path / "big-list.yaml"
    f.write_text(_list(4000))
    t0 = time.perf_counter()
    objs = read_file(f).objects
    took = time.perf_counter() - t0
    assert len(objs) == 4000 and objs[3999].lines["/metadata/name"] > objs[0].lines["/metadata/name"]
    assert took < 3.0, f"{took:.2f} s (re-scanning the line map per item took about 27 s)"


def test_review_of_a_big_list(tmp_path: Path, inventory_path: Path) -> None:
    f = tmp_path / "big-list.yaml"
    f.write_text(_list(2000))
    run = run_review([str(f), "--policies", str(POLICIES), "--inventory", str(inventory_path)])
    assert run.code == 0, run.err
    assert "2000 objects in 1 file" in run.out
    assert run.seconds < 5.0


def test_line_maps_of_the_deepest_yaml_libyaml_accepts() -> None:
    import sys

    from webhook.review.inputs import parse_text

    body = "apiVersion: v1\nkind: Pod\nmetadata:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(990))
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # a deep caller's stack: the walk must not depend on it
    try:
        docs = parse_text(body, "deep.yaml")
    finally:
        sys.setrecursionlimit(old)
    assert max(docs[0].lines.values()) == 993
