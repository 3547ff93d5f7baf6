"""The selector environment: library functions, Kubernetes lookup semantics, errors and limits."""

from __future__ import annotations

import pytest
from cel_devices import A100, H100, gpu, mig

from webhook.cel.env import (
    MAX_EXPRESSION_LENGTH,
    CelCompileError,
    CelEvalError,
    compile_or_issue,
    compile_selector,
)
from webhook.cel.issues import CelIssue

H100_GPU = gpu("node-b", 0, H100, memory="81559Mi", driver_version="570.86.10")
MIG = mig("node-a", 0, 0)


def run(expression: str, device=H100_GPU) -> object:  # type: ignore[no-untyped-def]
    """Evaluate a bool selector, or the value of `x` via `x == x` tricks where needed."""
    return compile_selector(expression).evaluate(device)


@pytest.mark.parametrize(
    "expression",
    [
        # quantity() / isQuantity()
        "quantity('80Gi') == quantity('81920Mi')",
        "quantity('1G') != quantity('1Gi')",
        "isQuantity('500m')",
        "!isQuantity('5 Gi')",
        # Quantity members
        "quantity('80Gi').compareTo(quantity('40Gi')) == 1",
        "quantity('40Gi').compareTo(quantity('80Gi')) == -1",
        "quantity('1k').compareTo(quantity('1000')) == 0",
        "quantity('2').isGreaterThan(quantity('1500m'))",
        "quantity('1500m').isLessThan(quantity('2'))",
        "!quantity('2').isLessThan(quantity('2'))",
        "quantity('1.5Gi').add(quantity('512Mi')) == quantity('2Gi')",
        "quantity('1').add(2) == quantity('3')",
        "quantity('1Gi').sub(quantity('1023Mi')) == quantity('1Mi')",
        "sign(quantity('5').sub(7)) == -1",
        "quantity('1Ki').asInteger() == 1024",
        "quantity('1Ki').isInteger()",
        "!quantity('1500m').isInteger()",
        "quantity('250m').asApproximateFloat() == 0.25",
        "sign(quantity('0')) == 0 && sign(quantity('3m')) == 1",
        "quantity('1e999').asApproximateFloat() > 1.0e308 && sign(quantity('-1e999')) == -1",
        # semver() / isSemver()
        "semver('1.2.3') == semver('1.2.3+build.7')",
        "isSemver('1.0.0-rc.1')",
        "!isSemver('01.0.0') && !isSemver('1.0')",
        "semver('v1.2', true) == semver('1.2.0')",
        "isSemver('535.104.05', true) && !isSemver('535.104.05', false)",
        # Semver members
        "semver('1.10.0').compareTo(semver('1.9.0')) == 1",
        "semver('1.0.0-alpha').isLessThan(semver('1.0.0'))",
        "semver('2.0.0').isGreaterThan(semver('1.99.99'))",
        "semver('12.4.1').major() == 12 && semver('12.4.1').minor() == 4 && semver('12.4.1').patch() == 1",
        # Device values are typed as Kubernetes types them.
        "device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('550.0.0'))",
        "device.attributes['gpu.nvidia.com'].driverVersion.major() == 570",
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability == semver('9.0.0')",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
        "device.capacity['gpu.nvidia.com'].memory == quantity('81559Mi')",
        "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('79Gi'))",
        # cel.bind, strings extension, has(), `in`
        "cel.bind(nv, device.attributes['gpu.nvidia.com'], "
        "nv.productName == '" + H100 + "' && nv.type == 'gpu')",
        "device.attributes['gpu.nvidia.com'].productName.lowerAscii().contains('h100')",
        "device.attributes['gpu.nvidia.com'].productName.split(' ').size() == 4",
        "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA') && "
        "device.attributes['gpu.nvidia.com'].productName.endsWith('HBM3')",
        "device.attributes['gpu.nvidia.com'].productName.matches('^NVIDIA H1[0-9]{2}')",
        "device.attributes['gpu.nvidia.com'].productName.replace('NVIDIA ', '') == 'H100 80GB HBM3'",
        "has(device.attributes['gpu.nvidia.com'].productName)",
        "!has(device.attributes['gpu.nvidia.com'].profile)",
        "'productName' in device.attributes['gpu.nvidia.com']",
        "device.attributes['resource.kubernetes.io'].pciBusID.startsWith('0000:')",
        "device.driver == 'gpu.nvidia.com'",
        # Strings extension at the version Kubernetes uses (v2).
        "'a,b'.split(',').size() == 2 && '%s-%d'.format(['x', 1]) == 'x-1'",
        "strings.quote('a') == '\"a\"' && ' a '.trim() == 'a' && 'abc'.substring(1) == 'bc'",
        "'abc'.charAt(1) == 'b' && 'abcb'.lastIndexOf('b') == 3 && 'abc'.indexOf('c') == 2",
        # Optional types.
        "device.attributes['gpu.nvidia.com'].?profile.orValue('none') == 'none'",
    ],
)
def test_library_functions(expression: str) -> None:
    assert run(expression) is True


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("sign(quantity('5 Gi')) == 1", "invalid quantity '5 Gi'"),
        ("semver('1.0').major() == 1", "invalid semver '1.0'"),
        ("quantity('1.5').asInteger() == 1", "cannot convert value to integer"),
        ("quantity('1e999').asInteger() > 0", r"cannot convert value to integer: 10000000000000000000\.\.\."),
        ("semver('99999999999999999999.0.0').major() > 0", "exceeds the int64 range"),
        ("quantity('1').compareTo(semver('1.0.0')) == 0", "no such overload"),
        ("sign(semver('1.0.0')) == 1", "no such overload: sign applied to Semver"),
        ("quantity('1').major() == 1", "no such overload: major applied to Quantity"),
        ("semver(device.attributes['gpu.nvidia.com'].driverVersion).major() > 1", "no such overload"),
    ],
)
def test_library_errors(expression: str, message: str) -> None:
    with pytest.raises(CelEvalError, match=message):
        run(expression)


