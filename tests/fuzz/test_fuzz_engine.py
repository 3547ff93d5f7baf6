"""Fuzzing the engine's untrusted-input paths with hypothesis.

Whatever a user or an admission request sends (random YAML text, objects of the right kinds with
wrong shapes, mutated seed manifests, random CEL text, random policy and inventory documents),
the engine answers with findings or a clean, typed error: never an exception out of evaluate()
or the linter, and never an `internal/` finding (a rule that crashed).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.cel.issues import CHECKS, CelIssue
from webhook.cel.lint import lint_selector
from webhook.core.findings import Finding, Report
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory, InventoryError, parse_inventory_text
from webhook.engine.context import Context, QuotaUsage
from webhook.engine.evaluate import evaluate
from webhook.engine.migration import plan_workload
from webhook.policy.load import PolicyError, load_policies, parse_policy_text
from webhook.policy.model import (
    CelLintPolicy,
    GpuQuotaPolicy,
    MigrationMode,
    MigrationPolicy,
    PolicySet,
    QuotaBudget,
    ResourceMapping,
)
from webhook.review.inputs import InputError, objects_of, parse_text

ROOT = Path(__file__).parents[2]
SEED = ROOT / "tests" / "fixtures" / "seed"
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _policies() -> PolicySet:
    """The repository's shipped policies plus one of each kind that reaches every branch."""
    built = PolicySet(
        quota=(
            GpuQuotaPolicy(
                name="fuzz",
                budgets=(
                    QuotaBudget("namespace", "*", {"*": 1}, gpu_equivalents=0.5, claims=1),
                    QuotaBudget("team", "*", {"gpu.nvidia.com": 1}, gpu_equivalents=0.1, claims=1),
                ),
            ),
        ),
        cel_lint=(CelLintPolicy(name="fuzz"),),
        migration=(
            MigrationPolicy(
                name="fuzz",
                mappings=(
                    ResourceMapping("nvidia.com/gpu", "gpu.nvidia.com"),
                    ResourceMapping("nvidia.com/mig-*", "mig.nvidia.com"),
                ),
                default_mode=MigrationMode.MIGRATE,
            ),
        ),
    )
    try:
        shipped = load_policies(ROOT / "policies")
    except (PolicyError, OSError):
        return built
    return shipped.merged(
        PolicySet(quota=built.quota, migration=() if shipped.migration else built.migration)
    )


def _inventory() -> Inventory:
    docs = [d for d in yaml.safe_load_all((SEED / "cluster-inventory.yaml").read_text()) if d]
    docs += [
        d
        for d in yaml.safe_load_all(
            (Path(__file__).parents[1] / "rules" / "fixtures" / "inventory.yaml").read_text()
        )
        if d
    ]
    return Inventory.from_objects(docs)


POLICIES = _policies()
INVENTORY = _inventory()
SEED_OBJECTS: list[dict[str, Any]] = [
    d
    for f in sorted(SEED.glob("*.yaml"))
    if f.name != "cluster-inventory.yaml"
    for d in yaml.safe_load_all(f.read_text())
    if isinstance(d, Mapping)
]
CONTEXTS = [
    Context(),
    Context(
        namespace_labels={
            "ml-workloads": {"draguard.io/team": "red", "draguard.io/migration-mode": "enforce"},
            "default": {"draguard.io/migration-mode": "bogus"},
        },
        usage=QuotaUsage(
            devices={("ml-workloads", "gpu.nvidia.com"): 3},
            gpu_equivalents={"team:red": 9.0},
            claims={"default": 2},
        ),
        admission=True,
        operation="CREATE",
        served_versions=frozenset({"v1beta1"}),
    ),
]


def _no_crash(report: Report) -> None:
    crashed: list[Finding] = [f for f in report.findings if f.rule.startswith("internal/")]
    assert not crashed, "\n".join(f"{f.rule}: {f.message}" for f in crashed)


# -- strategies ---------------------------------------------------------------------------------

