"""`review --kubernetes-version`: CEL functions and device fields the target release's API server does
not accept yet are `cel/version` errors (denied with the shipped policies), and the report says
which release it judged for."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.review.conftest import Run
from webhook.cel import versions
from webhook.cel.env import compile_selector
from webhook.cel.lint import lint_selector

ROOT = Path(__file__).resolve().parents[2]
SORTED = "device.driver == 'gpu.nvidia.com' && [3, 1].sort()[0] == 1"
MULTI = "device.driver == 'gpu.nvidia.com' && !device.allowMultipleAllocations"


def _claim(tmp_path: Path, expression: str) -> Path:
    path = tmp_path / "claim.yaml"
    path.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c, namespace: default}\n"
        "spec:\n  devices:\n    requests:\n    - name: gpu\n      exactly:\n"
        "        deviceClassName: gpu.nvidia.com\n"
        f"        selectors:\n        - cel: {{expression: {json.dumps(expression)}}}\n",
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize(
    ("expression", "rejected_on"),
    [
        # cel-go's lists extension entered the Kubernetes environment at compatibility version 1.34,
        # which an API server uses from 1.35 (it compiles new expressions one release back).
        ("[3, 1].sort() == [1, 3]", {"1.34"}),
        ("lists.range(3).size() == 3", {"1.34"}),
        ("[1, 2].sortBy(x, -x)[0] == 2", {"1.34"}),
        ("[[1], [2]].flatten().distinct().reverse().slice(0, 1) == [2]", {"1.34"}),
        # DRAConsumableCapacity: alpha (off) in 1.34 and 1.35, on by default from 1.36.
        ("device.allowMultipleAllocations == false", {"1.34", "1.35"}),
        ("has(device.allowMultipleAllocations)", {"1.34", "1.35"}),
        # Two-variable comprehensions (1.32) and semver (1.33) are in every supported release.
        ("device.attributes.all(k, v, k != '') && semver('1.2.3').major() == 1", set()),
    ],
)
def test_version_issues_per_release(expression: str, rejected_on: set[str]) -> None:
    for release in versions.SUPPORTED:
        issues = [i for i in lint_selector(expression, kubernetes_version=release)
                  if i.check == "cel/version"]
        assert bool(issues) == (release in rejected_on), (release, issues)
        for issue in issues:
            assert issue.message.startswith(f"Kubernetes {release} rejects this selector on create")
            assert issue.line == 1 and issue.column is not None


def test_each_name_is_reported_once_at_its_first_use() -> None:
    text = "[2, 1].sort()[0] == 1 && [3, 1].sort()[0] == 1 && !device.allowMultipleAllocations"
    ast = compile_selector(text).ast
    issues = versions.version_issues(ast, "1.34")
    assert [i.message.split(": ")[1].split(" is ")[0] for i in issues] == [
        "function sort()", "field device.allowMultipleAllocations"]
    assert issues[0].column == 12  # the call's opening parenthesis, where cel-go places a call


def test_without_a_target_release_nothing_is_reported() -> None:
    assert [i for i in lint_selector("[3, 1].sort() == [1, 3]") if i.check == "cel/version"] == []


@pytest.mark.parametrize("text", ["1.34", "v1.34", "1.34.2", " 1.34 "])
def test_release_spellings(text: str) -> None:
    assert versions.parse_version(text) == "1.34"


def test_review_denies_for_an_older_cluster(draguard: Callable[..., Run], tmp_path: Path) -> None:
    claim = _claim(tmp_path, SORTED)
    policies = str(ROOT / "policies")
    old = draguard("review", str(claim), "--policies", policies, "--kubernetes-version", "1.34", "-f", "json")
    assert old.code == 1, old.err
    assert json.loads(old.out)["kubernetesVersion"] == "1.34"
    found = json.loads(old.out)["findings"]
    version = [f for f in found if f["rule"] == "cel/version"]
    assert len(version) == 1 and version[0]["mode"] == "enforce", found
    assert "function sort() is accepted from 1.35" in version[0]["message"]
    new = draguard("review", str(claim), "--policies", policies, "--kubernetes-version", "1.35", "-f", "json")
    assert new.code == 0, new.out
    assert not [f for f in json.loads(new.out)["findings"] if f["rule"] == "cel/version"]


def test_review_says_which_release_it_assumed(draguard: Callable[..., Run], tmp_path: Path) -> None:
    run = draguard("review", str(_claim(tmp_path, MULTI)), "--policies", str(ROOT / "policies"))
    assert run.code == 0, run.out
    assert f"CEL selectors judged for Kubernetes {versions.DEFAULT} (--kubernetes-version)" in run.out
    assert "cel/version" not in run.out
    older = draguard("review", str(_claim(tmp_path, MULTI)), "--kubernetes-version", "v1.35.4")
    assert "CEL selectors judged for Kubernetes 1.35" in older.out and "cel/version" in older.out


def test_unknown_release_is_a_usage_error(draguard: Callable[..., Run], tmp_path: Path) -> None:
    run = draguard("review", str(_claim(tmp_path, SORTED)), "--kubernetes-version", "1.30")
    assert run.code == 2
    assert "unsupported Kubernetes version '1.30': draguard knows 1.34, 1.35, 1.36, 1.37" in run.err
    assert "Traceback" not in run.err


def test_a_newer_release_is_judged_by_the_newest_known_with_a_warning(
    draguard: Callable[..., Run], tmp_path: Path
) -> None:
    """A cluster upgraded before draguard must not turn every pipeline red."""
    newest = draguard("review", str(_claim(tmp_path, MULTI)), "--format", "json")
    for newer in ("1.38", "v1.41.3"):
        path = str(_claim(tmp_path, MULTI))
        run = draguard("review", path, "--kubernetes-version", newer, "--format", "json")
        assert run.code == newest.code, run.err
        assert json.loads(run.out)["findings"] == json.loads(newest.out)["findings"]
        minor = ".".join(newer.removeprefix("v").split(".")[:2])
        assert f"warning: Kubernetes {minor} is newer than the releases draguard knows" in run.err
        assert f"judged by {versions.DEFAULT}'s rules" in run.err
    assert "newer than" not in newest.err
    for bad in ("1.x", "latest", "1.3999999999"):
        run = draguard("review", str(_claim(tmp_path, MULTI)), "--kubernetes-version", bad)
        assert run.code == 2 and "unsupported Kubernetes version" in run.err, bad


# ---- DRA fields the target release drops on create ------------------------------------------------

CLAIM_WITH_GATED_FIELDS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "gated", "namespace": "default"},
    "spec": {"devices": {
        "requests": [
            {"name": "a", "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "tolerations": [{"key": "gpu.nvidia.com/xid", "operator": "Exists"}],
                "capacity": {"requests": {"memory": "10Gi"}},
            }},
            {"name": "b", "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu.nvidia.com",
                 "derivedAttributes": [{"name": "x"}]},
            ]},
        ],
        "constraints": [{"requests": ["a"], "distinctAttribute": "gpu.nvidia.com/uuid"}],
    }},
}
CLASS_WITH_EXTENDED_RESOURCE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu-er"},
    "spec": {"extendedResourceName": "example.com/gpu",
             "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
}


def _dropped(objs: list[dict[str, object]], release: str | None, *,
             admission: bool = False) -> dict[str, str]:
    from webhook.core.source import SourceObject
    from webhook.dra.inventory import Inventory
    from webhook.engine.context import Context
    from webhook.engine.evaluate import evaluate
    from webhook.policy.model import PolicySet

    report = evaluate([SourceObject(o) for o in objs], PolicySet.empty(), Inventory.empty(),
                      Context(kubernetes_version=release, admission=admission), rule_modules=("release",))
    return {f.message.split(":")[0]: f.message for f in report.findings
            if f.rule == "structure/dropped-field"}


def test_gated_fields_are_reported_for_releases_that_drop_them() -> None:
    old = _dropped([CLAIM_WITH_GATED_FIELDS, CLASS_WITH_EXTENDED_RESOURCE], "1.35")
    assert set(old) == {
        "spec.devices.requests[0].exactly.tolerations", "spec.devices.requests[0].exactly.capacity",
        "spec.devices.requests[1].firstAvailable[0].derivedAttributes",
        "spec.devices.constraints[0].distinctAttribute", "spec.extendedResourceName",
    }
    assert "needs the DRADeviceTaints feature gate (alpha and off in 1.33-1.35, beta and on from 1.36" in \
        old["spec.devices.requests[0].exactly.tolerations"]
    # From 1.36 only DRADerivedAttributes (alpha in 1.37) is still off by default.
    for release in ("1.36", "1.37"):
        assert set(_dropped([CLAIM_WITH_GATED_FIELDS, CLASS_WITH_EXTENDED_RESOURCE], release)) == {
            "spec.devices.requests[1].firstAvailable[0].derivedAttributes"}


def test_templates_are_read_at_their_inner_spec() -> None:
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t", "namespace": "default"},
                "spec": {"spec": CLAIM_WITH_GATED_FIELDS["spec"]}}
    assert "spec.spec.devices.requests[0].exactly.tolerations" in _dropped([template], "1.34")


def test_no_release_or_admission_reports_nothing() -> None:
    assert _dropped([CLAIM_WITH_GATED_FIELDS], None) == {}
    # At admission the API server has already dropped what its gates do not allow.
    assert _dropped([CLAIM_WITH_GATED_FIELDS], "1.34", admission=True) == {}
