"""Every claim shape in tests/engine/fixtures/claim-shapes.json, dry-run on the real API server (as
kubectl sends it: strict field validation) and reviewed offline: the two must agree on what is
rejected, and on the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from webhook.core.source import SourceObject
from webhook.dev.cluster import LocalCluster
from webhook.dev.kube import ApiError
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.model import PolicySet

FIXTURE = Path(__file__).parents[1] / "engine" / "fixtures" / "claim-shapes.json"
SHAPES: list[dict[str, Any]] = json.loads(FIXTURE.read_text())


def _dry_run(cluster: LocalCluster, obj: dict[str, Any], strict: bool) -> str | None:
    plural = "resourceclaims" if obj["kind"] == "ResourceClaim" else "resourceclaimtemplates"
    path = f"/apis/{obj['apiVersion']}/namespaces/default/{plural}?dryRun=All"
    if strict:
        path += "&fieldValidation=Strict"
    try:
        cluster.kube().request("POST", path, obj)
        return None
    except ApiError as e:
        assert e.status in (400, 422), str(e)
        return str(e)


@pytest.mark.parametrize("shape", SHAPES, ids=[s["name"] for s in SHAPES])
def test_review_and_api_server_agree(cluster: LocalCluster, shape: dict[str, Any]) -> None:
    obj = shape["object"]
    report = evaluate([SourceObject(obj)], PolicySet.empty(), Inventory.empty(), Context(),
                      rule_modules=("structure",))  # fmt: skip
    invalid = [f for f in report.findings if f.rule == "structure/invalid"]
    strict = _dry_run(cluster, obj, strict=True)
    lenient = _dry_run(cluster, obj, strict=False)
    # Rejected under both field-validation settings, or under neither: what a claim is does not
    # depend on the client.
    assert (strict is None) == (lenient is None), (strict, lenient)
    assert (strict is None) == (not invalid), (strict, [f.message for f in invalid])
    # The fixture records the field the API server names (so the offline test keeps agreeing).
    if shape["apiServerField"] is not None:
        assert shape["apiServerField"] in (lenient or ""), lenient
    else:
        assert lenient is None
