"""The CEL in the bundle compiles and does what it says.

* matchConditions: compiled with cel_expr_python with `object`, `oldObject` and `request` as DYN (the
  API server types them the same way for webhooks) and evaluated on objects of every matched kind:
  GPU objects reach the webhook, others do not, and no input makes a condition error (an error counts as
  a webhook failure, i.e. a rejection under failurePolicy Fail).
* DeviceClass selectors: evaluated on the devices the bundled driver builds from its simulated
  topologies (driver.devices.build_devices), and checked against the driver's published schema.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from kbundle import REPO, build, find, webhook_configs

cel = pytest.importorskip("cel_expr_python.cel")

D = cel.Type.DYN
ENV = cel.NewEnv(variables={"object": D, "oldObject": D, "request": D})
DEVICE_ENV = cel.NewEnv(variables={"device": D})


def _eval(expr: Any, data: dict[str, Any]) -> bool:
    v = expr.eval(data=data)
    assert v.type().name() == "BOOL", f"evaluated to {v.type().name()}: {v.value()}"
    return bool(v.value())


def _pod(containers: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"containers": containers or [{"name": "main", "image": "busybox"}]}
    s.update(spec)
    return s


GPU = "nvidia.com/gpu"
POSITIVE = {
    "limit nvidia.com/gpu": _pod([{"name": "a", "resources": {"limits": {GPU: "2"}}}]),
    "request MIG resource": _pod([{"name": "a", "resources": {"requests": {"nvidia.com/mig-1g.5gb": "1"}}}]),
    "second container only": _pod(
        [{"name": "a"}, {"name": "b", "resources": {"limits": {"cpu": "1", GPU: "1"}}}]
    ),
    "init container only": _pod(
        [{"name": "a"}], initContainers=[{"name": "i", "resources": {"limits": {GPU: "1"}}}]
    ),
}
# Objects already on DRA claims: /validate checks them, /mutate has nothing to rewrite in them.
CLAIMS_ONLY = {
    "pod resourceClaims": _pod(
        [{"name": "a", "resources": {"claims": [{"name": "gpu"}]}}],
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "t"}],
    ),
    "container claims only": _pod([{"name": "a", "resources": {"claims": [{"name": "gpu"}]}}]),
}
# Extended resources the API server may serve through a DeviceClass (KEP-5004): the validating webhook
# must see them to judge tier and quota; only nvidia.com/* is ever rewritten, so mutate does not.
EXTENDED = {
    "implicit DeviceClass resource": _pod(
        [
            {
                "name": "a",
                "resources": {"limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com-a100": "1"}},
            }
        ]
    ),
    "other vendor (a DeviceClass may declare it)": _pod(
        [{"name": "a", "resources": {"limits": {"amd.com/gpu": "1"}}}]
    ),
    "request only, init container": _pod(
        [{"name": "a"}], initContainers=[{"name": "i", "resources": {"requests": {"example.com/a100": "1"}}}]
    ),
}

NEGATIVE = {
    "cpu only": _pod([{"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]),
    "no resources": _pod(),
    "empty resources": _pod([{"name": "a", "resources": {}}]),
    "empty claims": _pod([{"name": "a", "resources": {"claims": []}}], resourceClaims=[]),
}


def _wrap(kind: str, pod_spec: dict[str, Any] | None) -> dict[str, Any] | None:
    if pod_spec is None:
        return None
    tmpl = {"metadata": {"labels": {"app": "x"}}, "spec": pod_spec}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod_spec}
    if kind == "CronJob":
        return {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "c"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": tmpl}}},
        }
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "w"}, "spec": {"template": tmpl}}


KINDS_OF = {
    "pods": ["Pod"],
    "workloads": ["Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "ReplicationController"],
    "cronjobs": ["CronJob"],
}


def _hooks() -> list[tuple[str, dict[str, Any]]]:
    return [(cfg["kind"], h) for cfg in webhook_configs(build("base")) for h in cfg["webhooks"]]


def _request(op: str = "CREATE") -> dict[str, Any]:
    return {"operation": op, "namespace": "ml", "userInfo": {"username": "u"}}


@pytest.mark.parametrize(("kind", "hook"), _hooks(), ids=lambda v: v["name"] if isinstance(v, dict) else v)
def test_match_conditions_select_exactly_gpu_objects(kind: str, hook: dict[str, Any]) -> None:
    family = hook["name"].split(".")[0]
    conds = hook.get("matchConditions", [])
    if family in ("dra", "deviceclasses"):
        assert kind == "ValidatingWebhookConfiguration", "nothing in resource.k8s.io is ever patched"
        assert conds == [], "resource.k8s.io objects always reach the validating webhook"
        return
    if family == "workload-crds":
        # Policy-declared CRDs put pod templates at paths no fixed condition can know.
        assert conds == [], "workload CRDs always reach the webhook"
        return
    assert len(conds) == 1
    expr = ENV.compile(conds[0]["expression"])
    assert expr.return_type().name() == "BOOL"
    mutating = kind == "MutatingWebhookConfiguration"
    positive = POSITIVE if mutating else {**POSITIVE, **CLAIMS_ONLY, **EXTENDED}
    negative = {**NEGATIVE, **CLAIMS_ONLY, **EXTENDED} if mutating else NEGATIVE
    for k in KINDS_OF[family]:
        for label, spec in positive.items():
            obj = _wrap(k, copy.deepcopy(spec))
            assert _eval(expr, {"object": obj, "oldObject": None, "request": _request()}), f"{k}: {label}"
            assert _eval(expr, {"object": obj, "oldObject": obj, "request": _request("UPDATE")}), (
                f"{k}: {label}"
            )
        for label, spec in negative.items():
            obj = _wrap(k, copy.deepcopy(spec))
            assert not _eval(expr, {"object": obj, "oldObject": None, "request": _request()}), f"{k}: {label}"
        # Shapes that must not error: DELETE (object null), missing spec/template, a different kind.
        shells = [
            None,
            {"kind": k, "metadata": {"name": "x"}},
            {"kind": k, "spec": {}},
            {"kind": k, "spec": {"template": {}}},
            {"kind": k, "spec": {"jobTemplate": {"spec": {}}}},
            _wrap("Pod", POSITIVE["limit nvidia.com/gpu"])
            if k != "Pod"
            else _wrap("Job", NEGATIVE["no resources"]),
        ]
        for obj in shells:
            assert not _eval(expr, {"object": obj, "oldObject": None, "request": _request("DELETE")}), (
                k,
                obj,
            )


def test_a_condition_reading_the_wrong_path_would_be_caught() -> None:
    """Guard for the test above: the pod-shaped condition evaluated on a Deployment says False."""
    pod_hook = next(h for _, h in _hooks() if h["name"].startswith("pods."))
    expr = ENV.compile(pod_hook["matchConditions"][0]["expression"])
    dep = _wrap("Deployment", POSITIVE["limit nvidia.com/gpu"])
    assert not _eval(expr, {"object": dep, "oldObject": None, "request": _request()})


# --- DeviceClass selectors against the driver's own devices -----------------------------------------


def _cel_device(dev: Any, driver: str) -> dict[str, Any]:
    """A driver.devices.DriverDevice as the scheduler's CEL sees it: attributes by domain."""
    attrs: dict[str, dict[str, Any]] = {}
    for key, (_kind, value) in dev.attributes.items():
        domain, _, name = key.rpartition("/")
        attrs.setdefault(domain or driver, {})[name] = value
    cap = {driver: {k: v for k, v in dev.capacity.items()}}
    return {"driver": driver, "attributes": attrs, "capacity": cap}


