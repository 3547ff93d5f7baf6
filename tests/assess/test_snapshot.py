"""`--snapshot` writes what `review --cluster-state` and `--inventory` read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.assess.conftest import CLASSES, SLICES
from webhook.assess.snapshot import SnapshotError, SnapshotWriter
from webhook.review.pipeline import load_cluster_state, load_inventory_file


def test_snapshot_is_read_by_review(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    with SnapshotWriter(str(path)) as snap:
        snap.write(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": "team-a", "labels": {"draguard.io/team": "ml"}},
                }
            ]
        )
        snap.write(SLICES)
        snap.write(CLASSES)
        snap.write([{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "not-kept"}}])
    assert snap.count == 1 + len(SLICES) + len(CLASSES)
    doc = json.loads(path.read_text())
    assert doc["kind"] == "List" and all(i["kind"] != "Pod" for i in doc["items"])
    assert load_cluster_state(str(path))["team-a"]["draguard.io/team"] == "ml"
    inv = load_inventory_file(str(path))
    assert len(inv.devices) == 16 and "gpu.nvidia.com-h100" in inv.classes


def test_a_failed_run_leaves_no_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    with pytest.raises(RuntimeError), SnapshotWriter(str(path)) as snap:
        snap.write(SLICES)
        raise RuntimeError("list failed")
    assert not path.exists() and not list(tmp_path.iterdir())


def test_an_unwritable_path_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="cannot write the snapshot"):
        SnapshotWriter(str(tmp_path / "missing-dir" / "s.json"))
