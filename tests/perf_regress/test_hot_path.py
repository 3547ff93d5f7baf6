"""The admission hot path does only the work its answer needs, and its shortcuts change no answer.

These pin the shortcuts taken for speed: the depth guard's pointer-free walk, admission planning a
migration patch without building the rewritten object, and an input set without DRA objects
indexing the inventory's maps as they are.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine import evaluate as evaluate_mod
from webhook.engine import migration
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate, too_deep
from webhook.engine.resolve import Index
from webhook.policy.load import load_policies
from webhook.server import admission

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "tests" / "fixtures" / "seed"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((SEED / name).read_text()) if isinstance(d, dict)]


JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(alphabet="ab/~", max_size=2), inner, max_size=3),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON_LIKE, limit=st.integers(min_value=0, max_value=6))
def test_depth_guard_matches_the_pointer_walk(value: Any, limit: int) -> None:
    # The pointer walk is the reference; the shortcut without pointers must agree with it.
    pointer = evaluate_mod._deep_pointer(value, limit)
    assert evaluate_mod._within_depth(value, limit) == (pointer is None)
    assert too_deep(value, limit) == pointer


def test_depth_guard_on_shared_subtrees_and_tuples() -> None:
    leaf: list[Any] = [1]
    for _ in range(30):
        leaf = [leaf, {"k": leaf}]  # each level shared twice: 2^30 paths, 60 containers
    assert too_deep(leaf, 100) is None
    pointer = too_deep(leaf, 20)
    assert pointer is not None and pointer.count("/") == 21, pointer
    deep: Any = "x"
    for _ in range(8):
        deep = ({"a/b": deep},)  # 16 containers deep
    assert too_deep(deep, 15) is None
    assert too_deep(deep, 10) == "/0/a~1b/0/a~1b/0/a~1b/0/a~1b/0/a~1b/0"


def test_admission_plans_the_patch_without_building_the_rewritten_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pod = _docs("legacy-pod.yaml")[0]
    policy = load_policies(ROOT / "policies").migration[0]
    from webhook.dra.workloads import pod_spec_of

    found = pod_spec_of(pod)
    assert found is not None
    plan = migration.plan_pod_spec(pod, found[0], found[1], policy, namespace="ml", rewrite=False)
    assert plan.patch and plan._rewritten is None
    sent = copy.deepcopy(pod)
    # Built on first use, equal to the patch applied to the object as sent, input untouched.
    assert plan.rewritten == jsonpatch.apply_patch(sent, plan.patch)
    assert pod == sent
    eager = migration.plan_pod_spec(pod, found[0], found[1], policy, namespace="ml")
    assert eager._rewritten == plan.rewritten

    # Through the webhook: neither endpoint builds a rewritten object; mutate applies the patch
    # once (to prove it applies) and answers with it.
    def forbidden(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the admission path built a rewritten object")

    monkeypatch.setattr(migration, "copy_data", forbidden)
    snap = admission.Snapshot(
        policies=load_policies(ROOT / "policies"),
        inventory=Inventory.from_objects(_docs("deviceclasses.yaml")),
        namespace_labels={"ml": {"draguard.io/migration-mode": "migrate"}},
    )
    req = {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "namespace": "ml",
        "operation": "CREATE",
        "object": pod,
    }
    out = admission.review("mutate", req, snap)
    assert out.verdict == "patched", out.response
    ops = json.loads(base64.b64decode(out.response["patch"]))
    assert jsonpatch.apply_patch(pod, ops) == plan.rewritten
    assert admission.review("validate", req, snap).verdict in ("allowed", "warned")


def test_index_without_dra_objects_shares_the_inventory_maps() -> None:
    inv = Inventory.from_objects(_docs("deviceclasses.yaml") + _docs("inference-deployment.yaml"))
    pod = SourceObject(_docs("legacy-pod.yaml")[0])
    idx = Index.build([pod], inv)
    assert idx.classes is inv.classes and idx.templates is inv.templates and idx.claims is inv.claims
    # An input DeviceClass overrides the cluster's in the index only, never in the inventory.
    override = copy.deepcopy(next(d for d in _docs("deviceclasses.yaml")))
    name = override["metadata"]["name"]
    override["spec"]["selectors"] = [{"cel": {"expression": "device.driver == 'x.example.com'"}}]
    before = inv.classes[name]
    idx2 = Index.build([pod, SourceObject(override)], inv)
    assert idx2.classes[name] != before and inv.classes[name] == before
    assert idx2.sources[("DeviceClass", "", name)].obj is override


def test_shared_index_gives_the_same_findings_as_a_copied_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shortcut is only an identity: findings equal those of the copying build."""
    policies = load_policies(ROOT / "policies")
    inv = Inventory.from_objects(_docs("deviceclasses.yaml") + _docs("inference-deployment.yaml"))
    objs = [SourceObject(o) for o in _docs("legacy-pod.yaml") + _docs("inference-deployment.yaml")
            if o.get("kind") != "ResourceClaimTemplate"]
    ctx = Context(default_namespace="ml-workloads", operation="CREATE", admission=True)
    fast = [evaluate([o], policies, inv, ctx).findings for o in objs]
    copying = Index.build

    def copied(objects: Any, inventory: Inventory, default_namespace: str = "default") -> Index:
        idx = copying(objects, inventory, default_namespace)
        return Index(dict(idx.claims), dict(idx.templates), dict(idx.classes), dict(idx.sources))

    monkeypatch.setattr(Index, "build", staticmethod(copied))
    slow = [evaluate([o], policies, inv, ctx).findings for o in objs]
    assert fast == slow and any(fast)
    assert evaluate_mod.MAX_DEPTH == 100


