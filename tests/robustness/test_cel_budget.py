"""A selector beyond the CEL runtime's iteration budget (but within the API server's cost estimate) is a
cel/unsupported warning: not a rule crash, and never a denial of an object the API server accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.robustness.conftest import POLICIES, evaluate_one, run_review
from webhook.cel.env import CelEvalError, compile_selector
from webhook.cel.lint import lint_selector
from webhook.cel.match import match_devices
from webhook.dra.inventory import Inventory
from webhook.policy.model import PolicySet

TEN = "[1,2,3,4,5,6,7,8,9,10]"
# 10^4 iterations: cheap for the API server's cost estimate, over the runtime's iteration budget.
# It reads the device in its innermost step, so draguard cannot evaluate it ahead element by
# element, as it does constant comprehensions (webhook/cel/fold.py).
NESTED = f"{TEN}.all(a, {TEN}.all(b, {TEN}.all(c, {TEN}.all(d, a+b+c+d > size(device.driver) - 100))))"


def _claim(expression: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "team-a"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com-h100",
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                    }
                ]
            }
        },
    }


def test_evaluation_beyond_the_budget_is_a_cel_error(inventory: Inventory) -> None:
    selector = compile_selector(NESTED)
    with pytest.raises(CelEvalError) as info:
        selector.evaluate(inventory.devices[0])
    assert info.value.limit and "Iteration budget exceeded" in info.value.message


def test_match_reports_the_budget_as_undecided(inventory: Inventory) -> None:
    result = match_devices([NESTED], inventory.devices)
    assert result.undecided and result.matched == []
    assert all(e.limit for e in result.errors)
    ordinary = match_devices(["device.driver == 'nope'"], inventory.devices)
    assert not ordinary.undecided


def test_lint_says_cel_unsupported_and_not_no_match(inventory: Inventory) -> None:
    issues = lint_selector(NESTED, devices=inventory.devices, driver="gpu.nvidia.com")
    checks = {i.check for i in issues}
    assert "cel/unsupported" in checks and "cel/no-match" not in checks and "cel/limits" not in checks
    budget = next(i for i in issues if i.check == "cel/unsupported")
    assert "Iteration budget exceeded" in budget.message and "API server" in budget.message


def test_engine_warns_without_internal_errors(policies: PolicySet, inventory: Inventory) -> None:
    for admission in (False, True):
        report = evaluate_one(_claim(NESTED), policies, inventory, admission=admission)
        rules = {f.rule for f in report.findings}
        assert not any(r.startswith("internal/") for r in rules), report.findings
        assert "cel/unsupported" in rules and "cel/limits" not in rules
        budget = [f for f in report.findings if f.rule == "cel/unsupported"]
        assert all(f.mode.value == "warn" for f in budget), budget
        # No verdict on capacity from an expression that could not be evaluated.
        assert "structure/unsatisfiable" not in rules


def test_review_of_the_claim(tmp_path: Path, inventory_path: Path) -> None:
    import yaml

    f = tmp_path / "claim.yaml"
    f.write_text(yaml.safe_dump(_claim(NESTED)))
    run = run_review(
        [str(f), "--policies", str(POLICIES), "--inventory", str(inventory_path), "--format", "json"]
    )
    # A warning, not a denial: the API server accepts this selector.
    assert run.code == 0, run.out + run.err
    assert "internal/" not in run.out and "cel/unsupported" in run.out
