"""lint_selector: the seed article's DeviceClasses and every check, as a user would read them."""

from __future__ import annotations

import pytest
from cel_devices import A100, DRIVER, inventory
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.cel.issues import CHECKS, CelIssue
from webhook.cel.lint import lint_selector
from webhook.core.findings import Severity

# The three DeviceClasses of the seed article (gpu-deviceclasses.yaml); the third is a folded YAML
# scalar (`>-`), so its lines join with single spaces.
SEED_A100 = (
    "device.driver == 'gpu.nvidia.com' && "
    "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100 80GB PCIe'"
)
SEED_H100 = (
    "device.driver == 'gpu.nvidia.com' && "
    "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
)
GUARD = f"device.driver == '{DRIVER}'"
NV = f"device.attributes['{DRIVER}']"
SEED_MIG = (
    "device.driver == 'gpu.nvidia.com' && "
    "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100 80GB PCIe' && "
    "device.attributes['gpu.nvidia.com'].migProfile == '3g.20gb'"
)


def checks(issues: list[CelIssue]) -> list[str]:
    return [i.check for i in issues]


def only(issues: list[CelIssue], check: str) -> CelIssue:
    found = [i for i in issues if i.check == check]
    assert len(found) == 1, issues
    return found[0]


@pytest.mark.parametrize("expression", [SEED_A100, SEED_H100])
def test_seed_full_gpu_classes_are_clean(expression: str) -> None:
    assert lint_selector(expression) == []
    assert lint_selector(expression, devices=inventory()) == []


def test_seed_mig_class_names_an_attribute_the_driver_does_not_publish() -> None:
    issue = only(lint_selector(SEED_MIG), "cel/unknown-attribute")
    assert issue.severity is Severity.ERROR
    assert "'migProfile'" in issue.message and "did you mean 'profile'" in issue.message
    # Points at the name, after the dot.
    assert issue.line == 1 and issue.column is not None
    assert SEED_MIG[issue.column - 1:].startswith("migProfile")
    # The fix is the corrected expression.
    assert SEED_MIG.replace(".migProfile", ".profile") in issue.fix
    # Against a real inventory it also matches nothing, and the message says what exists.
    issues = lint_selector(SEED_MIG, devices=inventory())
    assert checks(issues) == ["cel/unknown-attribute", "cel/no-match"]
    no_match = issues[1]
    assert "none of the 10 devices" in no_match.message
    assert A100 in no_match.message and "mig 3g.20gb" in no_match.message


def test_seed_mig_class_corrected_is_clean() -> None:
    fixed = SEED_MIG.replace(".migProfile", ".profile")
    # Full GPUs have no `profile`: the scheduler would hit "no such key" on them.
    issues = lint_selector(fixed, devices=inventory())
    issue = only(issues, "cel/unknown-attribute")
    assert "evaluation fails on 3 of 10 devices" in issue.message
    assert "no such key: profile" in issue.message
    assert "has(device.attributes['gpu.nvidia.com'].profile)" in issue.fix
    assert issue.column is not None and fixed[issue.column - 1:].startswith("profile")
    guarded = SEED_MIG.replace(
        "device.attributes['gpu.nvidia.com'].migProfile",
        "device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile",
    )
    assert lint_selector(guarded, devices=inventory()) == []


def test_attribute_vs_capacity_confusion() -> None:
    expression = f"{GUARD} && {NV}.memory.compareTo(quantity('40Gi')) >= 0"
    issue = only(lint_selector(expression), "cel/unknown-attribute")
    assert "'memory' is a capacity" in issue.message
    assert f"device.capacity['{DRIVER}'].memory" in issue.fix


def test_attribute_in_the_wrong_domain() -> None:
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].pciBusID == '0000:3b:00.0'"
    issue = only(lint_selector(expression), "cel/unknown-attribute")
    assert "resource.kubernetes.io" in issue.fix


def test_did_you_mean_for_misspellings() -> None:
    issue = only(lint_selector(f"{GUARD} && {NV}.prodctName == 'x'"),
                 "cel/unknown-attribute")
    assert "did you mean 'productName'" in issue.message
    indexed = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}']['ProductName'] == 'x'"
    issue = only(lint_selector(indexed), "cel/unknown-attribute")
    assert "['productName']" in issue.fix


def test_has_on_an_unknown_attribute_is_a_warning() -> None:
    issue = only(lint_selector(f"{GUARD} && has({NV}.migProfile)"),
                 "cel/unknown-attribute")
    assert issue.severity is Severity.WARNING
    assert "always false" in issue.message


def test_version_attribute_compared_with_a_string() -> None:
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].driverVersion >= '550.54'"
    issues = lint_selector(expression, devices=inventory())
    issue = issues[0]
    assert issue.check == "cel/unknown-attribute"
    assert "is a version (Semver)" in issue.message
    assert f"device.attributes['{DRIVER}'].driverVersion.compareTo(semver('550.54.0')) >= 0" in issue.fix
    eq = only(lint_selector(f"{GUARD} && {NV}.driverVersion == '550.54.15'"),
              "cel/unknown-attribute")
    assert "never equal" in eq.message and "== semver('550.54.15')" in eq.fix


