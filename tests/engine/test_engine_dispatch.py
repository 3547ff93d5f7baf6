"""Rule dispatch: a rule evaluate() does not run on an object would have found nothing there.

Each rule names the kinds of object it reports on (`FunctionRule.scope`), and evaluate() runs only
the rules whose scope an object is in. Here every rule the dispatch skips is run anyway, directly,
on every object of the golden corpus (and some shapes at the scopes' edges), under both corpus
snapshots and in both admission and offline review: each must report nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from tests.engine.golden_corpus import TODAY, corpus, snapshots
from webhook.core.source import SourceObject
from webhook.dra.workloads import using_crd_table
from webhook.engine.context import Context
from webhook.engine.evaluate import _plan, _scopes_of
from webhook.engine.rules import modules
from webhook.engine.rules.base import RuleContext

EDGES: list[dict[str, Any]] = [
    # A retired resource.k8s.io version: only structure/deprecated-version speaks of it.
    {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "ResourceClaim", "metadata": {"name": "old"},
     "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]}}},
    {"apiVersion": "resource.k8s.io/v1alpha2", "kind": "DeviceClass", "metadata": {"name": "old"}},
    # Claim kinds of another group, and no group at all.
    {"apiVersion": "example.com/v1", "kind": "ResourceClaim", "metadata": {"name": "x"},
     "spec": {"devices": {"requests": [{"name": "gpu"}]}}},
    {"apiVersion": "v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "x"}, "spec": {"spec": 5}},
    # Odd shapes: no apiVersion, a non-string one, a workload kind without a pod template.
    {"kind": "Pod", "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}},
    {"apiVersion": 7, "kind": "DeviceClass", "metadata": {"name": "x"}},
    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"template": 3}},
    {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "x"},
     "spec": {"pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [
         {"name": "c", "image": "pytorch", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}}}}},
]


def _contexts() -> Iterator[tuple[str, Any, Context]]:
    for name, snap in snapshots().items():
        yield f"{name}/admission", snap, Context(
            namespace_labels=snap.namespace_labels, usage=snap.usage, served_versions=snap.served_versions,
            today=TODAY, operation="CREATE", admission=True,
        )
        yield f"{name}/review", snap, Context(
            namespace_labels=snap.namespace_labels, served_versions=snap.served_versions, today=TODAY,
            kubernetes_version="1.32",
        )


CONTEXTS = list(_contexts())
OBJECTS = [obj for _label, obj in corpus()] + EDGES


@pytest.mark.parametrize("label,snap,ctx", CONTEXTS, ids=[c[0] for c in CONTEXTS])
def test_skipped_rules_find_nothing(label: str, snap: Any, ctx: Context) -> None:
    mods = modules()
    every = [(m.name, r) for m in mods for r in m.rules]
    skipped_somewhere: set[str] = set()
    ran_somewhere: set[str] = set()
    for obj in OBJECTS:
        item = SourceObject(copy.deepcopy(obj))
        with using_crd_table(snap.policies.crd_table):
            planned = _plan(mods, _scopes_of(item.obj))
            rc = RuleContext.build([item], snap.policies, snap.inventory, ctx)
            for mod_name, rule in every:
                if any(rule is r for _n, r, _c in planned):
                    ran_somewhere.add(rule.id_prefix)
                    continue
                skipped_somewhere.add(rule.id_prefix)
                found = list(rule.check(item, rc))
                assert found == [], (
                    f"{mod_name} rule {rule.id_prefix} is not dispatched to {obj.get('kind')} "
                    f"{obj.get('apiVersion')} but finds {[f.rule for f in found]} there"
                )
    # The dispatch skips something, and still runs every rule on some object.
    assert skipped_somewhere
    assert ran_somewhere == {r.id_prefix for _n, r in every}


def test_unreadable_object_runs_every_rule() -> None:
    """An object whose scopes cannot be worked out gets every rule, as before dispatch."""

    class Hostile(dict[str, Any]):
        def get(self, key: str, default: Any = None) -> Any:
            raise RuntimeError("unreadable")

    mods = modules()
    planned = _plan(mods, _scopes_of(Hostile()))  # unreadable: every scope
    assert [r for _n, r, _c in planned] == [r for m in mods for r in m.rules]
    # Each rule is run through its own check: a FunctionRule's function, called directly.
    assert all(c is getattr(r, "fn", None) or c == r.check for _n, r, c in planned)
    assert any(c is getattr(r, "fn", None) for _n, r, c in planned)
