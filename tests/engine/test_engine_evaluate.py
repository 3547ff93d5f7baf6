"""evaluate(): exceptions, expiry, and rules that fail."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

import pytest
from engine_helpers import (
    POLICIES,
    objs,
    rules,
    run,
)

import webhook.engine.evaluate as ev
from webhook.core.findings import Finding, Mode, Severity
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.rules import RuleModule
from webhook.engine.rules.base import FunctionRule, RuleContext
from webhook.policy.load import load_policies, parse_policy_text

BETA_CLAIM = """
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaim
metadata: {name: old-claim, namespace: research}
spec:
  devices:
    requests: [{name: gpu, deviceClassName: gpu.nvidia.com-h100}]
"""


def exception(expires: str, rules: str = '["structure/deprecated-version"]', extra: str = "") -> str:
    return f"""
apiVersion: policy.draguard.io/v1alpha1
kind: PolicyException
metadata: {{name: research-betas}}
spec:
  expires: {expires}
  reason: waiting for the 1.34 upgrade
  rules: {rules}
  namespaces: [research]
{extra}
"""


TODAY = dt.date(2026, 11, 30)


def test_live_exception_turns_the_finding_into_an_audit_record() -> None:
    r = run(BETA_CLAIM, policies=exception("2026-12-31"), ctx=Context(today=TODAY))
    (f,) = r.findings
    assert f.rule == "structure/deprecated-version" and f.mode is Mode.AUDIT and f.severity is Severity.INFO
    assert "excepted by PolicyException research-betas until 2026-12-31" in f.message
    assert r.denied == [] and r.warnings == []


def test_expiry_day_still_applies_and_the_day_after_does_not() -> None:
    on_day = run(BETA_CLAIM, policies=exception("2026-11-30"), ctx=Context(today=TODAY))
    assert [f.mode for f in on_day.findings] == [Mode.AUDIT]
    after = run(BETA_CLAIM, policies=exception("2026-11-29"), ctx=Context(today=TODAY))
    assert sorted((f.rule, f.mode.value) for f in after.findings) == [
        ("exception/expired", "audit"),
        ("structure/deprecated-version", "warn"),
    ]
    expired = next(f for f in after.findings if f.rule == "exception/expired")
    assert expired.file == "policy.yaml" and expired.line == 2 and "would have covered" in expired.message


def test_expired_exception_in_admission_is_reported_only_when_relevant() -> None:
    clean = BETA_CLAIM.replace("v1beta1", "v1").replace(
        "[{name: gpu, deviceClassName: gpu.nvidia.com-h100}]", "[{name: gpu, exactly: {deviceClassName: x}}]"
    )
    r = run(clean, policies=exception("2020-01-01"), ctx=Context(today=TODAY, admission=True))
    assert r.findings == []
    r = run(clean, policies=exception("2020-01-01"), ctx=Context(today=TODAY))
    assert rules(r) == ["exception/expired"]


def test_exception_scope_namespace_object_and_rule() -> None:
    other_ns = BETA_CLAIM.replace("research", "prod")
    assert [
        f.mode for f in run(other_ns, policies=exception("2030-01-01"), ctx=Context(today=TODAY)).findings
    ] == [Mode.WARN]
    wrong_rule = exception("2030-01-01", rules='["tier/*"]')
    assert [f.mode for f in run(BETA_CLAIM, policies=wrong_rule, ctx=Context(today=TODAY)).findings] == [
        Mode.WARN
    ]
    by_object = exception("2030-01-01", extra="  objects: [{kind: ResourceClaim, name: 'old-*'}]")
    assert [f.mode for f in run(BETA_CLAIM, policies=by_object, ctx=Context(today=TODAY)).findings] == [
        Mode.AUDIT
    ]
    other_obj = exception("2030-01-01", extra="  objects: [{kind: Pod}]")
    assert [f.mode for f in run(BETA_CLAIM, policies=other_obj, ctx=Context(today=TODAY)).findings] == [
        Mode.WARN
    ]


def test_a_failing_rule_becomes_an_internal_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(item: SourceObject, rc: RuleContext) -> Iterable[Finding]:
        if item.obj.get("kind") == "ResourceClaim":
            raise KeyError("devices")
        return ()

    real = ev.modules

    def fake(names: tuple[str, ...] | None = None) -> tuple[RuleModule, ...]:
        return (*real(("structure",)), RuleModule("broken", (FunctionRule("broken/x", boom),)))

    monkeypatch.setattr(ev, "modules", fake)
    r = ev.evaluate(objs(BETA_CLAIM), load_policies(POLICIES), Inventory.empty(), Context())
    internal = [f for f in r.findings if f.rule == "internal/broken"]
    (f,) = internal
    assert f.mode is Mode.ENFORCE and f.severity is Severity.ERROR
    assert (
        "broken/x" in f.message
        and "KeyError" in f.message
        and str(f.object) == "ResourceClaim/research/old-claim"
    )
    # The other rules still ran on the same object.
    assert "structure/deprecated-version" in rules(r)


def test_unknown_kinds_are_counted_as_ignored() -> None:
    r = run("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\n" + BETA_CLAIM)
    assert r.objects == 2 and r.ignored == 1


def test_policy_text_parses_for_the_helpers() -> None:
    assert len(parse_policy_text(exception("2030-01-01")).exceptions) == 1
