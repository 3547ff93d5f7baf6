"""Selectors the API server accepts but draguard's CEL runtime cannot check: `cel/unsupported`, not denied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cel.cel_devices import gpu
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

# Kubernetes libraries and extensions that draguard now evaluates itself (each was cel/unsupported).
KUBERNETES_LIBRARIES = [
    f"{NV}.all(k, v, k != '')",
    f"{NV}.exists(name, value, name == 'productName' && value == 'NVIDIA A100 80GB PCIe')",
    "[1, 2].existsOne(i, v, v == 2)",
    "[1, 2].transformList(i, v, v * 2).size() == 2",
    "[1, 2].transformList(i, v, i > 0, v * 2) == [4]",
    "device.attributes.all(d, device.attributes[d].all(k, v, k != ''))",
    "isIP('10.0.0.1') && !isIP('10.0.0.300')",
    "cidr('10.0.0.0/8').containsIP(ip('10.0.0.1')) && cidr('10.0.0.0/8').containsIP('10.1.2.3')",
    "ip('fe80::1').isLinkLocalUnicast() && ip('10.0.0.1').isGlobalUnicast() && ip('::1').family() == 6",
    "cidr('10.1.2.3/8').masked() == cidr('10.0.0.0/8') && cidr('10.0.0.0/8').prefixLength() == 8",
    "url('https://example.com:8443/x?a=b').getHost() == 'example.com:8443'",
    "url('https://example.com/?b=c&b=d').getQuery()['b'] == ['c', 'd'] && !isURL('not a url')",
    f"{NV}.productName.find('A[0-9]+') == 'A100'",
    f"{NV}.productName.findAll('[0-9]+').size() == 2",
    "![3, 1].isSorted() && [1, 2].sum() == 3 && [4, 2].min() == 2 && [1.5, 2.5].max() == 2.5",
    "[1, 2].indexOf(2) == 1 && [1, 2, 1].lastIndexOf(1) == 2",
    "sets.contains([1, 2], [1]) && sets.intersects([1], [1, 3]) && sets.equivalent([1, 2], [2, 1])",
    "lists.range(3) == [0, 1, 2] && [3, 1, 2].sort() == [1, 2, 3]",
    "[[1], [2]].flatten().size() == 2",
    "sign(quantity('-1')) == -1",
]


@pytest.mark.parametrize("expression", KUBERNETES_LIBRARIES)
def test_kubernetes_libraries_evaluate(expression: str) -> None:
    result = compile_or_issue(GUARD + expression)
    assert not isinstance(result, CelIssue), result
    assert result.evaluate(gpu("node-a", 1)) is True
    assert lint_selector(GUARD + expression) == []


@pytest.mark.parametrize(
    ("expression", "feature"),
    [
        ("{'a': 1}.transformMap(k, v, v + 1)['a'] == 2", "transformMap"),
        ("{'a': 1}.transformMapEntry(k, v, {v: k}).size() == 1", "transformMap"),
        # A 41-term chain that reads the device cannot be folded into pieces the runtime takes.
        (" + ".join(["size(device.driver)"] + ["1"] * 40) + " > 0", "more than 32 levels of nesting"),
    ],
)
def test_what_the_runtime_cannot_evaluate_is_a_warning_not_an_error(expression: str, feature: str) -> None:
    result = compile_or_issue(GUARD + expression)
    assert isinstance(result, CelIssue)
    assert result.check == "cel/unsupported"
    assert result.severity is Severity.WARNING
    assert result.message.startswith("draguard cannot evaluate this selector (uses ")
    assert feature in result.message
    assert "it is checked by the API server only" in result.message
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


def test_runtime_nesting_limit_is_unsupported_but_parser_limit_is_a_rejection() -> None:
    # Redundant parentheses collapse below the runtime's 32 levels.
    assert not isinstance(compile_or_issue("(" * 33 + "true" + ")" * 33), CelIssue)
    # Deep constant parts are evaluated piece by piece (webhook/cel/fold.py).
    nested = compile_or_issue("[" * 33 + "true" + "][0]" * 33)
    assert not isinstance(nested, CelIssue) and nested.evaluate(gpu("node-a", 1)) is True
    chain = compile_or_issue(" + ".join(["1"] * 40) + " == 40")
    assert not isinstance(chain, CelIssue) and chain.evaluate(gpu("node-a", 1)) is True
    # A deep part that reads the device and is evaluated in any case is bound in pieces
    # (fold.hoist_deep): Kubernetes' answer, from the oracle.
    chain = " + ".join(["size(device.driver)"] + ["1"] * 40)
    reading = compile_or_issue(chain + " > 0")
    assert not isinstance(reading, CelIssue) and reading.evaluate(gpu("node-a", 1)) is True
    # Behind `||` it may not be evaluated at all, so binding it ahead could raise an error the
    # original absorbs: it stays beyond draguard's runtime.
    guarded = compile_or_issue(f"device.driver == 'x' || {chain} > 0")
    assert isinstance(guarded, CelIssue) and guarded.check == "cel/unsupported"
    assert "more than 32 levels of nesting" in guarded.message
    # The API server's parser refuses 250 levels (brackets or a chain of operators).
    for deep in ("(" * 250 + "true" + ")" * 250, " + ".join(["1"] * 251) + " > 0"):
        issue = compile_or_issue(deep)
        assert isinstance(issue, CelIssue) and issue.check == "cel/syntax"
        assert issue.severity is Severity.ERROR
    assert not isinstance(compile_or_issue("(" * 249 + "true" + ")" * 249), CelIssue)
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
    expr = GUARD + "{'a': 1}.transformMap(k, v, v + 1)['a'] == 2"
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
    obj = SourceObject(_class(GUARD + "{'a': 1}.transformMap(k, v, v + 1)['a'] == 2"))
    pol = CelLintPolicy(name="strict", mode=Mode.ENFORCE)
    found = _findings(obj, pol)
    assert [(f.rule, f.mode) for f in found] == [("cel/unsupported", Mode.WARN)]
    explicit = CelLintPolicy(name="strict", mode=Mode.ENFORCE,
                             checks={"cel/unsupported": CelCheckSetting(mode=Mode.ENFORCE)})
    found = _findings(obj, explicit)
    assert [(f.rule, f.mode) for f in found] == [("cel/unsupported", Mode.ENFORCE)]