def test_today_follows_the_local_date_across_midnight(monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime as dt
    import time

    assert admission._today() == dt.date.today()
    day = dt.date(2031, 3, 14)
    midnight = dt.datetime.combine(day + dt.timedelta(days=1), dt.time()).timestamp()
    for at, want in (
        (midnight - 0.001, day),
        (midnight, day + dt.timedelta(days=1)),
        (midnight - 3600, day),  # the clock stepped back: the remembered day is not reused
    ):
        monkeypatch.setattr(time, "time", lambda at=at: at)
        assert admission._today() == want


def test_gpu_equivalents_memo_is_per_calculator() -> None:
    """Two inventories that price a class differently never share a remembered value."""
    from fractions import Fraction

    from webhook.engine.quota import QuotaCalculator

    classes = _docs("deviceclasses.yaml")
    names = [c["metadata"]["name"] for c in classes]
    mig = next(n for n in names if "mig" in n)
    full = Inventory.from_objects(classes)
    a, b = QuotaCalculator(full), QuotaCalculator(Inventory.from_objects(classes))
    from webhook.dra.objects import read_claim_spec

    request = {"name": "g", "exactly": {"deviceClassName": mig, "count": 2}}
    spec = read_claim_spec({"devices": {"requests": [request]}}, "resource.k8s.io/v1")
    want = a.claim_gpu_equivalents(spec)
    assert want != Fraction(2)  # a MIG slice counts a fraction of a GPU
    b._fractions[mig] = Fraction(1)  # b prices the class as a whole GPU
    assert a.claim_gpu_equivalents(spec) == want
    assert b.claim_gpu_equivalents(spec) == Fraction(2)
    assert a.claim_gpu_equivalents(spec) == want


@pytest.mark.parametrize(
    ("request_name", "warned"), [("mig-gpu", False), ("mig-gpu/sub", False), ("nope", True)]
)
def test_container_claim_request_names_are_checked(request_name: str, warned: bool) -> None:
    """structure/undeclared-claim reads a container's `request` (now from the pod spec): a request
    the template lacks warns, an existing one (or its subrequest) does not."""
    docs = _docs("inference-deployment.yaml")
    dep = copy.deepcopy(next(d for d in docs if d["kind"] == "Deployment"))
    ref = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["claims"][0]
    ref["request"] = request_name
    inv = Inventory.from_objects(_docs("deviceclasses.yaml") + docs)
    report = evaluate([SourceObject(dep)], load_policies(ROOT / "policies"), inv,
                      Context(default_namespace="ml-workloads"), rule_modules=("structure",))
    hits = [
        f for f in report.findings if f.rule == "structure/undeclared-claim" and "names request" in f.message
    ]
    assert bool(hits) is warned
    if warned:
        assert "'nope'" in hits[0].message and "mig-gpu" in hits[0].message


@settings(max_examples=300, deadline=None)
@given(terms=st.lists(st.tuples(st.integers(0, 64), st.sampled_from([1, 4, 7, 28, 3])), max_size=40))
def test_ratio_sums_are_fraction_sums(terms: list[tuple[int, int]]) -> None:
    """quota sums GPU-equivalents as int ratios: the value Fraction arithmetic gives, with the
    denominator held at the least common one however many terms a hostile object brings."""
    from fractions import Fraction
    from math import lcm

    from webhook.engine.quota import add_ratio

    num, den = 0, 1
    for n, d in terms:
        num, den = add_ratio(num, den, n, d)
    assert Fraction(num, den) == sum((Fraction(n, d) for n, d in terms), Fraction(0))
    assert den == lcm(1, *(d for _n, d in terms))


def test_claim_gpu_ratio_is_the_largest_alternative_per_request() -> None:
    from fractions import Fraction

    from webhook.dra.objects import read_claim_spec
    from webhook.engine.quota import QuotaCalculator

    classes = _docs("deviceclasses.yaml")
    names = [c["metadata"]["name"] for c in classes]
    mig = next(n for n in names if "mig" in n)
    full = next(n for n in names if "mig" not in n)
    calc = QuotaCalculator(Inventory.from_objects(classes))
    one_mig = calc.class_fraction(mig)
    assert one_mig.denominator > 1
    requests = [
        {"name": "a", "exactly": {"deviceClassName": mig, "count": 3}},
        {"name": "b", "firstAvailable": [
            {"name": "x", "deviceClassName": mig, "count": 1},
            {"name": "y", "deviceClassName": full, "count": 1},
        ]},
    ]
    spec = read_claim_spec({"devices": {"requests": requests}}, "resource.k8s.io/v1")
    want = one_mig * 3 + max(one_mig, calc.class_fraction(full))
    assert Fraction(*calc.claim_gpu_ratio(spec)) == want
    assert calc.claim_gpu_equivalents(spec) == want


@settings(max_examples=300, deadline=None)
@given(pattern=st.text(alphabet="nvidia.com/gpu*?[]!-", max_size=12),
       resource=st.text(alphabet="nvidia.com/gpu-", max_size=12))
def test_resource_mapping_matches_as_glob_match(pattern: str, resource: str) -> None:
    """A mapping keeps its resource glob compiled; what it matches is glob_match's answer."""
    from webhook.policy.model import ResourceMapping, glob_match

    m = ResourceMapping(pattern, "gpu.nvidia.com", {"zone": "a"})
    assert m.matches(resource, {"zone": "a"}) is glob_match(pattern, resource)
    assert not m.matches(resource, {"zone": "b"})
    assert m == ResourceMapping(pattern, "gpu.nvidia.com", {"zone": "a"})


def test_pod_labels_and_annotations_read_together() -> None:
    """One read of the template's metadata gives both maps: the template's over the workload's, and
    only string values; a Pod's are its own."""
    from webhook.dra.workloads import pod_labels_and_annotations

    dep = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"labels": {"a": "1", "b": "1", "n": 3}, "annotations": {"x": "1", "y": "1"}},
        "spec": {"template": {
            "metadata": {"labels": {"b": "2", "m": None}, "annotations": {"y": "2", "z": ["no"]}},
            "spec": {"containers": []},
        }},
    }
    assert pod_labels_and_annotations(dep) == ({"a": "1", "b": "2"}, {"x": "1", "y": "2"})
    pod = {"kind": "Pod", "metadata": {"labels": {"a": "1"}}, "spec": {"template": dep["spec"]["template"]}}
    assert pod_labels_and_annotations(pod) == ({"a": "1"}, {})
    assert pod_labels_and_annotations({"kind": "Deployment", "metadata": "bad"}) == ({}, {})
