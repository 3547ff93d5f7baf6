"""Past the native runtime's limits: deep constants folded, constant comprehensions unrolled, and
literals that mean something else in Kubernetes (webhook/cel/fold.py). Every verdict expected here
is Kubernetes v1.37.2's (checked with tools/celoracle); where draguard cannot be exact it expects
an unknown (`cel/unsupported`, `undecided`), never a different verdict."""

from __future__ import annotations

import pytest
from cel_devices import gpu

from webhook.cel import fold
from webhook.cel.env import CelEvalError, clear_cache, compile_or_issue
from webhook.cel.issues import CelIssue

GPU = gpu("node-a", 0)
R10 = str(list(range(1, 11)))
R100 = str(list(range(100)))
GUARD = "device.driver == 'gpu.nvidia.com' && "


def verdict(expression: str) -> str:
    """What a user sees: the check that rejects or warns, or selects / no / error."""
    result = compile_or_issue(expression)
    if isinstance(result, CelIssue):
        return result.check
    try:
        return "selects" if result.evaluate(GPU) else "no"
    except CelEvalError as exc:
        return "undecided" if exc.limit else "error"


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    clear_cache()


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("[" * 60 + "true" + "][0]" * 60, "selects"),
        ("[" * 60 + "false" + "][0]" * 60, "no"),
        (" + ".join(["1"] * 45) + " == 45", "selects"),
        (" + ".join(["1"] * 45) + " == 44", "no"),
        (GUARD + "(" + " + ".join(["'a'"] * 40) + ").size() == 40", "selects"),
        # A deep piece that fails is not folded; bound in pieces (fold.hoist_deep) it fails when
        # evaluated, as in the scheduler (Kubernetes accepts it and selects nothing).
        ("[" * 40 + "[1][5] == 1" + "][0]" * 40, "error"),
        # A piece the API server refuses (a mixed list literal) is refused however deep it stands.
        ("[" * 40 + "[1, 'a'][0] == 1" + "][0]" * 40, "cel/type"),
    ],
)
def test_deep_constants_are_folded(expression: str, expected: str) -> None:
    assert verdict(expression) == expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f"{R10}.all(x3, {R10}.all(x2, {R10}.all(x1, {R10}.all(x0, x0 + x1 + x2 + x3 >= 4))))", "selects"),
        (f"{R10}.all(x3, {R10}.all(x2, {R10}.all(x1, {R10}.all(x0, x0 + x1 + x2 + x3 > 4))))", "no"),
        (GUARD + f"{R100}.exists(x, {R100}.exists(y, x + y == 198))", "selects"),
        (GUARD + f"{R100}.exists(x, {R100}.exists(y, x + y == 199))", "no"),
        (f"{R100}.exists_one(x, {R100}.exists(y, x * y == 9801))", "selects"),
        # all() over elements that fail (division by zero at y == 50) and none false is an error in
        # cel-go; an error has no literal to splice back, so the verdict stays unknown.
        (f"{R100}.all(x, {R100}.all(y, x / (y - 50) >= -100))", "undecided"),
        # ...but one false element absorbs the errors, as in cel-go.
        (f"{R100}.all(x, {R100}.all(y, x / (y - 50) >= 0))", "no"),
    ],
)
def test_constant_comprehensions_past_the_iteration_budget(expression: str, expected: str) -> None:
    assert verdict(expression) == expected


def test_unrolling_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # A tenant's selector cannot make draguard evaluate without bound: past MAX_PIECES the runtime's
    # own answer (it gave up) stands, reported as unknown.
    monkeypatch.setattr(fold, "MAX_PIECES", 5)
    assert verdict(f"{R100}.exists(x, {R100}.exists(y, x + y == 199))") == "undecided"


def test_cost_is_exact_where_the_model_is_cel_gos() -> None:
    # Kubernetes estimates 1,005,801 for 46 elements (rejected) and 881,551 for 44 (accepted).
    r46, r44 = str(list(range(46))), str(list(range(44)))
    assert verdict(f"{r46}.exists(x, {r46}.exists(y, {r46}.exists(z, x + y + z == -1)))") == "cel/limits"
    assert verdict(f"{r44}.exists(x, {r44}.exists(y, {r44}.exists(z, x + y + z == -1)))") == "no"


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("quantity('1Ti').isInteger()", "selects"),
        ("quantity('10Ti').isInteger()", "selects"),
        ("quantity('1k').isInteger()", "selects"),
        # apimachinery holds these as decimals (no int64 fast path), so AsInt64 refuses them.
        ("quantity('100Ti').isInteger()", "no"),
        ("quantity('1Pi').isInteger()", "no"),
        ("quantity('1.5Gi').isInteger()", "no"),
        ("quantity('1000m').isInteger()", "no"),
        ("quantity('1Ei').asInteger() > 0", "error"),
        ("quantity('1Ei') == quantity('1024Pi')", "selects"),
        ("{'a': 1, 'a': 2}.size() == 1 && {'a': 1, 'a': 2}['a'] == 2", "selects"),
        ("{'a': 1, 'b': 3, 'a': 2}['a'] == 1", "no"),
        # cel-go prints %e through golang.org/x/text; draguard says it cannot tell.
        ("'%e'.format([1234.5]) == '1.234500e+03'", "cel/unsupported"),
    ],
)
def test_literals_as_kubernetes_reads_them(expression: str, expected: str) -> None:
    assert verdict(expression) == expected


def test_held_as_decimal_error_says_why() -> None:
    result = compile_or_issue("quantity('1Pi').asInteger() > 0")
    assert not isinstance(result, CelIssue)
    with pytest.raises(CelEvalError, match="held as a decimal by Kubernetes"):
        result.evaluate(GPU)


@pytest.mark.parametrize(
    ("text", "form"),
    [("0", 0), ("1Ti", 2**40), ("10Ti", 10 * 2**40), ("100Ti", None), ("1Pi", None), ("1.5Gi", None),
     ("1000m", None), ("1k", 1000), ("1E", 10**18), ("10E", None), ("1.5k", 1500), ("-2Gi", -(2**31)),
     ("0.5", None), ("1e3", 1000), ("1234567890123456789", None)],
)
def test_int64_form_follows_parse_quantity(text: str, form: int | None) -> None:
    from webhook.cel.library import int64_form

    assert int64_form(text) == (True, form)


def test_unrolling_at_admission_spends_the_request_budget() -> None:
    from webhook.cel.env import compile_budget

    heavy = f"{R100}.exists(x, {R100}.exists(y, x + y == 199))"
    with compile_budget(evaluations=5) as budget:
        assert verdict(heavy) == "undecided"  # the unroll ran out of the request's evaluations
        assert budget.refused >= 1 and budget.evaluations <= 0
    # The cut-short compile was not cached: with the budget for it, the answer is Kubernetes'.
    assert verdict(heavy) == "no"
    with compile_budget() as budget:
        clear_cache()
        assert verdict(heavy) == "no"
        assert budget.evaluations < 5000 - 100  # one per element of the outer list, at least


def test_folding_at_admission_spends_the_request_budget() -> None:
    from webhook.cel.env import compile_budget

    deep = " + ".join(["1"] * 200) + " == 200"
    with compile_budget(evaluations=2) as budget:
        assert verdict(deep) in ("cel/unsupported", "undecided")  # draguard cannot tell
        assert budget.refused >= 1
    assert verdict(deep) == "selects"
