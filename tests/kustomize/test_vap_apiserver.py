"""`draguard vap`: the enforce-mode legacy-GPU check as a ValidatingAdmissionPolicy, evaluated by a real
kube-apiserver with no webhook at all (every replica down), and the same verdict as the engine's.

Each case is a server-side dry run on the bare API server; the engine judges the same object with the
same namespace labels, policies and exceptions, and the two must agree on "denied at enforce".
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kapi import Api, api_server, wait_for

from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import load_policies
from webhook.policy.vap import POLICY_NAME, generate, glob_to_re2, served_extended_resources

REPO = Path(__file__).resolve().parents[2]
NAMESPACES: dict[str, dict[str, str]] = {
    "enf": {"draguard.io/migration-mode": "enforce"},
    "warn-by-default": {},
    "migrating": {"draguard.io/migrate": "true"},  # a labelled mode (migrate): never denied
    "override-wins": {"draguard.io/migrate": "true", "draguard.io/migration-mode": "enforce"},
    "bogus-mode": {"draguard.io/migration-mode": "deny-everything"},  # not a mode: the default applies
    "legacy-ok": {"draguard.io/migration-mode": "enforce"},  # a PolicyException covers some pods here
}
EXCEPTION = f"""\
apiVersion: policy.draguard.io/v1alpha1
kind: PolicyException
metadata: {{name: grandfathered-trainers}}
spec:
  rules: ["migrate/*"]
  namespaces: [legacy-ok]
  objects: [{{kind: Pod, name: "grandfathered-*"}}]
  expires: "{(dt.date.today() + dt.timedelta(days=30)).isoformat()}"
  reason: the old trainers move to DRA next quarter