FIELDS = [
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "namespace",
    "labels",
    "spec",
    "template",
    "jobTemplate",
    "replicas",
    "parallelism",
    "completions",
    "containers",
    "initContainers",
    "resources",
    "limits",
    "requests",
    "claims",
    "request",
    "resourceClaims",
    "resourceClaimName",
    "resourceClaimTemplateName",
    "source",
    "devices",
    "exactly",
    "firstAvailable",
    "deviceClassName",
    "selectors",
    "cel",
    "expression",
    "allocationMode",
    "count",
    "adminAccess",
    "constraints",
    "matchAttribute",
    "config",
    "opaque",
    "driver",
    "parameters",
    "sharing",
    "strategy",
    "extendedResourceName",
    "nodeSelector",
    "affinity",
    "items",
    "basic",
    "attributes",
    "capacity",
    "nvidia.com/gpu",
    "nvidia.com/mig-3g.20gb",
    "image",
    "command",
]
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "v1",
            "apps/v1",
            "batch/v1",
            "resource.k8s.io/v1",
            "resource.k8s.io/v1beta1",
            "resource.k8s.io/v1beta2",
            "Pod",
            "Deployment",
            "Job",
            "CronJob",
            "DaemonSet",
            "ResourceClaim",
            "ResourceClaimTemplate",
            "DeviceClass",
            "ResourceSlice",
            "All",
            "ExactCount",
            "gpu.nvidia.com",
            "mig.nvidia.com",
            "gpu.nvidia.com-a100",
            "device.driver == 'gpu.nvidia.com'",
            "device.attributes['gpu.nvidia.com'].migProfile == 1",
            "2",
            "1Gi",
            "resource.nvidia.com/v1beta1",
            "GpuConfig",
            "MigDeviceConfig",
            "ml-workloads",
            "g",
            "a/b",
            "~1",
        ]
    ),
)
JSONISH = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=6)), children, max_size=5),
    ),
    max_leaves=40,
)
OBJECTS = st.fixed_dictionaries(
    {
        "apiVersion": LEAVES,
        "kind": st.sampled_from(
            [
                "Pod",
                "Deployment",
                "StatefulSet",
                "Job",
                "CronJob",
                "DaemonSet",
                "ReplicaSet",
                "PodTemplate",
                "ResourceClaim",
                "ResourceClaimTemplate",
                "DeviceClass",
                "ResourceSlice",
                "ConfigMap",
                "List",
            ]
        ),
    },
    optional={"metadata": JSONISH, "spec": JSONISH, "template": JSONISH, "items": JSONISH},
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.extend(_paths(v, (*prefix, i)))
    return out


@st.composite
def mutated_seed(draw: st.DrawFn) -> dict[str, Any]:
    """A seed manifest with a few fields replaced by random values (wrong types included)."""
    obj = copy.deepcopy(draw(st.sampled_from(SEED_OBJECTS)))
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(obj) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = obj
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = draw(JSONISH)
    return obj


# -- evaluate() never crashes -------------------------------------------------------------------


@FUZZ
@given(objs=st.lists(OBJECTS, min_size=1, max_size=3), ctx=st.sampled_from(CONTEXTS))
def test_random_objects(objs: list[dict[str, Any]], ctx: Context) -> None:
    _no_crash(evaluate([SourceObject(o) for o in objs], POLICIES, INVENTORY, ctx))


@FUZZ
@given(objs=st.lists(mutated_seed(), min_size=1, max_size=3), ctx=st.sampled_from(CONTEXTS))
def test_mutated_seed_manifests(objs: list[dict[str, Any]], ctx: Context) -> None:
    _no_crash(evaluate([SourceObject(o) for o in objs], POLICIES, INVENTORY, ctx))
    for o in objs:
        plan_workload(o, POLICIES.migration[0])  # the CLI's rewrite path takes the same input


@FUZZ
@given(
    text=st.one_of(
        st.text(max_size=200),
        st.builds(lambda o: yaml.safe_dump(o, sort_keys=False), mutated_seed()),
        st.builds(lambda o: yaml.safe_dump(o)[: len(yaml.safe_dump(o)) // 2], mutated_seed()),
    )
)
def test_random_yaml_text(text: str) -> None:
    """Bytes from a file or request: parsed into objects or a one-line InputError, then evaluated."""
    try:
        docs = parse_text(text, "fuzz.yaml")
    except InputError as e:
        assert str(e).startswith("fuzz.yaml") and "\n" not in str(e).strip()
        return
    objects, _skipped = objects_of(docs, "fuzz.yaml")
    _no_crash(evaluate(objects, POLICIES, INVENTORY, CONTEXTS[1]))


# -- the CEL linter never crashes ----------------------------------------------------------------

CEL_TOKENS = st.sampled_from(
    [
        "device",
        ".driver",
        ".attributes",
        ".capacity",
        "['gpu.nvidia.com']",
        "['resource.kubernetes.io']",
        ".productName",
        ".profile",
        ".migProfile",
        ".memory",
        ".driverVersion",
        " == ",
        " != ",
        " && ",
        " || ",
        " < ",
        ".compareTo(",
        "quantity('40Gi')",
        "semver('1.2.3')",
        ".isGreaterThan(",
        ")",
        "(",
        "!",
        "'x'",
        "1",
        "true",
        "has(",
        "in",
        " ",
        "[",
        "]",
        ".startsWith('NVIDIA')",
        "size(",
        ".exists(k, ",
        "k",
        ",",
        "\n",
        "cel.bind(x, 1, ",
        "x",
        "?",
        ":",
        ".asInteger()",
        "9223372036854775807",
        "1.5",
        "b'\\x00'",
    ]
)


@FUZZ
@given(
    expr=st.one_of(st.text(max_size=80), st.lists(CEL_TOKENS, max_size=20).map("".join)),
    with_devices=st.booleans(),
)
def test_random_cel_text(expr: str, with_devices: bool) -> None:
    issues = lint_selector(expr, devices=INVENTORY.devices if with_devices else None, driver="gpu.nvidia.com")
    assert isinstance(issues, list)
    for issue in issues:
        assert isinstance(issue, CelIssue) and issue.check in CHECKS and issue.message


@FUZZ
@given(expr=st.lists(CEL_TOKENS, max_size=20).map("".join))
def test_random_cel_in_objects(expr: str) -> None:
    dc = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "f"},
        "spec": {"selectors": [{"cel": {"expression": expr}}]},
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "f"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "exactly": {
                            "deviceClassName": "f",
                            "allocationMode": "All",
                            "selectors": [{"cel": {"expression": expr}}],
                        },
                    }
                ]
            }
        },
    }
    _no_crash(evaluate([SourceObject(dc), SourceObject(claim)], POLICIES, INVENTORY, CONTEXTS[1]))


