"""The real kube-scheduler allocates what tools/celoracle and draguard say a selector selects.

Each case gets its own pool of two devices and a DeviceClass `<guard> && (<selector>)`; a pod
claims one device. The scheduler must bind the pod to a device both the oracle and draguard say
matches, or leave it Unschedulable when neither device matches.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

from tests.e2e.helpers import Kubectl, wait_for
from tests.gotool import go_tool
from webhook.cel.env import compile_selector
from webhook.dev.cluster import LocalCluster
from webhook.dev.nodes import SimNode, register_nodes
from webhook.dra.objects import read_slice_devices

DRIVER = "oracle.draguard.io"
NODE = "cel-oracle-0"
UNSCHEDULABLE = ("PodScheduled", "False", "Unschedulable")
D = f"device.attributes['{DRIVER}']"

SELECTORS = (
    "'other.example.com' in device.attributes",
    "size(device.attributes['nope.example.com']) == 0 && !('nope.example.com' in device.attributes)",
    "has(device.attributes.anything) && device.attributes['oracle.draguard.io'].model == 'a'",
    f"{D}.model == 'b' && 1 < 2u",
    f"device.capacity['{DRIVER}'].memory.compareTo(quantity('16Gi')) > 0",
    f"has({D}.version) && {D}.version.isGreaterThan(semver('1.2.0'))",
    "size(device.attributes) == 1",
    "device.attributes.exists(d, d == 'other.example.com')",
    "!('other.example.com' in device.attributes) && size(device.attributes['other.example.com']) == 0",
    f"{D}.model == 'c'",
    f"[1, 2, 3].sum() == 6 && {D}.model.find('[a]') == 'a'",
    f"{D}.exists(k, v, k == 'model' && v == 'b')",
)


def _slice(case: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-case-{case}"},
        "spec": {
            "driver": DRIVER, "nodeName": NODE,
            "pool": {"name": f"case-{case}", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": "dev-0", "attributes": {
                    "case": {"int": case}, "model": {"string": "a"}, "version": {"version": "1.2.3"},
                    "other.example.com/zone": {"string": "b"}}, "capacity": {"memory": {"value": "40Gi"}}},
                {"name": "dev-1", "attributes": {"case": {"int": case}, "model": {"string": "b"}},
                 "capacity": {"memory": {"value": "8Gi"}}},
            ],
        },
    }


def _objects(ns: str, case: int, selector: str) -> list[dict[str, Any]]:
    cls = f"cel-oracle-{case}"
    guard = f"device.driver == '{DRIVER}' && {D}.case == {case}"
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": cls},
         "spec": {"selectors": [{"cel": {"expression": f"{guard} && ({selector})"}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
         "metadata": {"name": cls, "namespace": ns},
         "spec": {"spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": cls}}]}}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": cls, "namespace": ns},
         "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                  "resources": {"claims": [{"name": "dev"}]}}],
                  "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": cls}]}},
    ]


def _oracle(slices: list[dict[str, Any]]) -> list[set[str]]:
    """Names of the devices Kubernetes' CEL selects, per case."""
    lines = []
    for case, selector in enumerate(SELECTORS):
        for device in slices[case]["spec"]["devices"]:
            lines.append(json.dumps({"id": [case, device["name"]], "selector": selector, "driver": DRIVER,
                                     "device": device}))
    res = subprocess.run([str(go_tool("celoracle"))], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, timeout=120, check=True)
    out: list[set[str]] = [set() for _ in SELECTORS]
    for line in res.stdout.splitlines():
        row = json.loads(line)
        if row.get("eval") == "match":
            out[row["id"][0]].add(row["id"][1])
    return out


def _draguard(slices: list[dict[str, Any]]) -> list[set[str]]:
    out = []
    for case, selector in enumerate(SELECTORS):
        compiled = compile_selector(selector)
        out.append({d.name for d in read_slice_devices(slices[case]) if compiled.evaluate(d)})
    return out


def test_scheduler_allocates_what_the_oracle_selects(
    cluster: LocalCluster, kubectl: Kubectl, namespace: Callable[..., str]
) -> None:
    register_nodes(cluster.kube(), [SimNode(NODE, "")])
    ns = namespace("celsched")
    slices = [_slice(case) for case in range(len(SELECTORS))]
    expected = _oracle(slices)
    assert _draguard(slices) == expected
    sizes = {len(e) for e in expected}
    assert sizes == {0, 1, 2}, expected
    objects = list(slices)
    for case, selector in enumerate(SELECTORS):
        objects += _objects(ns, case, selector)
    try:
        _check(kubectl, ns, objects, expected)
    finally:
        # Cluster-scoped objects outlive the namespace: remove them for the tests that follow.
        cluster_scoped = [o for o in objects if o["kind"] in ("DeviceClass", "ResourceSlice")]
        kubectl.run("delete", "--ignore-not-found", "--wait=false", "-f", "-",
                    input=json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster_scoped}))


def _check(kubectl: Kubectl, ns: str, objects: list[dict[str, Any]], expected: list[set[str]]) -> None:
    applied = kubectl.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    assert applied.returncode == 0, applied.stderr

    def verdict(case: int) -> str | None:
        pod = kubectl.get("pod", f"cel-oracle-{case}", ns)
        if pod["spec"].get("nodeName"):
            claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            claim = kubectl.get("resourceclaim", claim_name, ns)
            results = claim["status"]["allocation"]["devices"]["results"]
            return str(results[0]["device"])
        for cond in pod.get("status", {}).get("conditions", []):
            if (cond["type"], cond["status"], cond.get("reason")) == UNSCHEDULABLE:
                return ""
        return None

    def settled(case: int) -> tuple[str] | None:
        found = verdict(case)
        return None if found is None else (found,)

    for case, selector in enumerate(SELECTORS):
        got = wait_for(lambda case=case: settled(case), f"the scheduler's verdict on case {case}",
                       timeout=120)[0]
        print(f"case {case}: scheduler {got or 'unschedulable'}, oracle {sorted(expected[case])}")
        if expected[case]:
            assert got in expected[case], (selector, got, expected[case])
        else:
            assert got == "", (selector, got)