def _sim_devices() -> dict[str, list[dict[str, Any]]]:
    from driver.devices import build_devices
    from driver.nvml import open_sim
    from driver.schema import DRIVER_NAME

    out = {}
    for path in sorted((REPO / "driver" / "sim" / "topologies").glob("*.yaml")):
        out[path.stem] = [_cel_device(d, DRIVER_NAME) for d in build_devices(open_sim(path).enumerate())]
    return out


def _classes() -> dict[str, Any]:
    return {c["metadata"]["name"]: c for c in find(build("base"), "DeviceClass")}


def _selects(cls: dict[str, Any], device: dict[str, Any]) -> bool:
    return all(
        _eval(DEVICE_ENV.compile(s["cel"]["expression"]), {"device": device})
        for s in cls["spec"]["selectors"]
    )


MIG_PROFILES = ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.40gb", "7g.80gb"]


def test_device_class_names_cover_the_seed_table() -> None:
    names = set(_classes())
    assert {"gpu.nvidia.com-a100", "gpu.nvidia.com-h100", "gpu.nvidia.com-a100-mig-3g20gb"} <= names
    assert {f"mig-{p.replace('.', '')}.nvidia.com" for p in MIG_PROFILES} <= names
    # 12 whole-GPU classes (a100, a100-40gb, a100-80gb, h100, h200, b200, gb200, rtxpro6000, l40s, l4,
    # a10g, t4), a class per MIG profile of each family (A100 11, H100 12, H200 6, B200 6, GB200 6,
    # RTX PRO 6000 3) and the article's model-independent MIG classes.
    assert len(names) == 12 + 11 + 12 + 6 + 6 + 6 + 3 + len(MIG_PROFILES)
    dns_subdomain = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    assert all(dns_subdomain.match(n) and len(n) <= 253 for n in names)


