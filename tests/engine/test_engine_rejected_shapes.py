"""Claims and templates the API server rejects are `structure/invalid` errors naming the field, and
`explain` never calls them allocatable. The shapes and the API server's verdicts are in
fixtures/claim-shapes.json; tests/e2e/test_rejected_shapes.py dry-runs them on a real API server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from webhook.core.findings import Mode
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.engine.explain import explain
from webhook.policy.model import PolicySet

SHAPES: list[dict[str, Any]] = json.loads((Path(__file__).parent / "fixtures/claim-shapes.json").read_text())


def _field(message: str) -> str:
    """The field a structure/invalid message names ("the API server rejects this X: FIELD: why")."""
    return message.split(": ")[1]


@pytest.mark.parametrize("shape", SHAPES, ids=[s["name"] for s in SHAPES])
def test_review_rejects_exactly_what_the_api_server_rejects(shape: dict[str, Any]) -> None:
    report = evaluate([SourceObject(shape["object"])], PolicySet.empty(), Inventory.empty(), Context(),
                      rule_modules=("structure",))  # fmt: skip
    invalid = [f for f in report.findings if f.rule == "structure/invalid"]
    if shape["apiServerField"] is None:
        assert invalid == [], invalid
        return
    assert invalid and all(f.mode is Mode.ENFORCE for f in invalid)
    # The field the API server names, or one inside it. The API server names v1beta1 fields by their
    # v1 path (`exactly.` added); draguard names them as written.
    want = shape["apiServerField"]
    if shape["object"]["apiVersion"].endswith("v1beta1"):
        want = want.replace(".exactly.", ".")
    assert any(_field(f.message).startswith(want) for f in invalid), (want, [f.message for f in invalid])


@pytest.mark.parametrize("shape", [s for s in SHAPES if s["apiServerField"]], ids=lambda s: s["name"])
def test_explain_never_says_a_rejected_claim_can_be_allocated(shape: dict[str, Any]) -> None:
    for e in explain([SourceObject(shape["object"])], Inventory.empty()):
        assert e.satisfiable is False
        assert "can be allocated" not in e.render().replace("CANNOT be allocated", "")
        assert any("the API server rejects" in r for r in e.reasons)


def test_count_zero_is_defaulted_to_one_device() -> None:
    from webhook.dra.objects import read_claim_spec

    request = {"name": "g", "exactly": {"deviceClassName": "c", "count": 0}}
    spec = read_claim_spec({"devices": {"requests": [request]}}, "resource.k8s.io/v1")
    # The API server stores count 1 for an explicit 0 (the unset value), so it is charged 1, not 0.
    assert spec.requests[0].count == 1
