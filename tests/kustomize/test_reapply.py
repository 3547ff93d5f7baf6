"""Applying an overlay a second time changes nothing on the API server.

A field the API server drops (an empty map, say) is sent again by every `kubectl apply` and shows as
drift in GitOps tools. kubectl still prints "configured" for objects whose schema makes its
client-side patch never empty (a PodDisruptionBudget's selector is patchStrategy=replace; a
ValidatingAdmissionPolicy's resourceRules and a ResourceQuota's scopeSelector expressions are atomic
lists); no write happens for those either: their resourceVersion stays.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kapi import Api, api_server
from kbundle import KUSTOMIZE

OVERLAYS = ("eks", "gke", "aks", "local")
# kubectl's client-side patch for these kinds is never empty (see the module docstring).
NEVER_EMPTY_PATCH = {
    "poddisruptionbudget.policy",
    "validatingadmissionpolicy.admissionregistration.k8s.io",
    "resourcequota",
}


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    with api_server() as a:
        yield a


def _versions(api: Api, overlay: str) -> dict[str, str]:
    res = api.kubectl("get", "-k", str(KUSTOMIZE / "overlays" / overlay), "-o", "json")
    assert res.returncode == 0, res.stderr
    items = json.loads(res.stdout).get("items", [])
    versions = {}
    for o in items:
        meta = o["metadata"]
        versions[f"{o['kind']}/{meta.get('namespace', '')}/{meta['name']}"] = meta["resourceVersion"]
    return versions


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_second_apply_writes_nothing(api: Api, overlay: str) -> None:
    # The overlays share one API server; a Job's pod template is immutable and differs between them.
    assert api.kubectl("delete", "jobs", "--all", "-A", "--wait=false").returncode == 0
    first = api.apply_kustomization(KUSTOMIZE / "overlays" / overlay)
    assert first.returncode == 0, first.stderr
    before = _versions(api, overlay)
    second = api.apply_kustomization(KUSTOMIZE / "overlays" / overlay)
    assert second.returncode == 0, second.stderr
    after = _versions(api, overlay)
    changed = {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
    assert not changed, f"{overlay}: a second apply wrote {sorted(changed)}"
    reported = [line.split()[0] for line in second.stdout.splitlines() if line.endswith(" configured")]
    unexpected = [r for r in reported if r.split("/")[0] not in NEVER_EMPTY_PATCH]
    assert not unexpected, f"{overlay}: a second apply reports {unexpected} as configured"
