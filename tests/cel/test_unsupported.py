"""Selectors the API server accepts but draguard's CEL runtime cannot check: `cel/unsupported`, not denied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.cel.env import compile_or_issue
from webhook.cel.issues import CHECKS, CelIssue
from webhook.cel.lint import lint_selector
from webhook.cel.unsupported import KUBERNETES_FUNCTIONS, max_depth
from webhook.core.findings import Finding, Mode, Severity
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import load_policies
from webhook.policy.model import CelCheckSetting, CelLintPolicy, PolicySet

ROOT = Path(__file__).parents[2]
NV = "device.attributes['gpu.nvidia.com']"
GUARD = "device.driver == 'gpu.nvidia.com' && "

KUBERNETES_ONLY = [
    (f"{NV}.all(k, v, k != '')", "two-variable comprehensions (all)", "1.32"),
    (f"{NV}.exists(name, value, name == 'productName' && value == 'x')",
     "two-variable comprehensions (exists)", "1.32"),
    ("[1, 2].existsOne(i, v, v == 2)", "two-variable comprehensions (existsOne)", "1.32"),
    ("[1, 2].transformList(i, v, v * 2).size() == 2", "(transformList)", "1.32"),
    ("[1, 2].transformList(i, v, i > 0, v * 2).size() == 1", "(transformList)", "1.32"),
    ("{'a': 1}.transformMap(k, v, v + 1)['a'] == 2", "(transformMap)", "1.32"),
    ("{'a': 1}.transformMapEntry(k, v, {v: k}).size() == 1", "(transformMapEntry)", "1.32"),
    ("device.attributes.all(d, device.attributes[d].all(k, v, k != ''))", "(all)", "1.32"),
    ("isIP('10.0.0.1')", "IP/CIDR", "1.30"),
    ("cidr('10.0.0.0/8').containsIP(ip('10.0.0.1'))", "IP/CIDR", "1.30"),
    ("url('https://example.com/x').getHost() == 'example.com'", "URL", "1.31"),
    (f"{NV}.productName.find('A[0-9]+') == 'A100'", "regex library (find)", "1.31"),
    (f"{NV}.productName.findAll('[0-9]+').size() > 0", "regex library (findAll)", "1.31"),
    ("[3, 1].isSorted()", "lists library", "1.31"),
    ("[1, 2].sum() == 3", "lists library", "1.31"),
    ("[1, 2].indexOf(2) == 1", "indexOf/lastIndexOf", "1.31"),
    ("sets.contains([1, 2], [1])", "sets extension", "1.29"),
    ("lists.range(3).size() == 3", "lists extension", "1.34"),
    ("[[1], [2]].flatten().size() == 2", "lists extension", "1.34"),
]


@pytest.mark.parametrize(("expression", "feature", "version"), KUBERNETES_ONLY)
def test_kubernetes_only_features_are_a_warning_not_an_error(
    expression: str, feature: str, version: str
) -> None:
    result = compile_or_issue(GUARD + expression)
    assert isinstance(result, CelIssue)
    assert result.check == "cel/unsupported"
    assert result.severity is Severity.WARNING
    assert result.message.startswith("draguard cannot evaluate this selector (uses ")
    assert feature in result.message
    tail = f"which Kubernetes supports from {version}); it is checked by the API server only"
    assert tail in result.message
    assert lint_selector(GUARD + expression) == [result]


@pytest.mark.parametrize(
    ("expression", "check"),
    [
        ("foo == 1", "cel/type"),  # undeclared identifier that is no Kubernetes function
        ("isFoo('x')", "cel/type"),
        ("device.driver.startsWith(1)", "cel/type"),  # wrong argument type
        ("math.greatest(1, 2) == 2", "cel/type"),  # cel-go ext.Math is not in the Kubernetes environment
        ("base64.encode(b'a') == 'YQ=='", "cel/type"),
        ("device.driver ==", "cel/syntax"),
        ("device.driver == 'x' &&& true", "cel/syntax"),
        # A two-variable macro does not excuse a genuine error next to it.
        (f"{NV}.all(k, v, foo == 1)", "cel/type"),
        ("nothere.all(k, v, true)", "cel/type"),
        (f"isIP('1.2.3.4') && {NV}.x.startsWith(1)", "cel/type"),
        (f"{NV}.all(k, v, k == ", "cel/syntax"),
        ("device.capacity['gpu.nvidia.com'].memory > 4", "cel/type"),  # analysed after compiling
    ],
)
def test_genuine_errors_keep_their_ids(expression: str, check: str) -> None:
    result = compile_or_issue(expression)
    assert isinstance(result, CelIssue), expression
    assert result.check == check, result
    assert result.severity is Severity.ERROR


def test_runtime_nesting_limit_is_unsupported_but_parser_limit_stays_a_limit() -> None:
    nested = compile_or_issue("(" * 33 + "true" + ")" * 33)
    assert isinstance(nested, CelIssue) and nested.check == "cel/unsupported"
    assert "more than 32 levels of nesting" in nested.message
    chain = compile_or_issue(" + ".join(["1"] * 40) + " > 0")
    assert isinstance(chain, CelIssue) and chain.check == "cel/unsupported"
    # cel-go's parser refuses more than 250 levels: the API server rejects that too.
    deep = compile_or_issue("(" * 300 + "true" + ")" * 300)
    assert isinstance(deep, CelIssue) and deep.check == "cel/limits" and deep.severity is Severity.ERROR
    assert max_depth("'((((' == ('(' + \"[\")") == 1


def test_the_list_names_kubernetes_functions_only() -> None:
    assert "cel/unsupported" in CHECKS
    # draguard declares these itself; they must compile, not be reported as missing.
    for declared in ("quantity", "semver", "isQuantity", "compareTo", "matches", "format"):
        assert declared not in KUBERNETES_FUNCTIONS
    assert not isinstance(compile_or_issue("'%s'.format(['a']) == 'a'"), CelIssue)


def _class(expr: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "nv-any"},
        "spec": {"selectors": [{"cel": {"expression": expr}}]},
    }


def _claim(expr: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "nv-any", "selectors": [{"cel": {"expression": expr}}]}}]}},
    }


def test_shipped_policy_warns_and_does_not_deny() -> None:
    policies = load_policies(ROOT / "policies")
    inventory_docs = [
        d for d in yaml.safe_load_all((ROOT / "tests/rules/fixtures/inventory.yaml").read_text()) if d
    ]
    expr = GUARD + f"{NV}.exists(k, v, k == 'productName' && v.startsWith('NVIDIA'))"
    objs = [SourceObject(_class(expr)), SourceObject(_claim(expr))]
    report = evaluate(objs, policies, Inventory.from_objects(inventory_docs), Context())
    cel = [f for f in report.findings if f.rule.startswith("cel/")]
    assert [f.rule for f in cel] == ["cel/unsupported", "cel/unsupported"]
    assert all(f.mode is Mode.WARN for f in cel)
    assert not [f for f in report.findings if f.mode is Mode.ENFORCE], report.findings
    # A genuine type error in the same shape is still denied by the shipped policy.
    bad = evaluate([SourceObject(_class(GUARD + "nothere.exists(k, v, true)"))], policies, Inventory.empty())
    assert [(f.rule, f.mode) for f in bad.findings] == [("cel/type", Mode.ENFORCE)]


def _findings(obj: SourceObject, pol: CelLintPolicy) -> list[Finding]:
    return evaluate([obj], PolicySet(cel_lint=(pol,)), Inventory.empty(), rule_modules=("cel_lint",)).findings


def test_unsupported_defaults_to_warn_under_an_enforcing_policy_unless_set() -> None:
    obj = SourceObject(_class(GUARD + "isIP('10.0.0.1')"))
    pol = CelLintPolicy(name="strict", mode=Mode.ENFORCE)
    found = _findings(obj, pol)
    assert [(f.rule, f.mode) for f in found] == [("cel/unsupported", Mode.WARN)]
    explicit = CelLintPolicy(name="strict", mode=Mode.ENFORCE,
                             checks={"cel/unsupported": CelCheckSetting(mode=Mode.ENFORCE)})
    found = _findings(obj, explicit)
    assert [(f.rule, f.mode) for f in found] == [("cel/unsupported", Mode.ENFORCE)]
