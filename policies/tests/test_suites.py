"""Run every policy test suite under policies/tests (format: README.md in this directory)."""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core.findings import Finding
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory, load_inventory
from webhook.engine.context import ALL_RESOURCE_VERSIONS, Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import load_policies, source_objects
from webhook.policy.model import PolicySet

HERE = Path(__file__).resolve().parent


@dataclass
class Case:
    suite: str
    name: str
    objects: list[SourceObject]
    policies: PolicySet
    inventory: Inventory
    context: Context
    only: Sequence[str]
    expect: list[Mapping[str, Any]]


def _context(raw: Mapping[str, Any]) -> Context:
    today = raw.get("today")
    return Context(
        namespace_labels={k: dict(v or {}) for k, v in (raw.get("namespaceLabels") or {}).items()},
        served_versions=frozenset(raw.get("servedVersions") or ALL_RESOURCE_VERSIONS),
        today=dt.date.fromisoformat(str(today)) if today else dt.date.today(),
        admission=bool(raw.get("admission", False)),
    )


def load_suite(path: Path) -> list[Case]:
    base = path.parent
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    name = raw.get("name") or base.name
    pol_paths = raw.get("policies") or ["../.."]
    if isinstance(pol_paths, str):
        pol_paths = [pol_paths]
    policies = PolicySet.empty()
    for p in pol_paths:
        policies = policies.merged(load_policies(base / p))
    inventory = load_inventory(base / raw["inventory"]) if raw.get("inventory") else Inventory.empty()
    ctx = _context(raw.get("context") or {})
    cases = []
    for c in raw["cases"]:
        objs: list[SourceObject] = []
        for f in c.get("inputs") or ():
            fp = base / f
            objs.extend(source_objects(fp.read_text(encoding="utf-8"), str(fp)))
        if c.get("input"):
            objs.extend(source_objects(c["input"], f"{path}[{c['name']}]"))
        expect = c.get("expect")
        cases.append(
            Case(
                name,
                c["name"],
                objs,
                policies,
                inventory,
                ctx,
                c.get("only") or raw.get("only") or ["*"],
                [] if expect in (None, "none") else list(expect),
            )
        )
    return cases


def _matches(exp: Mapping[str, Any], f: Finding) -> bool:
    if exp["rule"] != f.rule:
        return False
    if "mode" in exp and exp["mode"] != f.mode.value:
        return False
    if "object" in exp and exp["object"] != str(f.object):
        return False
    return not ("line" in exp and exp["line"] != f.line)


def check_case(case: Case) -> list[str]:
    """Problems with one case (empty when it passes)."""
    report = evaluate(case.objects, case.policies, case.inventory, case.context)
    got = [f for f in report.findings if any(fnmatch.fnmatchcase(f.rule, g) for g in case.only)]
    left = list(got)
    problems = []
    for exp in case.expect:
        hit = next((f for f in left if _matches(exp, f)), None)
        if hit is None:
            problems.append(f"expected {dict(exp)} not found")
        else:
            left.remove(hit)
    for f in left:
        problems.append(f"unexpected {f.rule} ({f.mode.value}) on {f.object} line {f.line}: {f.message}")
    return problems


ALL_CASES = [c for p in sorted(HERE.glob("*/suite.yaml")) for c in load_suite(p)]


@pytest.mark.parametrize("case", ALL_CASES, ids=[f"{c.suite}: {c.name}" for c in ALL_CASES])
def test_suite_case(case: Case) -> None:
    problems = check_case(case)
    assert not problems, "\n".join(problems)


def test_every_suite_has_cases() -> None:
    suites = sorted(HERE.glob("*/suite.yaml"))
    assert len(suites) >= 4
    assert all(
        any(c.suite == (yaml.safe_load(s.read_text()).get("name") or s.parent.name) for c in ALL_CASES)
        for s in suites
    )
