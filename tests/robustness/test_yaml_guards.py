"""Untrusted YAML: alias bombs and integers too long to convert are clean errors naming file and line,
in review inputs, inventories and policies alike."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.robustness.conftest import POLICIES, run_review
from webhook.dra.inventory import InventoryError, load_inventory
from webhook.dra.yamlload import ALIAS_BUDGET, load_all
from webhook.policy.load import PolicyError, load_policies

LAUGHS = (
    "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
    + "kind: Pod\napiVersion: v1\nmetadata: {name: bomb, labels: *i}\nspec: {containers: *i}\n"
)
SPEC_BOMB = (
    "apiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec:\n  x0: &x0 {c: [{name: a, image: b}]}\n"
    + "".join(f"  x{i}: &x{i} [*x{i - 1}, *x{i - 1}, *x{i - 1}, *x{i - 1}]\n" for i in range(1, 14))
    + "  containers: *x13\n"
)
HUGE_INT = (
    "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: " + "9" * 5000 + "}\n"
)
POLICY_BOMB = (
    "apiVersion: policy.draguard.io/v1alpha1\nkind: GpuTierPolicy\nmetadata: {name: t}\nspec:\n"
    "  x0: &x0 [a, b, c, d]\n"
    + "".join(f"  x{i}: &x{i} [*x{i - 1}, *x{i - 1}, *x{i - 1}, *x{i - 1}]\n" for i in range(1, 14))
)


def _review(path: Path, inventory_path: Path) -> tuple[int, str]:
    run = run_review([str(path), "--policies", str(POLICIES), "--inventory", str(inventory_path)])
    # Refused before expansion: an expanded bomb takes minutes and gigabytes. The bound tells the two
    # apart with slack for a loaded CI machine (the CPU-time checks below are the tight ones).
    assert run.seconds < 5.0, f"{path.name}: {run.seconds:.2f} s"
    assert "Traceback" not in run.out + run.err
    return run.code, run.err.strip()


@pytest.mark.parametrize(
    ("body", "line"), [(LAUGHS, 6), (SPEC_BOMB, 12)], ids=["billion-laughs", "spec-bomb"]
)
def test_review_refuses_alias_bombs(tmp_path: Path, inventory_path: Path, body: str, line: int) -> None:
    f = tmp_path / "bomb.yaml"
    f.write_text(body)
    code, err = _review(f, inventory_path)
    assert code == 2
    assert "bomb.yaml:" in err and "YAML alias expansion too large" in err and len(err.splitlines()) == 1
    assert f"bomb.yaml:{line}:" in err


def test_review_keeps_ordinary_aliases(tmp_path: Path, inventory_path: Path) -> None:
    f = tmp_path / "anchors.yaml"
    f.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: team-a}\nspec:\n  containers:\n"
        "  - {name: a, image: x, env: &env [{name: A, value: '1'}]}\n"
        "  - {name: b, image: x, env: *env}\n"
    )
    code, err = _review(f, inventory_path)
    assert code == 0, err


def test_review_refuses_a_huge_integer(tmp_path: Path, inventory_path: Path) -> None:
    f = tmp_path / "huge.yaml"
    f.write_text(HUGE_INT)
    code, err = _review(f, inventory_path)
    assert code == 2 and "huge.yaml:4:" in err and "5000 digits" in err, err
    j = tmp_path / "huge.json"
    j.write_text('{"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": ' + "9" * 5000 + "}}")
    code, err = _review(j, inventory_path)
    assert code == 2 and "huge.json:1:" in err and "5000 digits" in err, err


def test_budget_counts_expansion_not_text() -> None:
    # Just under the budget passes; the guard is about expansion, not about aliases as such.
    n = ALIAS_BUDGET // 10
    docs = list(load_all("a: &a [" + ", ".join(["1"] * 9) + "]\nb: [" + ", ".join(["*a"] * n) + "]\n"))
    assert len(docs[0]["b"]) == n


def test_inventory_refuses_alias_bombs_and_huge_ints(tmp_path: Path) -> None:
    for name, body in (("inv-bomb.yaml", LAUGHS), ("inv-int.yaml", HUGE_INT)):
        f = tmp_path / name
        f.write_text(body)
        t0 = time.process_time()
        with pytest.raises(InventoryError) as info:
            load_inventory(f)
        assert time.process_time() - t0 < 1.0  # CPU seconds
        assert name in str(info.value)


def test_policies_refuse_alias_bombs(tmp_path: Path) -> None:
    (tmp_path / "bomb.yaml").write_text(POLICY_BOMB)
    t0 = time.process_time()
    with pytest.raises(PolicyError) as info:
        load_policies(tmp_path)
    assert time.process_time() - t0 < 1.0  # CPU seconds
    text = str(info.value)
    assert "bomb.yaml" in text and "YAML alias expansion too large" in text


@pytest.mark.parametrize("body", ["r: &r [1, *r]\n", "a: &a {b: {c: *a}}\n"], ids=["list", "map"])
def test_recursive_aliases_are_refused(tmp_path: Path, inventory_path: Path, body: str) -> None:
    f = tmp_path / "cycle.yaml"
    f.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  " + body)
    code, err = _review(f, inventory_path)
    assert code == 2 and "cycle.yaml:5:" in err and "recursive structure" in err, err


def test_shared_anchors_stay_shared_and_keep_lines() -> None:
    from webhook.review.inputs import parse_yaml_documents

    doc = parse_yaml_documents("a: &x {b: [1, {c: d}]}\ne: *x\nf: [*x, *x]\n", "f.yaml")[0]
    assert doc.data["e"] is doc.data["a"] and doc.data["f"][0] is doc.data["a"]
    assert doc.lines["/a/b/1/c"] == 1 and doc.lines["/e"] == 2 and doc.lines["/f"] == 3