"""


def _pod(
    name: str, limits: dict[str, Any] | None = None, *, init: bool = False, claim: bool = False
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "main", "image": "registry.example/train:1"}
    if limits is not None:
        c["resources"] = {"limits": limits}
    spec: dict[str, Any] = {"containers": [c]}
    if init:
        spec = {"initContainers": [dict(c, name="warmup")], "containers": [{"name": "main", "image": "x"}]}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _deployment(name: str, limits: dict[str, Any]) -> dict[str, Any]:
    pod = _pod(name, limits)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}},
    }  # fmt: skip


def _cronjob(name: str, limits: dict[str, Any]) -> dict[str, Any]:
    spec = dict(_pod(name, limits)["spec"], restartPolicy="OnFailure")
    return {
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name},
        "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": {"spec": spec}}}},
    }  # fmt: skip


GPU = {"nvidia.com/gpu": "1"}
CASES: list[tuple[str, dict[str, Any], bool]] = [
    # (namespace, object, denied)
    ("enf", _pod("legacy", GPU), True),
    ("enf", _pod("mig", {"nvidia.com/mig-3g.20gb": 1}), True),
    ("enf", _pod("init-legacy", GPU, init=True), True),
    ("enf", _pod("zero", {"nvidia.com/gpu": "0"}), False),
    ("enf", _pod("cpu", {"cpu": "1"}), False),
    ("enf", _pod("dra", None, claim=True), False),
    ("enf", _deployment("legacy-deploy", GPU), True),
    ("enf", _cronjob("legacy-cron", GPU), True),
    ("warn-by-default", _pod("legacy", GPU), False),
    ("migrating", _pod("legacy", GPU), False),
    ("override-wins", _pod("legacy", GPU), True),
    ("bogus-mode", _pod("legacy", GPU), False),
    ("legacy-ok", _pod("grandfathered-a", GPU), False),
    ("legacy-ok", _pod("new-trainer", GPU), True),
    ("kube-system", _pod("legacy", dict(GPU)), False),  # excluded by the shipped MigrationPolicy
]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("policies")
    for f in (REPO / "policies").glob("*.yaml"):
        shutil.copy(f, d / f.name)
    (d / "exceptions.yaml").write_text(EXCEPTION)
    return d


def _apply(api: Api, objs: list[dict[str, Any]]) -> None:
    out = api.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objs))
    assert out.returncode == 0, out.stderr


def _dry_run(api: Api, ns: str, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return api.kubectl("-n", ns, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(obj))


@pytest.fixture(scope="module")
def api(policy_dir: Path) -> Iterator[Api]:
    with api_server() as a:
        for ns, labels in NAMESPACES.items():
            doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}
            _apply(a, [doc])
            a.kubectl("-n", ns, "create", "serviceaccount", "default")
        _apply(a, generate(load_policies(policy_dir)))
        # A policy takes effect a moment after it is created: probe until it bites.
        wait_for(lambda: _dry_run(a, "enf", _pod("probe", GPU)).returncode != 0, "the policy in force", 60)
        yield a


def _engine_denies(policy_dir: Path, ns: str, obj: dict[str, Any]) -> bool:
    labels = NAMESPACES.get(ns, {})
    ctx = Context(namespace_labels={ns: labels}, admission=True, operation="CREATE")
    item = SourceObject(obj=dict(obj, metadata=dict(obj["metadata"], namespace=ns)), file=None, line=None)
    report = evaluate([item], load_policies(policy_dir), Inventory.empty(), ctx)
    return any(f.rule == "migrate/legacy-gpu" for f in report.denied)


CASE_IDS = [f"{n}-{o['metadata']['name']}" for n, o, _ in CASES]


@pytest.mark.parametrize(("ns", "obj", "denied"), CASES, ids=CASE_IDS)
def test_the_api_server_alone_enforces_as_the_engine_does(
    api: Api, policy_dir: Path, ns: str, obj: dict[str, Any], denied: bool
) -> None:
    out = _dry_run(api, ns, obj)
    assert (out.returncode != 0) is denied, out.stdout + out.stderr
    assert _engine_denies(policy_dir, ns, obj) is denied, "the webhook's engine gives another verdict"
    if denied:
        assert f"ValidatingAdmissionPolicy '{POLICY_NAME}'" in out.stderr, out.stderr
        assert "migration mode is enforce (migrate/legacy-gpu)" in out.stderr, out.stderr
        name = "warmup" if "initContainers" in json.dumps(obj) else "main"
        assert f"container(s) {name} (nvidia.com/" in out.stderr, out.stderr


def test_a_resource_a_deviceclass_serves_is_dra_not_legacy(api: Api, policy_dir: Path) -> None:
    # KEP-5004: with a class mapping nvidia.com/gpu, the pod's nvidia.com/gpu is a DRA request.
    cls = {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.example.com"},
        "spec": {"extendedResourceName": "nvidia.com/gpu"},
    }  # fmt: skip
    served = served_extended_resources([cls])
    assert served == {"nvidia.com/gpu"}
    _apply(api, generate(load_policies(policy_dir), served))
    try:
        served_pod = _pod("served", GPU)
        wait_for(lambda: _dry_run(api, "enf", served_pod).returncode == 0, "the regenerated policy", 60)
        # MIG resources are still legacy.
        assert _dry_run(api, "enf", _pod("mig", {"nvidia.com/mig-1g.10gb": 1})).returncode != 0
    finally:
        _apply(api, generate(load_policies(policy_dir)))
        wait_for(lambda: _dry_run(api, "enf", _pod("probe", GPU)).returncode != 0, "the policy restored", 60)


def test_the_cli_prints_what_the_tests_apply(policy_dir: Path, tmp_path: Path) -> None:
    from webhook.cli import main

    out = tmp_path / "vap.yaml"
    assert main(["vap", "--policies", str(policy_dir), "-o", str(out)]) == 0
    docs = list(yaml.safe_load_all(out.read_text()))
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert docs == generate(load_policies(policy_dir))
    assert main(["vap", "--policies", str(tmp_path / "nope")]) == 2


@pytest.mark.parametrize(
    ("glob", "yes", "no"),
    [
        ("team-*", ["team-a", "team-"], ["xteam-a", "Team-a"]),
        ("ml-?", ["ml-1"], ["ml-12", "ml-"]),
        ("gpu-[ab]", ["gpu-a", "gpu-b"], ["gpu-c"]),
        ("gpu-[!ab]", ["gpu-c"], ["gpu-a"]),
        ("a.b", ["a.b"], ["axb"]),
        ("[oops", ["[oops"], ["o"]),
    ],
)
def test_namespace_globs_match_as_the_engine_matches(glob: str, yes: list[str], no: list[str]) -> None:
    import re

    from webhook.policy.model import glob_match

    rx = re.compile(glob_to_re2(glob))
    for v in yes + no:
        assert (rx.search(v) is not None) is glob_match(glob, v) is (v in yes), (glob, v)


def test_the_bundle_component_is_generated_from_the_shipped_policies() -> None:
    """kustomize/components/enforce-without-webhook carries what `draguard vap` makes of policies/."""
    from webhook.review.vap import _deviceclasses

    component = REPO / "kustomize" / "components" / "enforce-without-webhook" / "legacy-gpu-vap.yaml"
    shipped = list(yaml.safe_load_all(component.read_text()))
    classes = _deviceclasses([str(REPO / "kustomize" / "base" / "deviceclasses")])
    want = generate(load_policies(REPO / "policies"), served_extended_resources(classes))
    assert shipped == want, (
        "stale: run draguard vap --deviceclasses kustomize/base/deviceclasses "
        f"-o {component.relative_to(REPO)}"
    )
