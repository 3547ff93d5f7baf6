"""Policy documents: schema validation with file/line/field errors, and the shipped set."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from engine_helpers import POLICIES

from webhook.core.findings import Mode
from webhook.policy.load import PolicyError, load_policies, parse_policy_text, policy_schema
from webhook.policy.model import CEL_CHECKS, MigrationMode, MigrationStrategy

HEAD = "apiVersion: policy.draguard.io/v1alpha1\n"


def test_shipped_policies_load_and_say_llm_means_h100() -> None:
    ps = load_policies(POLICIES)
    (tier,) = ps.tier
    llm = next(c for c in tier.classes if c.name == "llm")
    assert llm.allows("gpu.nvidia.com-h100") and not llm.allows("gpu.nvidia.com-a100")
    assert tier.mode is Mode.ENFORCE
    (mig,) = ps.migration
    assert mig.default_mode is MigrationMode.WARN and mig.strategy is MigrationStrategy.CLAIM_TEMPLATE
    assert mig.mode_for("team-a", {"draguard.io/migration-mode": "migrate"}) is MigrationMode.MIGRATE
    assert mig.mode_for("team-a", {"draguard.io/migrate": "true"}) is MigrationMode.MIGRATE
    assert mig.mode_for("team-a", {}) is MigrationMode.WARN
    assert mig.mapping_for("nvidia.com/gpu", {"gpu-type": "h100"}).device_class == "gpu.nvidia.com-h100"  # type: ignore[union-attr]
    assert mig.mapping_for("nvidia.com/gpu", {}).device_class == "gpu.nvidia.com-a100"  # type: ignore[union-attr]
    (cel,) = ps.cel_lint
    assert all(cel.setting(c) is not None for c in CEL_CHECKS)
    assert cel.setting("cel/syntax").mode is Mode.ENFORCE  # type: ignore[union-attr]
    (quota,) = ps.quota
    # Namespace budgets, team budgets, and the default budget for every other namespace.
    assert {b.scope for b in quota.budgets} == {"namespace", "team", "default"}


def test_schema_error_names_file_line_and_field() -> None:
    text = (
        HEAD
        + """kind: GpuTierPolicy
metadata: {name: t}
spec:
  classes:
  - name: llm
    match: {images: ["*vllm*"]}
    deviceClasses: []
"""
    )
    with pytest.raises(PolicyError) as e:
        parse_policy_text(text, "policies/tier.yaml")
    assert e.value.file == "policies/tier.yaml" and e.value.line == 8
    assert e.value.field_path == "spec.classes[0].deviceClasses"
    assert str(e.value).startswith("policies/tier.yaml:8: spec.classes[0].deviceClasses: ")


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (
            "kind: GpuTierPolicy\nmetadata: {name: t}\nspec: {mode: deny, classes: []}\n",
            "spec.mode",
            "one of",
        ),
        ("kind: Nope\nmetadata: {name: t}\nspec: {}\n", "kind", "one of"),
        ("kind: MigrationPolicy\nmetadata: {name: m}\nspec: {mapings: []}\n", "spec", "mapings"),
        ("kind: PolicyException\nmetadata: {name: e}\nspec: {expires: 2026-13-45}\n", "spec.expires", ""),
        (
            "kind: GpuQuotaPolicy\nmetadata: {name: q}\n"
            "spec: {budgets: [{namespace: a, team: b, claims: 1}]}\n",
            "spec.budgets[0]",
            "exactly one",
        ),
        ("kind: CelLintPolicy\nmetadata: {name: c}\nspec: {checks: {cel/bogus: {}}}\n", "spec.checks", ""),
    ],
)
def test_schema_errors(body: str, field: str, words: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy_text(HEAD + body, "p.yaml")
    assert e.value.field_path == field
    assert words in str(e.value)
    assert e.value.line is not None


def test_yaml_syntax_error_has_a_line() -> None:
    with pytest.raises(PolicyError, match=r"^p.yaml:\d+: invalid YAML"):
        parse_policy_text(HEAD + "kind: GpuTierPolicy\nmetadata: [\n", "p.yaml")


def test_duplicate_names_are_rejected(tmp_path: Path) -> None:
    doc = HEAD + "kind: PolicyException\nmetadata: {name: e}\nspec: {expires: 2030-01-01}\n"
    (tmp_path / "a.yaml").write_text(doc)
    (tmp_path / "b.yaml").write_text(doc)
    with pytest.raises(PolicyError, match="defined twice"):
        load_policies(tmp_path)


def test_missing_path_and_non_mapping_document(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="no such file"):
        load_policies(tmp_path / "nope")
    with pytest.raises(PolicyError, match="must be a mapping"):
        parse_policy_text("- a\n- b\n", "p.yaml")


def test_exception_document() -> None:
    ps = parse_policy_text(
        HEAD
        + """kind: PolicyException
metadata: {name: legacy-ok}
spec:
  expires: 2026-12-31
  reason: migration window
  rules: ["migrate/*"]
  namespaces: [research]
  objects: [{kind: Pod, name: "old-*"}]
""",
        "e.yaml",
    )
    (e,) = ps.exceptions
    assert e.expires == dt.date(2026, 12, 31) and e.rules == ("migrate/*",)
    assert e.line == 1 and e.source == "e.yaml"


def test_schema_is_draft_2020_12_and_covers_every_kind() -> None:
    s = policy_schema()
    assert s["$schema"].endswith("2020-12/schema")
    assert set(s["$defs"]) >= {
        "GpuTierPolicy",
        "GpuQuotaPolicy",
        "CelLintPolicy",
        "MigrationPolicy",
        "PolicyException",
    }