def test_capacity_compared_with_a_literal_is_a_type_error() -> None:
    # Capacities are Quantity-typed in the API server's environment: it rejects this at create time.
    expression = f"device.driver == '{DRIVER}' && device.capacity['{DRIVER}'].memory > 40"
    issue = only(lint_selector(expression), "cel/type")
    column = expression.index(" > ") + 2
    assert issue.message == (
        f"ERROR: <input>:1:{column}: found no matching overload for '_>_' applied to '(Quantity, int)'"
    )
    assert issue.column == column
    assert "compareTo(quantity('40')) > 0" in issue.fix
    eq = only(lint_selector(f"device.capacity['{DRIVER}'].memory == '80Gi'"), "cel/type")
    assert "(Quantity, string)" in eq.message


def test_string_attribute_compared_with_a_number() -> None:
    issue = only(lint_selector(f"{GUARD} && {NV}.productName == 100"),
                 "cel/unknown-attribute")
    assert "never equal" in issue.message


def test_semver_of_a_version_attribute() -> None:
    issue = only(
        lint_selector(f"{GUARD} && semver({NV}.driverVersion).major() > 1"),
        "cel/unknown-attribute",
    )
    assert "already a Semver" in issue.message


def test_driver_guard() -> None:
    issue = only(lint_selector(f"device.attributes['{DRIVER}'].productName == '{A100}'"), "cel/driver-guard")
    assert issue.severity is Severity.WARNING
    assert f"device.driver == '{DRIVER}' && " in issue.fix
    assert lint_selector(f"device.driver in ['{DRIVER}', 'x.example.com'] && "
                         f"device.attributes['{DRIVER}'].productName == '{A100}'") == []


def test_no_match_lists_products() -> None:
    issue = only(
        lint_selector(f"{GUARD} && {NV}.productName == 'NVIDIA B200'",
                      devices=inventory()),
        "cel/no-match",
    )
    assert issue.severity is Severity.ERROR
    assert "NVIDIA H100 80GB HBM3 (gpu) x4" in issue.message


def test_unknown_domain_with_inventory() -> None:
    issues = lint_selector(
        "device.driver == 'acme.example.com' && device.attributes['acme.example.com'].model == 'x'",
        devices=inventory(),
    )
    assert checks(issues) == ["cel/unknown-attribute", "cel/no-match"]
    assert "no device publishes attributes in domain 'acme.example.com'" in issues[0].message


def test_other_drivers_published_attributes_are_known_from_the_inventory() -> None:
    expression = "device.driver == 'fpga.example.com' && device.attributes['fpga.example.com'].model=='u250'"
    assert lint_selector(expression, devices=inventory()) == []
    typo = only(lint_selector(expression.replace(".model", ".modle"), devices=inventory()),
                "cel/unknown-attribute")
    assert "did you mean `model`" in typo.fix


def test_configured_driver_name_uses_the_bundled_schema() -> None:
    expression = (
        "device.driver == 'gpu.example.com' && device.attributes['gpu.example.com'].migProfile == '1g.10gb'"
    )
    issue = only(lint_selector(expression, driver="gpu.example.com"), "cel/unknown-attribute")
    assert "did you mean 'profile'" in issue.message


@pytest.mark.parametrize(
    ("expression", "check"),
    [
        ("device.driver == ", "cel/syntax"),
        ("device.driver = 'x'", "cel/syntax"),
        ("devices.driver == 'x'", "cel/type"),
        ("device.attributes['gpu.nvidia.com'].productName", "cel/driver-guard"),
        ("1 + 2", "cel/type"),
        ("x" * 10241, "cel/limits"),
        ("", "cel/syntax"),
    ],
)
def test_rejected_expressions(expression: str, check: str) -> None:
    assert check in checks(lint_selector(expression))


def test_non_bool_attribute_result_with_inventory() -> None:
    issues = lint_selector(f"device.driver == '{DRIVER}' ? device.attributes['{DRIVER}'].productName : false",
                           devices=inventory())
    issue = only(issues, "cel/type")
    assert "must evaluate to bool" in issue.message


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_random_text_only_ever_yields_issues(text: str) -> None:
    issues = lint_selector(text, devices=inventory())
    assert all(isinstance(i, CelIssue) and i.check in CHECKS for i in issues)


_ATOMS = st.sampled_from([
    "device", "device.driver", "device.attributes", "device.capacity", "['gpu.nvidia.com']", ".productName",
    ".profile", ".memory", ".uuid", "['x']", " == ", " != ", " >= ", " && ", " || ", "!", "(", ")", "'a'",
    "1",
    "true", "quantity('1Gi')", "semver('1.0.0')", ".compareTo(", ".exists(k, ", "k", "has(", "size(", ",",
    "cel.bind(v, ", "v", " in ", "[", "]", "{", "}", ":", ".isGreaterThan(", ".major()", "'3g.20gb'",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(_ATOMS, max_size=14).map("".join))
def test_random_cel_like_text_only_ever_yields_issues(text: str) -> None:
    issues = lint_selector(text, devices=inventory())
    assert all(isinstance(i, CelIssue) and i.check in CHECKS for i in issues)
