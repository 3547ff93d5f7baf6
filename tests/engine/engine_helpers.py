"""Helpers for the engine tests: YAML text in, findings out, through the real loaders."""

from __future__ import annotations

from pathlib import Path

from webhook.core.findings import Report
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import load_policies, parse_policy_text, source_objects
from webhook.policy.model import PolicySet

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "tests" / "fixtures" / "seed"
POLICIES = ROOT / "policies"


def objs(text: str, file: str = "input.yaml") -> list[SourceObject]:
    return source_objects(text, file)


def run(
    text: str,
    policies: PolicySet | str | None = None,
    inventory: Inventory | None = None,
    ctx: Context | None = None,
    modules: tuple[str, ...] | None = ("structure", "tier"),
) -> Report:
    """Evaluate YAML text; `policies` may be YAML text, a PolicySet, or None for the shipped set."""
    if policies is None:
        pset = load_policies(POLICIES)
    elif isinstance(policies, str):
        pset = parse_policy_text(policies, "policy.yaml")
    else:
        pset = policies
    return evaluate(objs(text), pset, inventory or Inventory.empty(), ctx, rule_modules=modules)


def rules(report: Report) -> list[str]:
    return sorted(f.rule for f in report.findings)
