"""The driver's sharing modes as a user turns them on: components/gpu-sharing and components/dynamic-mig.

Each is built with the real kustomize onto every overlay; the flags they add are read back as the
kubelet would start the container ($(VAR) expanded from its env) and handed to the driver's own command
line, and the DaemonSet is held to the same safety checks as without them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest
import test_kustomize_safety as safety
import yaml
from kbundle import BASE, KUSTOMIZE, OVERLAYS, REPO, Obj, build, find, one

from webhook.cli import build_parser

SHARING = ("gpu-sharing",)
MIG = ("dynamic-mig",)
BOTH = ("gpu-sharing", "dynamic-mig")
SIM = REPO / "driver" / "sim" / "topologies"


def _driver(objs: tuple[Obj, ...]) -> Obj:
    ds = one(objs, "DaemonSet", "draguard-driver")
    return ds["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def _expanded_args(container: Obj) -> list[str]:
    """The container's args as the kubelet passes them: $(NAME) replaced by the env value of NAME.

    Only literal values are expanded here (fieldRefs such as NODE_NAME stay as written, as they are
    not what these tests are about); an unknown $(NAME) stays as written, as the kubelet leaves it."""
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return [
        re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), a) for a in container["args"]
    ]


def _parsed(container: Obj) -> Any:
    return build_parser().parse_args(_expanded_args(container))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_without_the_components_every_gpu_is_exclusive(overlay: str) -> None:
    ns = _parsed(_driver(build(overlay)))
    assert ns.share_by_capacity is None and ns.share_memory_step is None and ns.dynamic_mig is False
    assert not [o for o in find(build(overlay), "DeviceClass") if o["metadata"]["name"].endswith("-shared")]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_sharing_sets_the_drivers_flags_from_two_env_values(overlay: str) -> None:
    c = _driver(build(overlay, SHARING))
    plain = _driver(build(overlay))
    # The overlay's own arguments are kept, in order; the sharing flags come after them.
    assert c["args"][: len(plain["args"])] == plain["args"]
    ns = _parsed(c)
    assert (ns.share_by_capacity, ns.share_memory_step, ns.dynamic_mig) == ("all", "1Gi", False)
    assert ns.driver_command == "run"
    # The driver reads the setting as the sharing of every GPU in 1Gi steps.
    from driver.cli import sharing

    policy = sharing(ns)
    assert policy is not None and policy.step == 2**30


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_dynamic_mig_adds_its_flag_and_nothing_else(overlay: str) -> None:
    c = _driver(build(overlay, MIG))
    plain = _driver(build(overlay))
    assert c["args"] == [*plain["args"], "--dynamic-mig"]
    assert c["env"] == plain["env"]
    ns = _parsed(c)
    assert ns.dynamic_mig is True and ns.share_by_capacity is None
    names = {o["metadata"]["name"] for o in build(overlay, MIG)}
    assert names == {o["metadata"]["name"] for o in build(overlay)}


def test_a_users_overlay_narrows_sharing_to_some_models_by_env(tmp_path: Any) -> None:
    """The override the component's header documents: one env entry, no args to rewrite."""
    import os

    (tmp_path / "kustomization.yaml").write_text(
        "resources:\n"
        f"  - {os.path.relpath(KUSTOMIZE / 'overlays' / 'eks', tmp_path)}\n"
        "components:\n"
        f"  - {os.path.relpath(KUSTOMIZE / 'components' / 'gpu-sharing', tmp_path)}\n"
        "patches:\n"
        "  - patch: |-\n"
        "      apiVersion: apps/v1\n"
        "      kind: DaemonSet\n"
        "      metadata: {name: draguard-driver, namespace: draguard-driver}\n"
        "      spec: {template: {spec: {containers: [{name: driver, env: [\n"
        '        {name: DRAGUARD_SHARE_BY_CAPACITY, value: "NVIDIA L4,NVIDIA L40S"}]}]}}}\n'
    )
    from kbundle import run_build

    c = _driver(tuple(run_build(tmp_path)))
    ns = _parsed(c)
    assert ns.share_by_capacity == "NVIDIA L4,NVIDIA L40S" and ns.share_memory_step == "1Gi"
    assert [e["name"] for e in c["env"]].count("DRAGUARD_SHARE_BY_CAPACITY") == 1


