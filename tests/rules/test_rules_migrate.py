"""`migrate/legacy-gpu` through evaluate(): every mode, both strategies, label override, lines."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from webhook.core.findings import Finding, Mode, Severity
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.model import (
    MigrationMode,
    MigrationPolicy,
    MigrationStrategy,
    NamespaceScope,
    PolicySet,
    ResourceMapping,
)

RULE = "migrate/legacy-gpu"


def _policy(**kw: Any) -> PolicySet:
    base: dict[str, Any] = {
        "name": "legacy",
        "mappings": (
            ResourceMapping("nvidia.com/gpu", "gpu.nvidia.com"),
            ResourceMapping("nvidia.com/mig-3g.20gb", "a100-mig-3g20gb"),
        ),
    }
    base.update(kw)
    return PolicySet(migration=(MigrationPolicy(**base),))


def _run(
    objs: list[SourceObject], policies: PolicySet, inventory: Inventory | None = None, **ctx: Any
) -> list[Finding]:
    report = evaluate(
        objs, policies, inventory or Inventory.empty(), Context(**ctx), rule_modules=("migrate",)
    )
    return [f for f in report.findings if f.rule == RULE]


def _in_ns(obj: dict[str, Any], ns: str) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "namespace": ns}}


@pytest.mark.parametrize(
    ("mode", "want_mode", "want_sev", "patched"),
    [
        (MigrationMode.OBSERVE, Mode.AUDIT, Severity.INFO, False),
        (MigrationMode.WARN, Mode.WARN, Severity.WARNING, False),
        (MigrationMode.MIGRATE, Mode.WARN, Severity.WARNING, True),
        (MigrationMode.ENFORCE, Mode.ENFORCE, Severity.ERROR, False),
    ],
)
def test_modes_on_seed_pod(
    legacy_pod: dict[str, Any], mode: MigrationMode, want_mode: Mode, want_sev: Severity, patched: bool
) -> None:
    findings = _run([SourceObject(legacy_pod)], _policy(default_mode=mode))
    assert len(findings) == 1
    f = findings[0]
    assert (f.mode, f.severity) == (want_mode, want_sev)
    assert "nvidia.com/gpu: 2" in f.message
    assert (f.patch is not None) is patched
    assert bool(f.generated) is patched
    if mode is MigrationMode.ENFORCE:
        # The deny message carries the rewrite.
        assert "draguard-gpu-nvidia-com-2" in f.message and "resourceClaimTemplateName" in f.message
    if patched:
        assert f.patch is not None
        out = jsonpatch.apply_patch(legacy_pod, f.patch)
        assert "limits" not in out["spec"]["containers"][0]["resources"]
        assert (
            out["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
            == f.generated[0]["metadata"]["name"]
        )
        assert f.generated[0]["metadata"]["namespace"] == "default"


def test_namespace_mode_and_label_override(legacy_pod: dict[str, Any]) -> None:
    pols = _policy(default_mode=MigrationMode.OBSERVE, namespaces={"ml-*": MigrationMode.ENFORCE})
    assert _run([SourceObject(_in_ns(legacy_pod, "ml-a"))], pols)[0].mode is Mode.ENFORCE
    assert _run([SourceObject(_in_ns(legacy_pod, "web"))], pols)[0].mode is Mode.AUDIT
    # The namespace label wins over the policy's namespace list.
    labels = {"ml-a": {"draguard.io/migration-mode": "migrate"}}
    f = _run([SourceObject(_in_ns(legacy_pod, "ml-a"))], pols, namespace_labels=labels)[0]
    assert f.mode is Mode.WARN and f.patch
    assert f.generated[0]["metadata"]["namespace"] == "ml-a"


def test_no_policy_or_out_of_scope_means_no_finding(legacy_pod: dict[str, Any]) -> None:
    assert _run([SourceObject(legacy_pod)], PolicySet.empty()) == []
    scoped = _policy(scope=NamespaceScope(namespaces=("prod-*",)))
    assert _run([SourceObject(legacy_pod)], scoped) == []


def test_dra_workload_is_clean(seed_deployment: list[dict[str, Any]]) -> None:
    assert _run([SourceObject(o) for o in seed_deployment], _policy(default_mode=MigrationMode.ENFORCE)) == []


def test_line_points_at_the_limit(sources: Callable[[Path], list[SourceObject]], seed_dir: Path) -> None:
    objs = sources(seed_dir / "legacy-pod.yaml")
    f = _run(objs, _policy())[0]
    assert f.file is not None and f.file.endswith("legacy-pod.yaml")
    assert f.line == 11  # `nvidia.com/gpu: 2`


def test_unmapped_resource_warns_without_patch() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.5gb": 1}}}]},
    }
    f = _run([SourceObject(pod)], _policy(default_mode=MigrationMode.MIGRATE))[0]
    assert f.patch is None and "no mapping for nvidia.com/mig-1g.5gb" in f.message
    assert "MigrationPolicy legacy" in f.fix


def test_pod_update_is_not_patched(legacy_pod: dict[str, Any]) -> None:
    f = _run([SourceObject(legacy_pod)], _policy(default_mode=MigrationMode.MIGRATE), operation="UPDATE")[0]
    assert f.patch is None and "cannot be rewritten in place" in f.message


def test_deployment_patch_applies_in_migrate_mode() -> None:
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ml"},
        "spec": {
            "replicas": 3,
            "template": {
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "containers": [
                        {"name": "srv", "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}}}
                    ],
                }
            },
        },
    }
    pols = _policy(
        default_mode=MigrationMode.MIGRATE,
        mappings=(
            ResourceMapping("nvidia.com/gpu", "gpu.nvidia.com"),
            ResourceMapping(
                "nvidia.com/gpu", "gpu.nvidia.com-h100", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
            ),
        ),
    )
    f = _run([SourceObject(dep)], pols, operation="UPDATE")[0]
    assert f.patch is not None
    out = jsonpatch.apply_patch(dep, f.patch)
    assert out["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"memory": "8Gi"}
    tmpl = f.generated[0]
    assert tmpl["metadata"]["name"] == "draguard-gpu-nvidia-com-h100-1"
    assert (
        tmpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com-h100"
    )


def test_claim_version_follows_served_versions(legacy_pod: dict[str, Any]) -> None:
    pols = _policy(default_mode=MigrationMode.MIGRATE)
    f = _run([SourceObject(legacy_pod)], pols, served_versions=frozenset({"v1beta1"}))[0]
    t = f.generated[0]
    assert t["apiVersion"] == "resource.k8s.io/v1beta1"
    assert t["spec"]["spec"]["devices"]["requests"][0]["deviceClassName"] == "gpu.nvidia.com"


def test_extended_resource_strategy(legacy_pod: dict[str, Any], inventory: Inventory) -> None:
    pols = _policy(strategy=MigrationStrategy.EXTENDED_RESOURCE, default_mode=MigrationMode.ENFORCE)
    # The fixture inventory has DeviceClass gpu.nvidia.com with extendedResourceName nvidia.com/gpu.
    assert _run([SourceObject(legacy_pod)], pols, inventory) == []
    findings = _run([SourceObject(legacy_pod)], pols)
    assert len(findings) == 1
    f = findings[0]
    assert f.mode is Mode.ENFORCE and f.patch is None
    assert "extendedResourceName: nvidia.com/gpu" in f.message
    assert "DeviceClass gpu.nvidia.com" in f.fix
    # A class in the input set serves it too.
    dc = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpus"},
        "spec": {"extendedResourceName": "nvidia.com/gpu"},
    }
    assert _run([SourceObject(legacy_pod), SourceObject(dc)], pols) == []


def test_extended_resource_name_clash_warns(legacy_pod: dict[str, Any]) -> None:
    pols = _policy(strategy=MigrationStrategy.EXTENDED_RESOURCE, default_mode=MigrationMode.ENFORCE)
    dcs = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": n},
            "spec": {"extendedResourceName": "nvidia.com/gpu"},
        }
        for n in ("a", "b")
    ]
    findings = _run([SourceObject(legacy_pod), *(SourceObject(d) for d in dcs)], pols)
    assert len(findings) == 1 and findings[0].mode is Mode.WARN
    assert "a, b" in findings[0].message


def test_malformed_workloads_never_raise() -> None:
    bad = [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": "nope"}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": ["nvidia.com/gpu"]}}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": True}}}]},
        },
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": "x", "spec": {"template": None}},
    ]
    findings = _run([SourceObject(o) for o in bad], _policy(default_mode=MigrationMode.MIGRATE))
    assert not [f for f in findings if f.rule.startswith("internal/")]
    # The boolean count is reported, not patched.
    assert len(findings) == 1 and findings[0].patch is None and "True" in findings[0].message


def test_every_shipped_mig_class_is_a_migration_target() -> None:
    """The bundle's MIG DeviceClasses and the shipped MigrationPolicy agree: each profile the bundle
    has a class for is rewritten automatically (no 'no mapping' finding), to a shipped class."""
    import re as _re
    from pathlib import Path as _Path

    import yaml as _yaml

    from webhook.engine.migration import rewrite
    from webhook.policy.load import load_policies

    root = _Path(__file__).resolve().parents[2]
    bundle = (root / "kustomize/base/deviceclasses/deviceclasses.yaml").read_text()
    classes = [d for d in _yaml.safe_load_all(bundle) if d and d.get("kind") == "DeviceClass"]
    names = {d["metadata"]["name"] for d in classes}
    profiles = set()
    for d in classes:
        for sel in d["spec"].get("selectors", []):
            expr = sel["cel"]["expression"]
            profiles.update(_re.findall(r"profile'?\]?\s*==\s*'([0-9]+g\.[0-9]+gb)'", expr))
    assert len(profiles) >= 6, profiles
    (policy,) = load_policies(root / "policies").migration
    for profile in sorted(profiles):
        resource = f"nvidia.com/mig-{profile}"
        mapping = policy.mapping_for(resource, {})
        assert mapping is not None, f"{resource} has no mapping in policies/migration.yaml"
        assert mapping.device_class in names
        container = {"name": "c", "image": "x", "resources": {"limits": {resource: 1}}}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
               "spec": {"containers": [container]}}  # fmt: skip
        _patch, _out, templates = rewrite(pod, policy)
        got = [t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] for t in templates]
        assert got == [mapping.device_class]


def test_rewrite_picks_a_class_the_tier_policy_allows() -> None:
    """A vLLM pod with nvidia.com/gpu in a migrate namespace: the default mapping (A100) would be
    patched in by /mutate and then denied by /validate's tier rule; the rewrite picks H100."""
    from pathlib import Path as _Path

    import jsonpatch as _jsonpatch

    from webhook.core.source import SourceObject as _Source
    from webhook.dra.inventory import Inventory as _Inventory
    from webhook.engine.context import Context as _Context
    from webhook.engine.evaluate import evaluate as _evaluate
    from webhook.policy.load import load_policies

    policies = load_policies(_Path(__file__).resolve().parents[2] / "policies")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chat", "namespace": "moving"},
           "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.6.0",
                                    "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}  # fmt: skip
    ctx = _Context(namespace_labels={"moving": {"draguard.io/migration-mode": "migrate"}}, admission=True)
    report = _evaluate([_Source(pod)], policies, _Inventory.empty(), ctx)
    (mig,) = [f for f in report.findings if f.rule == "migrate/legacy-gpu"]
    assert mig.patch and [g["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
                          for g in mig.generated] == ["gpu.nvidia.com-h100"]  # fmt: skip
    # What /mutate sends is then allowed by /validate: no tier finding on the patched pod.
    patched = _jsonpatch.apply_patch(pod, mig.patch)
    inputs = [_Source(patched), *(_Source(g) for g in mig.generated)]
    after = _evaluate(inputs, policies, _Inventory.empty(), ctx)
    assert not [f for f in after.findings if f.rule.startswith("tier/")], after.findings
    # A training job keeps the default A100 mapping (the tier policy allows it).
    job = {**pod, "spec": {"containers": [{"name": "t", "image": "x", "command": ["torchrun", "t.py"],
                                           "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}  # fmt: skip
    (mig2,) = [f for f in _evaluate([_Source(job)], policies, _Inventory.empty(), ctx).findings
               if f.rule == "migrate/legacy-gpu"]  # fmt: skip
    assert [g["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
            for g in mig2.generated] == ["gpu.nvidia.com-a100"]  # fmt: skip