# -- policy and inventory documents: clean errors only ------------------------------------------


@FUZZ
@given(
    doc=st.fixed_dictionaries(
        {
            "apiVersion": st.sampled_from(["policy.draguard.io/v1alpha1", "v1", ""]),
            "kind": st.sampled_from(
                [
                    "GpuTierPolicy",
                    "GpuQuotaPolicy",
                    "CelLintPolicy",
                    "MigrationPolicy",
                    "PolicyException",
                    "Other",
                ]
            ),
        },
        optional={"metadata": JSONISH, "spec": JSONISH},
    )
)
def test_random_policy_documents(doc: dict[str, Any]) -> None:
    try:
        text = yaml.safe_dump(doc)
    except yaml.YAMLError:
        return
    try:
        parse_policy_text(text, "fuzz-policy.yaml")
    except PolicyError as e:
        assert str(e).startswith("fuzz-policy.yaml")


@FUZZ
@given(
    text=st.one_of(
        st.text(max_size=120),
        st.builds(
            lambda items: yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}),
            st.lists(OBJECTS, max_size=3),
        ),
    )
)
def test_random_inventory_text(text: str) -> None:
    try:
        inv = parse_inventory_text(text, "fuzz-inventory.yaml")
    except InventoryError as e:
        assert str(e).startswith("fuzz-inventory.yaml")
        return
    # Whatever was accepted can be evaluated against.
    _no_crash(evaluate([SourceObject(o) for o in SEED_OBJECTS], POLICIES, inv, CONTEXTS[0]))


@pytest.mark.parametrize(
    "obj", SEED_OBJECTS, ids=lambda o: f"{o.get('kind')}-{o.get('metadata', {}).get('name')}"
)
def test_seed_objects_evaluate_cleanly(obj: dict[str, Any]) -> None:
    _no_crash(evaluate([SourceObject(obj)], POLICIES, INVENTORY, CONTEXTS[1]))
