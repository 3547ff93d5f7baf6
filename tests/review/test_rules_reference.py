"""`draguard rules` and docs/rules.md: every rule id the engine can emit, documented once."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.review.conftest import Run
from webhook.cel.issues import CHECKS
from webhook.core.findings import Mode, Severity
from webhook.engine.rules import registry
from webhook.review import rules

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / rules.RULES_DOC


def test_every_id_the_registry_emits_has_an_entry() -> None:
    ids = [d.id for d in rules.catalog()]
    assert len(ids) == len(set(ids))
    # Each registered rule's id (or family) is in the reference, and so is each CEL check.
    for module in registry():
        for rule in module.rules:
            prefix = rule.id_prefix
            if prefix == "cel/":
                continue
            expected = f"{prefix}<policy>" if prefix.endswith("/") else prefix
            assert expected in ids, f"{module.name}: {expected} is not documented"
    for check in CHECKS:
        assert check in ids
    for engine_id in ("structure/too-deep", "exception/expired", "internal/<module>", "migrate/legacy-gpu",
                      "config/opaque", "tier/<policy>", "quota/<policy>", "structure/invalid"):
        assert engine_id in ids


def test_family_lookup_maps_concrete_ids() -> None:
    tier = rules.lookup("tier/llm-h100")
    assert tier is not None and tier.id == "tier/<policy>"
    internal = rules.lookup("internal/engine")
    assert internal is not None and internal.id == "internal/<module>"
    exact = rules.lookup("cel/no-match")
    assert exact is not None and exact.id == "cel/no-match"
    # A bare prefix is not a rule of the family; an id nobody emits is not documented.
    assert rules.lookup("tier/") is None
    assert rules.lookup("cel/nonsense") is None


def test_every_finding_of_a_real_review_is_documented(
    draguard: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    run = draguard("review", "examples", "-f", "json")
    assert run.code in (0, 1), run.err
    found = {f["rule"] for f in json.loads(run.out)["findings"]}
    assert found, "examples/ carries findings"
    assert {r for r in found if rules.lookup(r) is None} == set()


def test_rules_json(draguard: Callable[..., Run]) -> None:
    run = draguard("rules", "--format", "json")
    assert run.code == 0, run.err
    entries = json.loads(run.out)["rules"]
    by_id = {e["id"]: e for e in entries}
    assert set(by_id) == {d.id for d in rules.catalog()}
    for e in entries:
        assert e["summary"] and e["fix"], e["id"]
        assert e["mode"] in {m.value for m in Mode}
        assert e["severity"] in {s.value for s in Severity}
    assert by_id["structure/invalid"]["mode"] == "enforce"
    assert by_id["tier/<policy>"]["family"] is True
    assert by_id["tier/<policy>"]["anchor"] == "tierpolicy"


def test_rules_text_names_every_rule_with_its_fix(draguard: Callable[..., Run]) -> None:
    run = draguard("rules")
    assert run.code == 0, run.err
    for d in rules.catalog():
        assert f"{d.id}  [{d.mode.value}, {d.severity.value}]" in run.out
    assert run.out.count("  Fix: ") == len(rules.catalog())


def test_docs_rules_md_is_current() -> None:
    expected = rules.render_markdown(rules.catalog())
    actual = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    assert actual == expected, (
        f"{rules.RULES_DOC} is stale: regenerate it with `{rules.REGENERATE}` "
        "(or .venv/bin/python -m webhook.cli rules --format markdown > docs/rules.md)"
    )


def test_docs_rules_md_has_one_anchor_per_rule() -> None:
    text = DOC.read_text(encoding="utf-8")
    headings = re.findall(r"^### (.+)$", text, flags=re.M)
    assert headings == [d.id for d in rules.catalog()]
    anchors = [rules.anchor(h) for h in headings]
    assert len(anchors) == len(set(anchors))
    # The index table links to each heading's anchor.
    for a in anchors:
        assert f"](#{a})" in text


def test_anchor_follows_the_markdown_heading_rule() -> None:
    assert rules.anchor("structure/invalid") == "structureinvalid"
    assert rules.anchor("cel/no-match") == "celno-match"
    assert rules.anchor("tier/<policy>") == "tierpolicy"