@pytest.mark.parametrize(("overlay", "components"), [(o, BOTH) for o in OVERLAYS] + [("eks", SHARING)])
def test_the_driver_daemonset_stays_safe_with_the_components(
    overlay: str, components: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The safety file's own checks, on the build with the components."""
    monkeypatch.setattr(safety, "build", lambda o, c=(): build(o, (*c, *components)))
    safety.test_driver_daemonset_contract(overlay)
    safety.test_every_pod_except_the_driver_is_restricted(overlay)
    safety.test_mounts_match_volumes_and_the_tls_secret(overlay)
    safety.test_rbac_has_no_wildcards_and_secrets_only_by_name(overlay)
    # Same privileges as the base: the modes need no other mount, capability or permission.
    with_c, plain = build(overlay, components), build(overlay)
    ds, ds0 = one(with_c, "DaemonSet", "draguard-driver"), one(plain, "DaemonSet", "draguard-driver")
    spec, spec0 = ds["spec"]["template"]["spec"], ds0["spec"]["template"]["spec"]
    assert spec["volumes"] == spec0["volumes"]
    assert spec["containers"][0]["volumeMounts"] == spec0["containers"][0]["volumeMounts"]
    assert spec["containers"][0]["securityContext"] == spec0["containers"][0]["securityContext"]
    for kind in ("ClusterRole", "Role", "ValidatingAdmissionPolicy"):
        assert find(with_c, kind) == find(plain, kind), kind


def _base_full_gpu_classes() -> dict[str, Obj]:
    docs = yaml.safe_load_all((BASE / "deviceclasses" / "deviceclasses.yaml").read_text())
    return {
        d["metadata"]["name"]: d
        for d in docs
        if d and "type == 'gpu'" in d["spec"]["selectors"][0]["cel"]["expression"]
    }


def _conjuncts(expression: str) -> list[str]:
    return [p.strip() for p in expression.split("&&")]


def test_every_full_gpu_class_has_a_share_class_without_a_sharing_strategy() -> None:
    objs = build("eks", SHARING)
    full = _base_full_gpu_classes()
    assert len(full) >= 10
    shared = {
        o["metadata"]["name"]: o
        for o in find(objs, "DeviceClass")
        if o["metadata"]["name"].endswith("-shared")
    }
    assert set(shared) == {f"{n}-shared" for n in full}
    for name, cls in full.items():
        twin = shared[f"{name}-shared"]
        # The base's classes time-slice whole GPUs; a share is shared already, so its class has no config.
        assert any("sharing" in c["opaque"]["parameters"] for c in cls["spec"].get("config", [])), name
        assert "config" not in twin["spec"], name
        (sel,) = twin["spec"]["selectors"]
        want = _conjuncts(cls["spec"]["selectors"][0]["cel"]["expression"])
        got = _conjuncts(sel["cel"]["expression"])
        assert got[:2] == want[:2], "driver and type are checked first, as in every bundled class"
        assert sorted(got) == sorted([*want, "device.allowMultipleAllocations"]), name
        # Labelled and ordered as the base's classes are (the component's objects miss its transformers).
        base_obj = one(objs, "DeviceClass", name)
        assert twin["metadata"]["labels"] == base_obj["metadata"]["labels"]
        assert twin["metadata"]["annotations"] == base_obj["metadata"]["annotations"]


def _inventory(*flags: str, topology: str) -> list[Obj]:
    proc = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "driver", "inventory", "--sim", str(SIM / topology),
         "--node-name", "node-a", "-o", "json", *flags],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["items"]  # type: ignore[no-any-return]


def _component_flags(components: tuple[str, ...]) -> list[str]:
    """The flags the components add to the local overlay's driver, expanded."""
    plain = _driver(build("local"))["args"]
    return _expanded_args(_driver(build("local", components)))[len(plain) :]


def test_the_drivers_inventory_with_the_bundles_flags_publishes_shares_and_partitions() -> None:
    flags = _component_flags(BOTH)
    assert flags == ["--share-by-capacity", "all", "--share-memory-step", "1Gi", "--dynamic-mig"]
    gpus = [
        d for s in _inventory(*flags, topology="h100-8x-nvlink.yaml") for d in s["spec"].get("devices", [])
    ]
    assert len(gpus) == 8 and all(d.get("allowMultipleAllocations") for d in gpus)
    assert {d["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] for d in gpus} == {"1Gi"}
    slices = _inventory(*flags, topology="a100-2x-dynamic-mig.yaml")
    assert [cs["name"] for s in slices for cs in s["spec"].get("sharedCounters", [])] == [
        "gpu-0-counter-set", "gpu-1-counter-set",
    ]  # fmt: skip
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    # A GPU in MIG mode is partitioned, never shared by capacity, even with both components.
    assert devices and not any(d.get("allowMultipleAllocations") for d in devices)
    assert all(d.get("consumesCounters") for d in devices)


@pytest.mark.parametrize("overlay", ["aks", "local"])
def test_gpu_sharing_adds_share_classes_and_leaves_the_bundles_classes_as_they_are(overlay: str) -> None:
    """The full-GPU classes keep their TimeSlicing config: on a shared GPU the driver applies it to
    whole GPUs only (tests/driver/test_driver_sharing.py), so nothing the bundle had changes."""
    full = _base_full_gpu_classes()
    plain = {o["metadata"]["name"]: o for o in find(build(overlay), "DeviceClass")}
    with_c = {o["metadata"]["name"]: o for o in find(build(overlay, SHARING), "DeviceClass")}
    assert set(with_c) == set(plain) | {f"{n}-shared" for n in full}
    for name, obj in plain.items():
        assert with_c[name] == obj, name
    assert all("config" in plain[n]["spec"] for n in full)


@pytest.mark.parametrize(("overlay", "components"), [("aks", SHARING), ("gke", MIG), ("local", BOTH)])
def test_the_components_objects_match_the_kubernetes_schema(
    overlay: str, components: tuple[str, ...]
) -> None:
    from test_kustomize_schema import schema_errors

    objs = build(overlay, components)
    changed = [o for o in objs if o not in build(overlay)]
    assert changed, "the component changed nothing"
    for obj in changed:
        errs = schema_errors(obj)
        assert not errs, f"{obj['kind']}/{obj['metadata']['name']}:\n" + "\n".join(errs)
