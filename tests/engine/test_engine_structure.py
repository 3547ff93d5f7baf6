"""structure/* rules, each positive and negative."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_helpers import rules, run

from webhook.core.findings import Mode, Severity
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context

ONLY = ("structure",)

CLASSES = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com-h100}
spec:
  selectors:
  - cel:
      expression: >-
        device.driver == 'gpu.nvidia.com' &&
        device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com-a100}
spec:
  selectors:
  - cel:
      expression: >-
        device.driver == 'gpu.nvidia.com' &&
        device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100 80GB PCIe'
---
"""


def claim(requests: str, constraints: str = "", version: str = "v1", ns: str = "team-a") -> str:
    return f"""
apiVersion: resource.k8s.io/{version}
kind: ResourceClaim
metadata: {{name: c, namespace: {ns}}}
spec:
  devices:
    requests:
{requests}
{constraints}
"""


def pod(claims: str, containers: str) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: p, namespace: team-a}}
spec:
  containers:
{containers}
  resourceClaims:
{claims}
"""


# -- inline-source ---------------------------------------------------------------------------


def test_inline_source_with_a_template_name_is_moved_up() -> None:
    text = pod(
        "  - name: g\n    source: {resourceClaimTemplateName: t}",
        "  - name: c\n    image: x\n    resources: {claims: [{name: g}]}",
    )
    r = run(text, modules=ONLY)
    (f,) = [f for f in r.findings if f.rule == "structure/inline-source"]
    assert f.severity is Severity.ERROR and f.mode is Mode.ENFORCE
    assert "resourceClaimTemplateName: t" in f.fix and f.generated == ()
    assert f.line == 12  # the `source:` line


def test_new_style_claim_reference_is_clean() -> None:
    text = pod(
        "  - name: g\n    resourceClaimTemplateName: t",
        "  - name: c\n    image: x\n    resources: {claims: [{name: g}]}",
    )
    assert rules(run(text, modules=ONLY)) == []


def test_inline_source_template_uses_newest_served_version() -> None:
    text = pod(
        "  - name: g\n    source:\n      devices:\n"
        "        requests: [{name: gpu, deviceClassName: x, count: 2}]",
        "  - name: c\n    image: x\n    resources: {claims: [{name: g}]}",
    )
    r = run(text, modules=ONLY, ctx=Context(served_versions=frozenset({"v1beta1"})))
    (f,) = r.findings
    (t,) = f.generated
    assert t["apiVersion"] == "resource.k8s.io/v1beta1"
    assert t["spec"]["spec"]["devices"]["requests"] == [{"name": "gpu", "deviceClassName": "x", "count": 2}]
    assert (
        t["metadata"]["name"] == "p-g"
        and t["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "draguard"
    )


# -- undeclared-claim ------------------------------------------------------------------------


def test_container_claim_not_declared_is_an_error() -> None:
    text = pod(
        "  - name: g\n    resourceClaimTemplateName: t",
        "  - name: c\n    image: x\n    resources: {claims: [{name: g}, {name: typo}]}",
    )
    r = run(text, modules=ONLY)
    (f,) = r.findings
    assert f.rule == "structure/undeclared-claim" and f.mode is Mode.ENFORCE and "'typo'" in f.message
    assert f.line == 9  # the container's `resources: {claims: ...}` line


def test_declared_but_unused_claim_is_a_warning() -> None:
    text = pod(
        "  - name: g\n    resourceClaimTemplateName: t\n  - name: spare\n    resourceClaimName: s",
        "  - name: c\n    image: x\n    resources: {claims: [{name: g}]}",
    )
    (f,) = run(text, modules=ONLY).findings
    assert f.rule == "structure/undeclared-claim" and f.mode is Mode.WARN and "'spare'" in f.message


def test_container_request_name_must_exist_in_the_resolved_claim() -> None:
    text = (
        claim("    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-h100}")
        + "---\n"
        + pod(
            "  - name: g\n    resourceClaimName: c",
            "  - name: a\n    image: x\n    resources: {claims: [{name: g, request: gpu}]}\n"
            "  - name: b\n    image: x\n    resources: {claims: [{name: g, request: nope}]}",
        )
    )
    (f,) = run(text, modules=ONLY).findings
    assert f.rule == "structure/undeclared-claim" and "'nope'" in f.message and "gpu" in f.fix


# -- deprecated-version ----------------------------------------------------------------------


def test_beta_version_where_v1_is_served_warns_with_the_v1_shape() -> None:
    text = claim(
        "    - name: gpu\n      deviceClassName: gpu.nvidia.com-h100\n      count: 1", version="v1beta1"
    )
    (f,) = run(text, modules=ONLY).findings
    assert f.rule == "structure/deprecated-version" and f.mode is Mode.WARN
    assert "exactly:" in f.fix and "resource.k8s.io/v1" in f.fix and f.line == 2


def test_version_not_served_is_an_error_and_v1_is_clean() -> None:
    text = claim("    - name: gpu\n      deviceClassName: gpu.nvidia.com-h100", version="v1beta1")
    (f,) = run(text, modules=ONLY, ctx=Context(served_versions=frozenset({"v1"}))).findings
    assert f.mode is Mode.ENFORCE
    assert (
        run(
            claim("    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-h100}"), modules=ONLY
        ).findings
        == []
    )


def test_v1beta2_when_only_betas_are_served_is_clean() -> None:
    text = claim("    - name: gpu\n      exactly: {deviceClassName: x}", version="v1beta2")
    assert (
        run(text, modules=ONLY, ctx=Context(served_versions=frozenset({"v1beta1", "v1beta2"}))).findings == []
    )


# -- unsatisfiable ---------------------------------------------------------------------------


def test_count_above_any_node_is_unsatisfiable(seed_inventory: Inventory) -> None:
    text = CLASSES + claim(
        "    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-a100, count: 6}",
        "    constraints: [{requests: [gpu], matchAttribute: gpu.nvidia.com/nvlinkDomain}]",
    )
    r = run(text, modules=ONLY, inventory=seed_inventory)
    (f,) = [f for f in r.findings if f.rule == "structure/unsatisfiable"]
    assert "needs 6" in f.message and "the most any node has is 4 (node1)" in f.message
    # MIG devices inherit the parent's productName, so a productName-only class matches them too.
    assert "8 matching device(s)" in f.message


def test_count_that_fits_a_node_is_fine(seed_inventory: Inventory) -> None:
    text = CLASSES + claim(
        "    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-h100, count: 8}",
        "    constraints: [{requests: [gpu], matchAttribute: gpu.nvidia.com/nvlinkDomain}]",
    )
    assert rules(run(text, modules=ONLY, inventory=seed_inventory)) == []


def test_first_available_is_unsatisfiable_only_if_every_alternative_is(seed_inventory: Inventory) -> None:
    ok = CLASSES + claim(
        "    - name: gpu\n      firstAvailable:\n"
        "      - {name: a, deviceClassName: gpu.nvidia.com-a100, count: 16}\n"
        "      - {name: b, deviceClassName: gpu.nvidia.com-a100, count: 1}",
        "    constraints: [{matchAttribute: gpu.nvidia.com/nvlinkDomain}]",
    )
    assert rules(run(ok, modules=ONLY, inventory=seed_inventory)) == []
    bad = CLASSES + claim(
        "    - name: gpu\n      firstAvailable:\n"
        "      - {name: a, deviceClassName: gpu.nvidia.com-a100, count: 16}\n"
        "      - {name: b, deviceClassName: missing-class, count: 1}",
        "    constraints: [{matchAttribute: gpu.nvidia.com/nvlinkDomain}]",
    )
    # Without the cluster's class list a missing class cannot be judged...
    assert rules(run(bad, modules=ONLY, inventory=seed_inventory)) == []
    # ...with it, both alternatives fail.
    inv = seed_inventory.merged(
        Inventory.from_objects(
            [
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": "other"},
                    "spec": {},
                }
            ]
        )
    )
    (f,) = run(bad, modules=ONLY, inventory=inv).findings
    assert f.rule == "structure/unsatisfiable" and "missing-class does not exist" in f.message


def test_unknown_class_with_class_inventory_is_unsatisfiable(seed_inventory: Inventory) -> None:
    inv = seed_inventory.merged(
        Inventory.from_objects(
            [
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": "gpu.nvidia.com-a100"},
                    "spec": {},
                }
            ]
        )
    )
    text = claim("    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-b200}")
    (f,) = run(text, modules=ONLY, inventory=inv).findings
    assert "DeviceClass gpu.nvidia.com-b200 does not exist" in f.message


def test_no_inventory_means_no_unsatisfiable_verdict() -> None:
    text = CLASSES + claim("    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-a100, count: 1}")
    assert rules(run(text, modules=ONLY)) == []


# -- interconnect ----------------------------------------------------------------------------


def test_multi_gpu_without_interconnect_constraint_warns() -> None:
    text = claim("    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-h100, count: 4}")
    (f,) = run(text, modules=ONLY).findings
    assert f.rule == "structure/interconnect" and f.mode is Mode.WARN
    assert "matchAttribute: gpu.nvidia.com/nvlinkDomain" in f.fix


def test_multi_gpu_with_nvlink_domain_and_single_gpu_and_mig_are_clean() -> None:
    good = claim(
        "    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-h100, count: 4}",
        "    constraints: [{matchAttribute: gpu.nvidia.com/nvlinkDomain}]",
    )
    one = claim("    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-h100}")
    mig = claim("    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-a100-mig-3g20gb, count: 2}")
    for text in (good, one, mig):
        assert rules(run(text, modules=ONLY)) == []


def test_constraint_on_unpublished_attribute_is_an_error(seed_inventory: Inventory) -> None:
    text = claim(
        "    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-h100, count: 2}",
        "    constraints: [{matchAttribute: gpu.nvidia.com/productName}, {matchAttribute: example.com/rack}]",
    )
    (f,) = run(text, modules=ONLY, inventory=seed_inventory).findings
    assert f.rule == "structure/interconnect" and f.mode is Mode.ENFORCE and "example.com/rack" in f.message


def test_constraint_without_domain_is_an_error() -> None:
    text = claim(
        "    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-h100}",
        "    constraints: [{matchAttribute: nvlinkDomain}]",
    )
    (f,) = run(text, modules=ONLY).findings
    assert f.rule == "structure/interconnect" and "gpu.nvidia.com/nvlinkDomain" in f.fix


# -- admin-access ----------------------------------------------------------------------------

ADMIN = "    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com-h100, adminAccess: true}"


def test_admin_access_in_unlabelled_namespace_is_denied() -> None:
    ctx = Context(namespace_labels={"team-a": {"kubernetes.io/metadata.name": "team-a"}})
    (f,) = run(claim(ADMIN), modules=ONLY, ctx=ctx).findings
    assert f.rule == "structure/admin-access" and f.mode is Mode.ENFORCE and f.line == 9


def test_admin_access_in_labelled_namespace_is_allowed_and_recorded() -> None:
    ctx = Context(namespace_labels={"team-a": {"resource.kubernetes.io/admin-access": "true"}})
    (f,) = run(claim(ADMIN), modules=ONLY, ctx=ctx).findings
    # Nothing to deny or warn about: the audit lists who can reach devices other pods use.
    assert f.rule == "structure/admin-access" and f.mode is Mode.AUDIT and f.severity is Severity.INFO
    assert "can reach devices other pods are using" in f.message


def test_admin_access_with_unknown_labels_warns() -> None:
    (f,) = run(claim(ADMIN), modules=ONLY).findings
    assert f.rule == "structure/admin-access" and f.mode is Mode.WARN


def test_alpha_versions_of_claims_are_no_longer_served() -> None:
    text = claim("    - name: gpu\n      deviceClassName: gpu.nvidia.com-h100", version="v1alpha2")
    (f,) = run(text, modules=ONLY).findings
    assert f.rule == "structure/deprecated-version" and f.mode is Mode.ENFORCE and "v1alpha2" in f.message
    taint_rule = (
        "apiVersion: resource.k8s.io/v1alpha3\nkind: DeviceTaintRule\nmetadata: {name: t}\nspec: {}\n"
    )
    assert run(taint_rule, modules=ONLY).findings == []


def _pointer_target(obj: Any, pointer: str) -> Any:
    """What an RFC 6901 pointer reaches: through mappings and lists only, None where it stops."""
    cur: Any = obj
    for tok in pointer.split("/")[1:]:
        tok = tok.replace("~1", "/").replace("~0", "~")
        if isinstance(cur, Mapping):
            cur = cur.get(tok)
        elif isinstance(cur, list) and tok.isdigit() and int(tok) < len(cur):
            cur = cur[int(tok)]
        else:
            return None
    return cur


def test_claim_entries_read_on_the_way_are_what_the_pointer_reaches() -> None:
    """structure/undeclared-claim reads each container claim entry while listing them; that entry is
    the one its JSON pointer names, for parsed JSON and for other container types alike."""
    from types import MappingProxyType

    from webhook.engine.resolve import claim_refs

    entry = {"name": "gpu", "request": "a"}
    shapes = [
        {"containers": [{"resources": {"claims": [entry, {"name": "x"}]}}], "initContainers": [
            {"resources": {"claims": [{"name": "i", "request": "b"}]}}]},
        {"containers": ({"resources": {"claims": [entry]}},)},  # a tuple: the pointer walk stops there
        {"containers": [{"resources": {"claims": (entry,)}}]},
        {"containers": [MappingProxyType({"resources": MappingProxyType({"claims": [entry]})})]},
        {"containers": [{"resources": {"claims": [entry, "junk", {"name": 5}]}}, "junk"]},
    ]
    pp = "/spec/template/spec"
    gpu = [("gpu", f"{pp}/containers/0/resources/claims/0")]
    expected = [
        [
            ("i", f"{pp}/initContainers/0/resources/claims/0"),
            *gpu,
            ("x", f"{pp}/containers/0/resources/claims/1"),
        ],
        gpu, gpu, gpu, gpu,
    ]
    for spec, names in zip(shapes, expected, strict=True):
        refs = claim_refs(spec, pp)
        assert [(n, p) for n, p, _r in refs] == names
        for _n, ptr, ref in refs:
            assert ref is _pointer_target(spec, ptr.removeprefix(pp)), (spec, ptr)
    assert claim_refs(shapes[1], "")[0][2] is None
    assert claim_refs(shapes[0], "")[1][2] is entry  # initContainers come first