def test_strings_extension_is_version_2_like_kubernetes() -> None:
    # `reverse()` on strings arrived in strings v3, which the API server's environment does not
    # include (the lists extension's `reverse()` is for lists).
    issue = compile_or_issue("'abc'.reverse() == 'cba'")
    assert isinstance(issue, CelIssue) and issue.check == "cel/type"
    assert run("[1, 2].reverse() == [2, 1]") is True


def test_join_over_split_is_over_the_cost_limit_like_kubernetes() -> None:
    # Kubernetes cannot bound the size of split()'s elements, so its estimate is unbounded.
    issue = compile_or_issue("'a,b'.split(',').join('-') == 'a-b'")
    assert isinstance(issue, CelIssue) and issue.check == "cel/limits"
    assert "unbounded" in issue.message


def test_unknown_domain_is_an_empty_map() -> None:
    assert run("size(device.attributes['other.example.com']) == 0") is True
    assert run("!has(device.attributes['other.example.com'].model)") is True
    assert run("!('model' in device.attributes['other.example.com'])") is True
    assert run("device.capacity['other.example.com'].size() == 0") is True


def test_unknown_attribute_in_known_domain_is_an_evaluation_error() -> None:
    with pytest.raises(CelEvalError) as info:
        run("device.attributes['gpu.nvidia.com'].migProfile == '3g.20gb'")
    assert info.value.message == "no such key: migProfile"
    assert info.value.missing_key == "migProfile"
    # ... and in an unknown domain too: the empty map has no such key.
    with pytest.raises(CelEvalError, match="no such key: model"):
        run("device.attributes['other.example.com'].model == 'x'")


def test_mig_only_attribute_errors_on_full_gpus_unless_guarded() -> None:
    expression = "device.attributes['gpu.nvidia.com'].profile == '3g.20gb'"
    assert run(expression, MIG) is True
    with pytest.raises(CelEvalError, match="no such key: profile"):
        run(expression, H100_GPU)
    guarded = "device.attributes['gpu.nvidia.com'].type == 'mig' && " + expression
    assert run(guarded, H100_GPU) is False
    assert run(guarded, MIG) is True


def test_non_bool_result_is_a_type_error() -> None:
    for expression in ("1 + 1", "'text'", "device.capacity['gpu.nvidia.com'].memory", "device.attributes",
                       "quantity('1')"):
        result = compile_or_issue(expression)
        assert isinstance(result, CelIssue), expression
        assert result.check == "cel/type"
        assert "must evaluate to bool" in result.message
    # Only known at run time: a dyn attribute value.
    with pytest.raises(CelEvalError, match="must evaluate to bool, but the result is string"):
        run("device.attributes['gpu.nvidia.com'].productName")