def test_device_classes_select_the_right_simulated_devices() -> None:
    classes = _classes()
    devices = _sim_devices()
    picked = {
        name: {(topo, i) for topo, devs in devices.items() for i, d in enumerate(devs) if _selects(cls, d)}
        for name, cls in classes.items()
    }

    def kinds(name: str) -> set[tuple[str, str, str | None]]:
        return {
            (
                devices[t][i]["attributes"]["gpu.nvidia.com"]["type"],
                devices[t][i]["attributes"]["gpu.nvidia.com"]["productName"],
                devices[t][i]["attributes"]["gpu.nvidia.com"].get("profile"),
            )
            for t, i in picked[name]
        }

    # Whole A100s only: the MIG slices of an A100 inherit productName but must not match.
    assert kinds("gpu.nvidia.com-a100") == {("gpu", "NVIDIA A100 80GB PCIe", None)}
    assert len(picked["gpu.nvidia.com-a100"]) == 4 + 2  # a100-4x-nvlink + the two A100s of mixed-nvlink-pairs
    # Every whole H100 board: the SXM 80GB HBM3 and the NVL (AKS NC H100 v5) of the topologies.
    assert kinds("gpu.nvidia.com-h100") == {
        ("gpu", "NVIDIA H100 80GB HBM3", None),
        ("gpu", "NVIDIA H100 NVL", None),
    }
    assert len(picked["gpu.nvidia.com-h100"]) == 8 + 2
    # The simulated a100-4x-mig node carves 3g.20gb (an A100 40GB profile) out of 80 GB PCIe boards.
    assert kinds("gpu.nvidia.com-a100-mig-3g20gb") == {("mig", "NVIDIA A100 80GB PCIe", "3g.20gb")}
    assert len(picked["gpu.nvidia.com-a100-mig-3g20gb"]) == 8
    assert picked["mig-3g20gb.nvidia.com"] == picked["gpu.nvidia.com-a100-mig-3g20gb"]


@pytest.mark.parametrize("profile", MIG_PROFILES)
def test_each_mig_class_selects_only_its_profile(profile: str) -> None:
    """Devices of every profile in the table, shaped like the driver's MIG devices (a simulated A100
    MIG device with its profile changed; the bundled topologies only carve 3g.20gb)."""
    template = next(
        d
        for devs in _sim_devices().values()
        for d in devs
        if d["attributes"]["gpu.nvidia.com"]["type"] == "mig"
    )
    cls = _classes()[f"mig-{profile.replace('.', '')}.nvidia.com"]
    for other in MIG_PROFILES:
        dev = copy.deepcopy(template)
        dev["attributes"]["gpu.nvidia.com"]["profile"] = other
        assert _selects(cls, dev) == (other == profile), (profile, other)
    full_gpu = next(
        d
        for devs in _sim_devices().values()
        for d in devs
        if d["attributes"]["gpu.nvidia.com"]["type"] == "gpu"
    )
    assert not _selects(cls, full_gpu)  # no error either: `profile` is read only after the type check
    assert not _selects(
        cls,
        {
            **template,
            "driver": "other.example.com",
            "attributes": {"other.example.com": {"type": "mig", "profile": profile}},
        },
    )


