"""Every overlay and every component builds with the real kustomize, and the output is well formed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kbundle import (
    BASE,
    COMPONENTS,
    KUSTOMIZE,
    OVERLAYS,
    REPO,
    BuildError,
    build,
    containers,
    find,
    one,
    run_build,
)

IMAGE = "ghcr.io/draguard/draguard:0.1.0"
VARIANTS = (
    [(o, ()) for o in ("base", *OVERLAYS)]
    + [
        (o, (c,))
        for o in ("aks", "gke", "eks")
        for c in (
            "cert-manager", "monitoring", "fail-open-validation", "network-policy", "apiserver-client-auth",
            "enforce-without-webhook",
        )
    ]
    + [
        ("eks", ("eks-host-network",)),
        ("aks", ("cert-manager", "monitoring", "fail-open-validation")),
        ("local", ("monitoring",)),
        ("aks", ("gpu-sharing",)),
        ("gke", ("dynamic-mig",)),
        ("local", ("gpu-sharing", "dynamic-mig")),
    ]
)


@pytest.mark.parametrize(
    ("overlay", "components"), VARIANTS, ids=lambda v: "+".join(v) if isinstance(v, tuple) else v
)
def test_variant_builds_to_named_unique_objects(overlay: str, components: tuple[str, ...]) -> None:
    objs = build(overlay, components)
    assert objs, "empty build"
    seen = set()
    for o in objs:
        assert o.get("apiVersion") and o.get("kind") and o.get("metadata", {}).get("name"), o
        key = (
            o["apiVersion"].split("/")[0],
            o["kind"],
            o["metadata"].get("namespace"),
            o["metadata"]["name"],
        )
        assert key not in seen, f"duplicate object {key}"
        seen.add(key)


def test_every_component_is_exercised_by_some_variant() -> None:
    used = {c for _, cs in VARIANTS for c in cs} | {"gke-webhook-port-443"}  # the gke overlay includes it
    assert used == set(COMPONENTS)
    assert sorted(p.name for p in (KUSTOMIZE / "components").iterdir() if p.is_dir()) == sorted(COMPONENTS)
    assert sorted(p.name for p in (KUSTOMIZE / "overlays").iterdir() if p.is_dir()) == sorted(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_namespaced_objects_live_in_draguard_system(overlay: str) -> None:
    for o in build(overlay):
        if o["kind"] in {
            "Namespace",
            "ClusterRole",
            "ClusterRoleBinding",
            "DeviceClass",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "CustomResourceDefinition",
        }:
            assert "namespace" not in o["metadata"], o["metadata"]
        elif o["metadata"]["name"] == "draguard-webhook-quota-ledger":
            # The quota ledgers' namespace: the webhook's ConfigMap rights reach nothing else.
            assert o["metadata"].get("namespace") == "draguard-quota", (o["kind"], o["metadata"])
        elif o["metadata"]["name"] == "draguard-driver":
            # The driver alone runs in the Pod Security `privileged` namespace.
            assert o["metadata"].get("namespace") == "draguard-driver", (o["kind"], o["metadata"])
        elif o["kind"] == "ResourceQuota":
            # GKE's quota for critical-priority pods: one in each namespace that runs such pods.
            assert o["metadata"].get("namespace") in {"draguard-system", "draguard-driver"}, o["metadata"]
        else:
            assert o["metadata"].get("namespace") == "draguard-system", (o["kind"], o["metadata"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_all_containers_run_the_project_image(overlay: str) -> None:
    ctrs = [c for o in build(overlay) for c in containers(o)]
    assert ctrs
    assert {c["image"] for c in ctrs} == {IMAGE}


def test_images_are_set_through_kustomize_images(tmp_path: Path) -> None:
    """A user pins another tag or registry with `images:` and every container follows."""
    import os

    (tmp_path / "kustomization.yaml").write_text(
        "resources:\n"
        f"  - {os.path.relpath(KUSTOMIZE / 'overlays' / 'eks', tmp_path)}\n"
        "images:\n"
        "  - name: ghcr.io/draguard/draguard\n"
        "    newName: registry.example.com/mirror/draguard\n"
        "    newTag: 0.1.1\n"
    )
    objs = run_build(tmp_path)
    images = {c["image"] for o in objs for c in containers(o)}
    assert images == {"registry.example.com/mirror/draguard:0.1.1"}
    base_kust = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert {"name": "ghcr.io/draguard/draguard", "newTag": "0.1.0"} in base_kust["images"]


def test_policies_configmap_matches_policies_directory() -> None:
    """ConfigMap draguard-policies carries exactly policies/*.yaml, byte for byte."""
    cm = find(build("base"), "ConfigMap")
    cm = [c for c in cm if c["metadata"]["name"].startswith("draguard-policies-")]
    assert len(cm) == 1, "configMapGenerator should produce one hashed draguard-policies ConfigMap"
    want = {p.name: p.read_text() for p in sorted((REPO / "policies").glob("*.yaml"))}
    have = cm[0].get("data", {})
    assert sorted(have) == sorted(want), (
        "kustomize/base/policies is out of sync with policies/; run: python kustomize/sync-policies.py"
    )
    for name, text in want.items():
        assert have[name] == text, f"{name} differs; run: python kustomize/sync-policies.py"
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                assert doc.get("apiVersion") == "policy.draguard.io/v1alpha1", (
                    f"{name}: {doc.get('apiVersion')}"
                )


def test_sync_policies_check_reports_a_stale_copy(tmp_path: Path) -> None:
    """The sync tool's --check agrees with the tree now, and names the file when a copy goes stale."""
    script = KUSTOMIZE / "sync-policies.py"
    ok = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    # Same tool on a scratch copy of the tree layout, with one policy edited after syncing.
    (tmp_path / "policies").mkdir()
    (tmp_path / "kustomize" / "base" / "policies").mkdir(parents=True)
    (tmp_path / "kustomize" / "sync-policies.py").write_text(script.read_text())
    (tmp_path / "policies" / "tiers.yaml").write_text(
        "apiVersion: policy.draguard.io/v1alpha1\nkind: GpuTierPolicy\n"
    )
    tool = [sys.executable, str(tmp_path / "kustomize" / "sync-policies.py")]
    assert subprocess.run(tool, capture_output=True, check=False).returncode == 0
    assert subprocess.run([*tool, "--check"], capture_output=True, check=False).returncode == 0
    (tmp_path / "policies" / "tiers.yaml").write_text(
        "apiVersion: policy.draguard.io/v1alpha1\nkind: GpuQuotaPolicy\n"
    )
    stale = subprocess.run([*tool, "--check"], capture_output=True, text=True, check=False)
    assert stale.returncode == 1
    assert "kustomize/base/policies/tiers.yaml" in stale.stderr
    (tmp_path / "policies" / "tiers.yaml").unlink()
    gone = subprocess.run([*tool, "--check"], capture_output=True, text=True, check=False)
    assert gone.returncode == 1 and "stale copy" in gone.stderr and "generator list" in gone.stderr


def test_webhook_mounts_the_generated_policies_configmap() -> None:
    objs = build("base")
    dep = one(objs, "Deployment", "draguard-webhook")
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    cm_name = vols["policies"]["configMap"]["name"]
    assert cm_name.startswith("draguard-policies-"), "hash suffix makes a policy change roll the pods"
    assert find(objs, "ConfigMap", cm_name)
    mounts = {
        m["name"]: m["mountPath"] for m in dep["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    assert mounts["policies"] == "/etc/draguard/policies"
    assert mounts["tls"] == "/etc/draguard/tls"


def test_a_broken_kustomization_fails_loudly(tmp_path: Path) -> None:
    """The build helper surfaces kustomize's error instead of returning an empty bundle."""
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - does-not-exist.yaml\n")
    with pytest.raises(BuildError, match="does-not-exist"):
        run_build(tmp_path)


def test_generated_configmap_loads_as_mounted(tmp_path: Path) -> None:
    """Lay the ConfigMap out the way the kubelet mounts it (timestamped dir, `..data` link, one link per
    key) and load it with the loader `draguard serve --policies /etc/draguard/policies` uses."""
    import os

    load = pytest.importorskip("webhook.policy.load")
    cm = next(
        c for c in find(build("base"), "ConfigMap") if c["metadata"]["name"].startswith("draguard-policies-")
    )
    data = cm.get("data", {})
    if not data:
        pytest.skip("policies/ holds no policy yet")
    stamp = tmp_path / "..2026_01_01_00_00_00.000000001"
    stamp.mkdir()
    for key, text in data.items():
        (stamp / key).write_text(text)
    os.symlink(stamp.name, tmp_path / "..data")
    for key in data:
        os.symlink(f"..data/{key}", tmp_path / key)
    policies = load.load_policies(tmp_path)
    direct = load.load_policies(REPO / "policies")
    # Same policies, same order; only the source paths differ.
    assert repr(policies).replace(str(tmp_path), "<dir>") == repr(direct).replace(
        str(REPO / "policies"), "<dir>"
    )
