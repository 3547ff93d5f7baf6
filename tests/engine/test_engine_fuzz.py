"""Random objects and YAML never escape evaluate(): they become findings, or a clean parse-time ValueError."""

from __future__ import annotations

import copy
from typing import Any

from engine_helpers import (
    POLICIES,
    SEED,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory, load_inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import (
    PolicyError,
    load_policies,
    parse_policy_documents,
    parse_yaml_documents,
    source_objects,
)

POLICY_SET = load_policies(POLICIES)
INVENTORY = load_inventory(SEED / "cluster-inventory.yaml")
SEED_OBJECTS = [
    s.obj
    for name in (
        "deviceclasses.yaml",
        "training-claim.yaml",
        "inference-deployment.yaml",
        "inline-pod.yaml",
        "legacy-pod.yaml",
    )
    for s in source_objects((SEED / name).read_text(encoding="utf-8"), name)
]
OWN_INTERNAL = ("internal/structure", "internal/tier")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(["v1", "resource.k8s.io/v1beta1", "gpu.nvidia.com-h100", "All", "ExactCount", "", "-1"]),
)
keys = st.one_of(
    st.text(max_size=8),
    st.sampled_from(
        [
            "spec",
            "devices",
            "requests",
            "exactly",
            "count",
            "name",
            "deviceClassName",
            "selectors",
            "cel",
            "expression",
            "constraints",
            "matchAttribute",
            "resourceClaims",
            "source",
            "containers",
            "resources",
            "claims",
            "firstAvailable",
            "adminAccess",
            "basic",
            "metadata",
        ]
    ),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=5)),
    max_leaves=25,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.extend(_paths(v, (*prefix, i)))
    return out


@st.composite
def mutated_seed(draw: st.DrawFn) -> dict[str, Any]:
    """A seed manifest with one subtree replaced by random data."""
    obj = copy.deepcopy(draw(st.sampled_from(SEED_OBJECTS)))
    paths = [p for p in _paths(obj) if p]
    path = draw(st.sampled_from(paths))
    cur: Any = obj
    for part in path[:-1]:
        cur = cur[part]
    cur[path[-1]] = draw(json_values)
    return dict(obj)


def _check(objs: list[SourceObject], ctx: Context, inventory: Inventory) -> None:
    report = evaluate(objs, POLICY_SET, inventory, ctx)
    assert report.objects == len(objs)
    for f in report.findings:
        assert f.rule not in OWN_INTERNAL, f.message
        assert isinstance(f.message, str) and f.message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated_seed(), min_size=1, max_size=4), st.booleans())
def test_mutated_manifests_become_findings(objs: list[dict[str, Any]], admission: bool) -> None:
    ctx = Context(admission=admission, namespace_labels={"ml-workloads": {}})
    _check([SourceObject(o, file="fuzz.yaml") for o in objs], ctx, INVENTORY)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.dictionaries(keys, json_values, max_size=6), max_size=3))
def test_random_mappings_become_findings(objs: list[dict[str, Any]]) -> None:
    _check([SourceObject(o) for o in objs], Context(), Inventory.empty())


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("abc:-[]{}\n &*!|>'\"#0123456789 kindspec")), max_size=120))
def test_random_yaml_parses_cleanly_or_raises_value_error(text: str) -> None:
    try:
        objs = source_objects(text, "random.yaml")
    except ValueError as e:
        assert str(e).startswith("random.yaml")
        return
    _check(objs, Context(), INVENTORY)


POLICY_DOCS = [
    d.data
    for p in sorted(POLICIES.glob("*.yaml"))
    for d in parse_yaml_documents(p.read_text(encoding="utf-8"), str(p))
]


@st.composite
def mutated_policy(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(draw(st.sampled_from(POLICY_DOCS)))
    path = draw(st.sampled_from([p for p in _paths(doc) if p]))
    cur: Any = doc
    for part in path[:-1]:
        cur = cur[part]
    cur[path[-1]] = draw(json_values)
    return dict(doc)


@settings(max_examples=200, deadline=None)
@given(mutated_policy())
def test_mutated_policies_load_or_raise_policy_error(doc: dict[str, Any]) -> None:
    try:
        ps = parse_policy_documents([(doc, "p.yaml", 1)])
    except PolicyError as e:
        assert str(e).startswith("p.yaml:")
        return
    assert len(ps) == 1