def test_selectors_use_only_published_attributes_and_guard_the_driver() -> None:
    from driver.schema import lookup

    used = 0
    for name, cls in _classes().items():
        for s in cls["spec"]["selectors"]:
            expr = " ".join(s["cel"]["expression"].split())
            assert expr.startswith("device.driver == 'gpu.nvidia.com' && "), name
            for domain, attr in re.findall(r"device\.attributes\['([^']+)'\]\.(\w+)", expr):
                assert lookup(domain, attr, "attribute") is not None, (
                    f"{name}: {domain}/{attr} is not published"
                )
                used += 1
            assert "migProfile" not in expr
    # 2 per whole-GPU class (3 for a100-40gb/-80gb), 3 per family MIG class, 2 per MIG-table class.
    assert used == 2 * (3 + 7) + 3 * 2 + 3 * (11 + 12 + 6 + 6 + 6 + 3) + 2 * len(MIG_PROFILES)


def test_opaque_configs_pass_the_driver_validator_for_the_devices_they_select() -> None:
    from driver.config import validate_opaque_config

    configs = 0
    for name, cls in _classes().items():
        dtype = "mig" if "mig" in name else "gpu"
        for c in cls["spec"].get("config", []):
            assert c["opaque"]["driver"] == "gpu.nvidia.com"
            params = c["opaque"]["parameters"]
            assert params["apiVersion"] == "resource.nvidia.com/v1beta1" and params["kind"] == "GpuConfig"
            assert validate_opaque_config(params, {dtype}) == [], name
            configs += 1
    # Long slices on the A100 classes, Short on H100 and H200 (as in the seed); none on MIG classes.
    assert configs == 12


def test_deviceclass_file_mentions_no_seed_only_names() -> None:
    text = (REPO / "kustomize" / "base" / "deviceclasses" / "deviceclasses.yaml").read_text()
    assert "gpu.nvidia.com/v1alpha1" not in text and "migProfile" not in text
    assert Path(REPO / "kustomize" / "base" / "deviceclasses" / "deviceclasses.yaml").is_file()


def test_every_object_mutate_would_patch_passes_the_mutating_condition() -> None:
    """The narrowed /mutate conditions lose nothing: run the real engine in migration mode over every
    shape, and wherever it returns a patch, the mutating webhook's condition must have let it through."""
    import json

    from tests.server.conftest import review as review_body
    from tests.server.conftest import seed_inventory
    from tests.server.objects import WORKLOADS
    from webhook.policy.load import load_policies
    from webhook.server import admission
    from webhook.server.admission import Snapshot

    snap = Snapshot(
        policies=load_policies(REPO / "policies"),
        inventory=seed_inventory(),
        namespace_labels={"ml": {"draguard.io/migration-mode": "migrate"}},
    )
    hooks = {h["name"].split(".")[0]: h for kind, h in _hooks() if kind == "MutatingWebhookConfiguration"}
    assert set(hooks) == {"pods", "workloads", "cronjobs", "workload-crds"}
    assert "matchConditions" not in hooks.pop("workload-crds")  # every CRD object reaches /mutate
    mixed = _pod(
        [
            {"name": "a", "resources": {"claims": [{"name": "gpu"}]}},
            {"name": "b", "resources": {"limits": {GPU: "1"}}},
        ],
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "t"}],
    )
    shapes = {**POSITIVE, **NEGATIVE, **CLAIMS_ONLY, **EXTENDED, "claims plus a legacy limit": mixed}
    patched = 0
    for family, hook in hooks.items():
        expr = ENV.compile(hook["matchConditions"][0]["expression"])
        for k in KINDS_OF[family]:
            for label, spec in shapes.items():
                obj = _wrap(k, copy.deepcopy(spec))
                assert obj is not None
                obj["metadata"]["namespace"] = "ml"
                grp, ver = WORKLOADS[k]
                obj["apiVersion"] = f"{grp}/{ver}" if grp else ver
                body = json.dumps(review_body(obj, group=grp, version=ver, kind=k, namespace="ml")).encode()
                out = admission.review("mutate", admission.parse_review(body), snap)
                if out.patch:
                    patched += 1
                    assert _eval(expr, {"object": obj, "oldObject": None, "request": _request()}), (k, label)
    # Legacy limits on every kind were rewritten, so the check above had something to check.
    assert patched >= 4 * (len(KINDS_OF["workloads"]) + 2), patched
