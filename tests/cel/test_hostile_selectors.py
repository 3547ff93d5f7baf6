"""Selectors written to burn the webhook's CPU stay cheap (a tenant's selector is attacker input)."""

from __future__ import annotations

import time

import pytest

from tests.cel.cel_devices import gpu
from webhook.cel import _native
from webhook.cel.env import clear_cache, compile_or_issue, compile_selector
from webhook.cel.issues import CelIssue


def test_find_with_a_backtracking_pattern_is_linear() -> None:
    # `(a+)+$` takes exponential time in a backtracking engine; find() runs RE2, as Kubernetes does.
    text = "'" + "a" * 5000 + "!'"
    selector = compile_selector(f"{text}.find('(a+)+$') == '' && {text}.findAll('(a|aa)+$').size() == 0")
    start = time.process_time()
    assert selector.evaluate(gpu("node-a", 1)) is True
    assert time.process_time() - start < 1.0


def test_many_literal_conversions_cost_a_bounded_number_of_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each literal conversion is evaluated once at compile time (the API server fails on a bad one
    # there); a selector full of distinct ones must not turn into hundreds of extra compiles.
    expression = " && ".join(f"int('{i}') == {i}" for i in range(400))
    assert len(expression) < 10240
    compiles: list[str] = []
    real = _native.compile_expression

    def counting(text: str) -> _native.NativeExpression:
        compiles.append(text)
        return real(text)

    monkeypatch.setattr(_native, "compile_expression", counting)
    clear_cache()
    result = compile_or_issue(expression)
    assert not isinstance(result, CelIssue), result
    assert 1 < len(compiles) <= 40, len(compiles)
    # A bad conversion among the first ones is still refused.
    clear_cache()
    bad = compile_or_issue("int('x') == 1 && " + expression)
    assert isinstance(bad, CelIssue) and bad.check == "cel/type"
    assert "program instantiation failed" in bad.message


def test_invalid_literal_regex_is_refused_like_the_api_server() -> None:
    for pattern in ("[", "(?=a)", "a{2,1}"):
        issue = compile_or_issue(f"device.driver.matches('{pattern}')")
        assert isinstance(issue, CelIssue) and issue.check == "cel/type", (pattern, issue)
        assert "invalid matches argument" in issue.message