def test_errors_use_cel_go_format_with_line_and_column() -> None:
    with pytest.raises(CelCompileError) as info:
        compile_selector("device.driver == 'gpu.nvidia.com' && x == 1")
    issue = info.value.issue
    assert issue.check == "cel/type"
    assert issue.message.startswith("ERROR: <input>:1:38: undeclared reference to 'x'")
    assert (issue.line, issue.column) == (1, 38)

    syntax = compile_or_issue("device.driver ==\n  'a' &&")
    assert isinstance(syntax, CelIssue)
    assert syntax.check == "cel/syntax"
    assert syntax.message.startswith("ERROR: <input>:2:")
    assert syntax.line == 2

    unknown_field = compile_or_issue("device.vendor == 'nvidia'")
    assert isinstance(unknown_field, CelIssue)
    assert unknown_field.message == "ERROR: <input>:1:8: undefined field 'vendor'"
    assert (unknown_field.line, unknown_field.column) == (1, 8)


def test_length_limit() -> None:
    base = "device.driver == 'gpu.nvidia.com' || "
    filler = "true"
    at_limit = base + " " * (MAX_EXPRESSION_LENGTH - len(base) - len(filler)) + filler
    assert len(at_limit.encode()) == MAX_EXPRESSION_LENGTH
    assert not isinstance(compile_or_issue(at_limit), CelIssue)
    over = at_limit + " "
    issue = compile_or_issue(over)
    assert isinstance(issue, CelIssue)
    assert issue.check == "cel/limits"
    assert "10241 bytes" in issue.message
    # Bytes, not characters: 3-byte characters count three times.
    wide = "'" + "€" * 3414 + "' != ''"
    assert len(wide) < MAX_EXPRESSION_LENGTH < len(wide.encode())
    wide_issue = compile_or_issue(wide)
    assert isinstance(wide_issue, CelIssue) and wide_issue.check == "cel/limits"


def test_cost_limit() -> None:
    hundred = "[" + ",".join(str(i) for i in range(100)) + "]"
    cheap = f"{hundred}.all(a, {hundred}.all(b, a + b >= 0))"
    assert not isinstance(compile_or_issue(cheap), CelIssue)
    expensive = f"{hundred}.all(a, {hundred}.all(b, {hundred}.all(c, a + b + c >= 0)))"
    issue = compile_or_issue(expensive)
    assert isinstance(issue, CelIssue)
    assert issue.check == "cel/limits"
    assert "estimated cost" in issue.message
    # Sizes travel through cel.bind variables and list concatenation.
    bound = f"cel.bind(l, {hundred}, l.all(a, l.all(b, l.all(c, a + b + c >= 0))))"
    bound_issue = compile_or_issue(bound)
    assert isinstance(bound_issue, CelIssue) and bound_issue.check == "cel/limits"
    doubled = f"({hundred} + {hundred}).all(a, ({hundred} + {hundred}).all(b, {hundred}.all(c, a + b >= c)))"
    doubled_issue = compile_or_issue(doubled)
    assert isinstance(doubled_issue, CelIssue) and doubled_issue.check == "cel/limits"


def test_compiled_once_per_text() -> None:
    text = "device.attributes['gpu.nvidia.com'].productName == '" + A100 + "'"
    assert compile_selector(text) is compile_selector(text)
    assert compile_or_issue("x ==") is compile_or_issue("x ==")


def test_deeply_chained_expression_stays_an_issue_or_compiles() -> None:
    chained = " && ".join(["true"] * 1200)
    assert len(chained) < MAX_EXPRESSION_LENGTH
    result = compile_or_issue(chained)
    if isinstance(result, CelIssue):
        assert result.check in ("cel/limits", "cel/syntax")
    else:
        assert result.evaluate(H100_GPU) is True
    nested = "(" * 2000 + "true" + ")" * 2000
    nested_result = compile_or_issue(nested)
    assert isinstance(nested_result, CelIssue)
    assert nested_result.check == "cel/syntax"
    assert "at most 249" in nested_result.message
    # Redundant parentheses within the API server's depth collapse, so draguard evaluates them.
    assert run("(" * 100 + "true" + ")" * 100) is True
