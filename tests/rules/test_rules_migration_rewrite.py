"""The pure legacy-GPU rewrite: patches apply with jsonpatch and yield valid DRA objects."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.dra.objects import read_claim_spec
from webhook.engine.migration import (
    dns_label,
    find_legacy,
    is_legacy_resource,
    node_labels_of,
    plan_workload,
    rewrite,
    template_name,
)
from webhook.policy.model import MigrationPolicy, ResourceMapping

H100_LABEL = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}

POLICY = MigrationPolicy(
    name="legacy",
    mappings=(
        ResourceMapping("nvidia.com/gpu", "gpu.nvidia.com"),
        ResourceMapping("nvidia.com/gpu", "gpu.nvidia.com-h100", H100_LABEL),
        ResourceMapping("nvidia.com/mig-3g.20gb", "gpu.nvidia.com-a100-mig-3g20gb"),
    ),
)


def _pod(containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"containers": containers, **spec},
    }


def test_legacy_resource_names() -> None:
    assert is_legacy_resource("nvidia.com/gpu")
    assert is_legacy_resource("nvidia.com/mig-3g.20gb")
    assert not is_legacy_resource("nvidia.com/mig-")
    assert not is_legacy_resource("nvidia.com/gpu.shared.x")
    assert not is_legacy_resource("cpu")


def test_seed_legacy_pod_rewrite(legacy_pod: dict[str, Any]) -> None:
    original = copy.deepcopy(legacy_pod)
    patch, rewritten, templates = rewrite(legacy_pod, POLICY, namespace="ml-workloads")
    assert legacy_pod == original, "rewrite must not modify its input"
    # The patch applies to the object as sent and yields exactly the rewritten object.
    assert jsonpatch.apply_patch(legacy_pod, patch) == rewritten
    # The extended resource is removed with an escaped pointer.
    assert {"op": "remove", "path": "/spec/containers/0/resources/limits"} in patch
    c = rewritten["spec"]["containers"][0]
    assert "limits" not in c["resources"]
    assert c["resources"]["claims"] == [{"name": "trainer-gpu"}]
    assert rewritten["spec"]["resourceClaims"] == [
        {"name": "trainer-gpu", "resourceClaimTemplateName": "draguard-gpu-nvidia-com-2"}
    ]
    assert len(templates) == 1
    t = templates[0]
    assert t["apiVersion"] == "resource.k8s.io/v1"
    assert t["kind"] == "ResourceClaimTemplate"
    assert t["metadata"]["name"] == "draguard-gpu-nvidia-com-2"
    assert t["metadata"]["namespace"] == "ml-workloads"
    assert t["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "draguard"
    devices = t["spec"]["spec"]["devices"]
    # Two GPUs: GPUs joined by NVLink first, else any two, as the device plugin gave (no inventory
    # tells whether the nodes have NVLink).
    assert devices["requests"] == [{"name": "gpu", "firstAvailable": [
        {"name": "nvlink", "deviceClassName": "gpu.nvidia.com", "count": 2},
        {"name": "any", "deviceClassName": "gpu.nvidia.com", "count": 2},
    ]}]  # fmt: skip
    link = {"requests": ["gpu/nvlink"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}
    assert devices["constraints"] == [link]
    spec = read_claim_spec(t["spec"]["spec"], t["apiVersion"])
    assert [alt[3] for alt in spec.requests[0].alternatives()] == [2, 2]  # count preserved from the limit


def test_escaped_pointer_when_other_limits_remain() -> None:
    pod = _pod(
        [
            {
                "name": "c",
                "image": "x",
                "resources": {
                    "limits": {"nvidia.com/gpu": 1, "cpu": "2"},
                    "requests": {"nvidia.com/gpu": "1", "cpu": "1"},
                },
            }
        ]
    )
    patch, rewritten, _ = rewrite(pod, POLICY)
    paths = [op["path"] for op in patch if op["op"] == "remove"]
    assert "/spec/containers/0/resources/limits/nvidia.com~1gpu" in paths
    assert "/spec/containers/0/resources/requests/nvidia.com~1gpu" in paths
    res = rewritten["spec"]["containers"][0]["resources"]
    assert res["limits"] == {"cpu": "2"}
    assert res["requests"] == {"cpu": "1"}
    assert jsonpatch.apply_patch(pod, patch) == rewritten


def test_node_selector_picks_h100_class() -> None:
    pod = _pod(
        [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 8}}}], nodeSelector=H100_LABEL
    )
    _, _, templates = rewrite(pod, POLICY)
    assert templates[0]["metadata"]["name"] == "draguard-gpu-nvidia-com-h100-8"
    choices = templates[0]["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert {c["deviceClassName"] for c in choices} == {"gpu.nvidia.com-h100"}


def test_required_node_affinity_counts_as_node_label() -> None:
    spec = {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
                ]
            }
        ]
    }
    labels = node_labels_of(
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": spec}}}
    )
    assert labels == H100_LABEL
    # Two ORed terms pin nothing for certain.
    spec2 = {"nodeSelectorTerms": [*spec["nodeSelectorTerms"], {"matchExpressions": []}]}
    assert (
        node_labels_of(
            {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": spec2}}}
        )
        == {}
    )


def test_init_containers_and_mig_and_existing_claims() -> None:
    pod = _pod(
        [
            {
                "name": "main",
                "image": "x",
                "resources": {"limits": {"nvidia.com/gpu": 1}, "claims": [{"name": "existing"}]},
            },
        ],
        initContainers=[
            {"name": "warm", "image": "x", "resources": {"limits": {"nvidia.com/mig-3g.20gb": 1}}}
        ],
        resourceClaims=[{"name": "existing", "resourceClaimName": "shared"}],
    )
    patch, rewritten, templates = rewrite(pod, POLICY)
    assert jsonpatch.apply_patch(pod, patch) == rewritten
    names = [c["name"] for c in rewritten["spec"]["resourceClaims"]]
    assert names == ["existing", "warm-mig-3g-20gb", "main-gpu"]
    assert rewritten["spec"]["initContainers"][0]["resources"]["claims"] == [{"name": "warm-mig-3g-20gb"}]
    assert rewritten["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "existing"},
        {"name": "main-gpu"},
    ]
    assert sorted(t["metadata"]["name"] for t in templates) == [
        "draguard-gpu-nvidia-com-1",
        "draguard-gpu-nvidia-com-a100-mig-3g20gb-1",
    ]
    mig = next(t for t in templates if "mig" in t["metadata"]["name"])
    assert mig["spec"]["spec"]["devices"]["requests"][0]["name"] == "mig"


def test_claim_name_collision_gets_suffix() -> None:
    pod = _pod(
        [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
        resourceClaims=[{"name": "c-gpu", "resourceClaimName": "other"}],
    )
    _, rewritten, _ = rewrite(pod, POLICY)
    assert [c["name"] for c in rewritten["spec"]["resourceClaims"]] == ["c-gpu", "c-gpu-2"]


def test_two_containers_share_a_template_but_not_a_claim() -> None:
    pod = _pod(
        [
            {"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}},
            {"name": "b", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}},
        ]
    )
    _, rewritten, templates = rewrite(pod, POLICY)
    assert len(templates) == 1
    claims = rewritten["spec"]["resourceClaims"]
    assert len({c["name"] for c in claims}) == 2
    assert {c["resourceClaimTemplateName"] for c in claims} == {"draguard-gpu-nvidia-com-1"}


@pytest.mark.parametrize(
    "obj",
    [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {
                "template": {
                    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}
                }
            },
        },
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "cj"},
            "spec": {
                "jobTemplate": {
                    "spec": {
                        "template": {
                            "spec": {
                                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]
                            }
                        }
                    }
                }
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "s"},
            "spec": {
                "template": {
                    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}
                }
            },
        },
    ],
)
def test_every_workload_kind(obj: dict[str, Any]) -> None:
    plan = plan_workload(obj, POLICY)
    assert plan is not None and len(plan.edits) == 1
    assert jsonpatch.apply_patch(obj, plan.patch) == plan.rewritten
    assert all(op["path"].startswith(plan.pod_spec_pointer) for op in plan.patch)


def test_unmapped_resource_is_left_alone() -> None:
    policy = MigrationPolicy(name="p", mappings=(ResourceMapping("nvidia.com/gpu", "gpu.nvidia.com"),))
    pod = _pod([{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.5gb": 1}}}])
    plan = plan_workload(pod, policy)
    assert plan is not None
    assert plan.patch == [] and plan.templates == []
    assert [u.resource for u in plan.unmapped] == ["nvidia.com/mig-1g.5gb"]


def test_bad_count_is_not_rewritten() -> None:
    pod = _pod([{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "lots"}}}])
    plan = plan_workload(pod, POLICY)
    assert plan is not None and plan.patch == []
    assert plan.unmapped[0].bad_count == "lots"


def test_non_workload_and_no_legacy() -> None:
    assert plan_workload({"kind": "ConfigMap"}, POLICY) is None
    patch, rewritten, templates = rewrite({"kind": "ConfigMap", "data": {}}, POLICY)
    assert (patch, templates) == ([], []) and rewritten == {"kind": "ConfigMap", "data": {}}
    assert find_legacy({"containers": [{"name": "c", "resources": {"limits": {"cpu": 1}}}]}, "/spec") == []


def test_v1beta1_templates_are_flat() -> None:
    pod = _pod([{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}])
    _, _, templates = rewrite(pod, POLICY, api_version="resource.k8s.io/v1beta1")
    req = templates[0]["spec"]["spec"]["devices"]["requests"][0]
    assert req["deviceClassName"] == "gpu.nvidia.com" and req["count"] == 1 and "exactly" not in req


def test_mapping_selectors_go_into_the_template_and_name() -> None:
    policy = MigrationPolicy(
        name="p",
        mappings=(
            ResourceMapping(
                "nvidia.com/gpu", "gpu.nvidia.com", selectors=("device.attributes['gpu.nvidia.com'].x == 1",)
            ),
        ),
    )
    pod = _pod([{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}])
    _, _, templates = rewrite(pod, policy)
    name = templates[0]["metadata"]["name"]
    assert name.startswith("draguard-gpu-nvidia-com-1-") and name != "draguard-gpu-nvidia-com-1"
    sel = templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert sel == [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].x == 1"}}]


def test_names_are_dns_safe() -> None:
    long_class = "a" * 300
    name = template_name(long_class, 3)
    assert len(name) <= 253
    label = dns_label("Container_Name." + "x" * 100)
    assert len(label) <= 63 and label == label.lower()
    assert dns_label("x" * 100) != dns_label("x" * 101)


# -- property: any legacy pod rewrites into a consistent DRA pod --------------------------------

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_resources = st.dictionaries(
    st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-3g.20gb", "nvidia.com/mig-1g.5gb", "cpu", "memory"]),
    st.one_of(st.integers(0, 9), st.sampled_from(["1", "2", "500m", "x"])),
    max_size=4,
)
_container = st.fixed_dictionaries(
    {"name": st.text("abcXYZ_-.0123456789", min_size=1, max_size=70)},
    optional={"resources": st.fixed_dictionaries({}, optional={"limits": _resources, "requests": _resources,
                                                               "claims": st.just([{"name": "pre"}])})},
)


@settings(max_examples=200, deadline=None)
@given(
    containers=st.lists(_container, min_size=1, max_size=4),
    init=st.lists(_container, max_size=2),
    existing=st.booleans(),
    h100=st.booleans(),
)
def test_rewrite_is_consistent(
    containers: list[dict[str, Any]], init: list[dict[str, Any]], existing: bool, h100: bool
) -> None:
    spec: dict[str, Any] = {"containers": containers}
    if init:
        spec["initContainers"] = init
    if existing:
        spec["resourceClaims"] = [{"name": "pre", "resourceClaimName": "shared"}]
    if h100:
        spec["nodeSelector"] = H100_LABEL
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}
    original = copy.deepcopy(pod)
    plan = plan_workload(pod, POLICY)
    assert plan is not None and pod == original
    out = jsonpatch.apply_patch(pod, plan.patch)
    assert out == plan.rewritten
    claims = out["spec"].get("resourceClaims", [])
    names = [c["name"] for c in claims]
    assert len(names) == len(set(names))
    assert all(_DNS_LABEL.match(n) and len(n) <= 63 for n in names if n != "pre")
    templates = {t["metadata"]["name"] for t in plan.templates}
    for c in claims:
        assert c.get("resourceClaimTemplateName") in templates or c["name"] == "pre"
    edited = {(e.use.section, e.use.index, e.use.resource) for e in plan.edits}
    for section in ("initContainers", "containers"):
        for i, c in enumerate(out["spec"].get(section, [])):
            res = c.get("resources", {})
            for part in ("limits", "requests"):
                for r in res.get(part, {}):
                    # Only what could not be mapped (bad counts, unmapped MIG profiles) stays behind.
                    assert (section, i, r) not in edited
            for ref in res.get("claims", []):
                assert ref["name"] in names or ref["name"] == "pre"
    count_of: dict[str, int] = {}
    for e in plan.edits:
        if e.claim_name:
            t = next(t for t in plan.templates if t["metadata"]["name"] == e.template)
            request = read_claim_spec(t["spec"]["spec"], t["apiVersion"]).requests[0]
            counts = {alt[3] for alt in request.alternatives()}
            assert len(counts) == 1  # every choice holds as many devices
            count_of[e.claim_name] = counts.pop()
            assert count_of[e.claim_name] == e.count > 0
    for e in plan.edits:
        # Every container sees at least the devices it asked for through the claims it references.
        assert sum(count_of[r] for r in e.refs) >= e.use.count
    # And the pod holds what Kubernetes computes as its effective request, per resource.
    from webhook.dra.workloads import effective_amounts

    for res in {e.use.resource for e in plan.edits}:
        held = sum(e.count for e in plan.edits if e.claim_name and e.use.resource == res)
        mapped = {(e.use.section, e.use.index) for e in plan.edits if e.use.resource == res}
        only = {
            sec: [c if (sec, i) in mapped else {"name": "x"} for i, c in enumerate(spec.get(sec, []))]
            for sec in ("initContainers", "containers")
        }
        assert held == effective_amounts(only, keep=lambda k, r=res: k == r).get(res, 0)


def test_init_container_gpus_are_reused_as_kubernetes_computes_effective_requests() -> None:
    # init needs 1, the app 2: the device plugin gave the pod max(1, 2) = 2 GPUs, not 3.
    pod = _pod(
        [{"name": "app", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 2}}}],
        initContainers=[{"name": "prep", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
    )
    _patch, out, templates = rewrite(pod, POLICY)
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["app-gpu"]
    assert out["spec"]["initContainers"][0]["resources"]["claims"] == [{"name": "app-gpu"}]
    assert [t["metadata"]["name"] for t in templates] == ["draguard-gpu-nvidia-com-2"]
    # init needs 3, the app 1: 3 in all; the init container gets the app's claim plus 2 more.
    pod["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 3
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1
    _patch, out, templates = rewrite(pod, POLICY)
    init_refs = out["spec"]["initContainers"][0]["resources"]["claims"]
    assert init_refs == [{"name": "app-gpu"}, {"name": "prep-gpu"}]
    assert sorted(t["metadata"]["name"] for t in templates) == [
        "draguard-gpu-nvidia-com-1", "draguard-gpu-nvidia-com-2"]  # fmt: skip
    # A restartable (sidecar) init container keeps running beside the app: it adds, like an app container.
    pod["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    _patch, out, _templates = rewrite(pod, POLICY)
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["prep-gpu", "app-gpu"]


def test_zero_count_is_not_a_use() -> None:
    pod = _pod([{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 0}}}])
    assert find_legacy(pod["spec"], "/spec") == []
    assert rewrite(pod, POLICY)[0] == []
