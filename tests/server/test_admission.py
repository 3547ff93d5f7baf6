"""Every checked kind x rule x mode through the real HTTP endpoints (aiohttp test server)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubernetes import client as k8s

from tests.server.conftest import RecordingCreator, make_webhook, review, write_policies
from tests.server.objects import (
    BAD_CEL,
    DRA_VERSIONS,
    NO_MATCH_CEL,
    WORKLOADS,
    dra_object,
    legacy_pod_spec,
    tier_pod_spec,
    workload,
)
from webhook.server.admission import MAX_WARNING, annotation_key
from webhook.server.app import Webhook

MODES = ("enforce", "warn", "audit")
MIGRATION_MODE = {"enforce": "enforce", "warn": "warn", "audit": "observe"}
DRA_KINDS = ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass")
# Model class names in the kubernetes client, to check patched objects against the schema.
MODELS = {
    "Pod": "V1Pod",
    "PodTemplate": "V1PodTemplate",
    "ReplicationController": "V1ReplicationController",
    "Deployment": "V1Deployment",
    "ReplicaSet": "V1ReplicaSet",
    "StatefulSet": "V1StatefulSet",
    "DaemonSet": "V1DaemonSet",
    "Job": "V1Job",
    "CronJob": "V1CronJob",
}


async def post(wh: Webhook, endpoint: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with TestClient(TestServer(wh.build_app())) as c:
        r = await c.post(f"/{endpoint}", json=body)
        return r.status, await r.json()


def assert_placed(resp: dict[str, Any], rule: str, mode: str) -> None:
    """The finding of `rule` lands where its mode says, and nowhere else."""
    message = (resp.get("status") or {}).get("message", "")
    warnings = resp.get("warnings") or []
    audits = resp.get("auditAnnotations") or {}
    in_deny = f"[{rule}]" in message
    in_warn = any(f"[{rule}]" in w for w in warnings)
    in_audit = annotation_key(rule) in audits
    assert all(len(w) <= MAX_WARNING for w in warnings), warnings
    if mode == "enforce":
        assert resp["allowed"] is False and resp["status"]["code"] == 403
        assert (in_deny, in_warn, in_audit) == (True, False, False), resp
    elif mode == "warn":
        assert (in_deny, in_warn, in_audit) == (False, True, False), resp
    else:
        assert (in_deny, in_warn, in_audit) == (False, False, True), resp


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", sorted(WORKLOADS))
async def test_tier_rule_on_every_workload_kind(
    kind: str, mode: str, policy_dir: Callable[[str], Path]
) -> None:
    wh = make_webhook(policy_dir(mode))
    group, version = WORKLOADS[kind]
    obj = workload(kind, tier_pod_spec(), {"draguard.io/workload-class": "llm"})
    status, doc = await post(wh, "validate", review(obj, group=group, version=version, kind=kind))
    assert status == 200
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    assert doc["response"]["uid"] == "0b8e3f3c-1111-4a5e-9e1a-3c6f0d2a7b01"
    assert_placed(doc["response"], "tier/gpu-tiers", mode)
    if mode == "enforce":
        assert (
            "gpu.nvidia.com-h100" in doc["response"]["status"]["message"]
        )  # the fix names the allowed class
    # The mutating side never decides verdicts.
    status, doc = await post(wh, "mutate", review(obj, group=group, version=version, kind=kind))
    assert status == 200 and doc["response"] == {"uid": doc["response"]["uid"], "allowed": True}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", sorted(WORKLOADS))
async def test_migration_rule_modes_on_every_workload_kind(
    kind: str, mode: str, policy_dir: Callable[[str], Path]
) -> None:
    labels = {"team-a": {"draguard.io/migration-mode": MIGRATION_MODE[mode]}}
    creator = RecordingCreator()
    wh = make_webhook(policy_dir("enforce"), creator=creator, labels=labels)
    group, version = WORKLOADS[kind]
    obj = workload(kind, legacy_pod_spec())
    status, doc = await post(wh, "validate", review(obj, group=group, version=version, kind=kind))
    assert status == 200
    assert_placed(doc["response"], "migrate/legacy-gpu", mode)
    if mode == "enforce":
        assert "rewrite" in doc["response"]["status"]["message"]
    status, doc = await post(wh, "mutate", review(obj, group=group, version=version, kind=kind))
    assert "patch" not in doc["response"] and creator.made == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("version", DRA_VERSIONS)
@pytest.mark.parametrize("kind", DRA_KINDS)
@pytest.mark.parametrize(("rule", "expression"), [("cel/no-match", NO_MATCH_CEL)])
async def test_cel_rules_on_every_dra_kind_and_version(
    kind: str, version: str, mode: str, rule: str, expression: str, policy_dir: Callable[[str], Path]
) -> None:
    wh = make_webhook(policy_dir(mode))
    obj = dra_object(kind, version, expression)
    ns = "" if kind == "DeviceClass" else "team-a"
    status, doc = await post(
        wh, "validate", review(obj, group="resource.k8s.io", version=version, kind=kind, namespace=ns)
    )
    assert status == 200
    assert_placed(doc["response"], rule, mode)
    if version != "v1":
        # Served but deprecated versions are flagged whatever the policy modes are.
        resp = doc["response"]
        text = json.dumps(resp)
        assert "structure/deprecated-version" in text or "structure.deprecated-version" in text


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", DRA_KINDS)
async def test_cel_compile_checks_never_deny_at_admission(
    kind: str, mode: str, policy_dir: Callable[[str], Path]
) -> None:
    # The API server compiles and cost-checks selectors before it calls the webhook, so a
    # cel/syntax finding at /validate would be draguard disagreeing with it: none is reported.
    wh = make_webhook(policy_dir(mode))
    obj = dra_object(kind, "v1", BAD_CEL)
    ns = "" if kind == "DeviceClass" else "team-a"
    status, doc = await post(wh, "validate", review(obj, group="resource.k8s.io", version="v1", kind=kind,
                                                   namespace=ns))
    assert status == 200
    resp = doc["response"]
    text = json.dumps(resp)
    assert resp["allowed"] is True, resp
    assert "cel/syntax" not in text and "cel.syntax" not in text, resp


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
async def test_migrate_mode_patch_applies_and_validates(kind: str, policy_dir: Callable[[str], Path]) -> None:
    labels = {"team-a": {"draguard.io/migration-mode": "migrate"}}
    creator = RecordingCreator()
    wh = make_webhook(policy_dir("enforce"), creator=creator, labels=labels)
    group, version = WORKLOADS[kind]
    obj = workload(kind, legacy_pod_spec())
    status, doc = await post(wh, "mutate", review(obj, group=group, version=version, kind=kind))
    resp = doc["response"]
    assert status == 200 and resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    patched = jsonpatch.apply_patch(obj, ops)
    # Schema check: the kubernetes client models accept the result.
    api = k8s.ApiClient()
    model = api.deserialize(json.dumps(patched), MODELS[kind], "application/json")
    assert model.kind == kind
    text = json.dumps(patched)
    assert "nvidia.com/gpu" not in text  # the device-plugin resource is gone
    assert '"cpu": "2"' in text  # other limits survive
    # The template the patch references was created in the workload's namespace, labelled as ours.
    assert len(creator.made) == 1
    tmpl = creator.made[0]
    assert tmpl["metadata"]["namespace"] == "team-a"
    assert tmpl["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "draguard"
    assert tmpl["metadata"]["name"] in text
    api.deserialize(json.dumps(tmpl), "V1ResourceClaimTemplate", "application/json")
    # The validating side accepts the final object: nothing left to migrate.
    status, doc = await post(wh, "validate", review(patched, group=group, version=version, kind=kind))
    assert "migrate/legacy-gpu" not in json.dumps(doc["response"])


async def test_migrate_dry_run_patches_without_creating(policy_dir: Callable[[str], Path]) -> None:
    creator = RecordingCreator()
    wh = make_webhook(
        policy_dir("enforce"), creator=creator, labels={"team-a": {"draguard.io/migration-mode": "migrate"}}
    )
    _status, doc = await post(wh, "mutate", review(workload("Pod", legacy_pod_spec()), dry_run=True))
    assert "patch" in doc["response"] and creator.made == []


async def test_migrate_reuses_existing_template_and_refuses_foreign_one(
    policy_dir: Callable[[str], Path],
) -> None:
    from dataclasses import replace

    creator = RecordingCreator()
    wh = make_webhook(
        policy_dir("enforce"), creator=creator, labels={"team-a": {"draguard.io/migration-mode": "migrate"}}
    )
    body = review(workload("Pod", legacy_pod_spec()))
    _s, doc = await post(wh, "mutate", body)
    tmpl = creator.made[0]
    key = (tmpl["metadata"]["namespace"], tmpl["metadata"]["name"])
    creator.made.clear()
    wh.snapshot = replace(wh.snapshot, templates={key: tmpl})
    _s, doc = await post(wh, "mutate", body)
    assert "patch" in doc["response"] and creator.made == []  # reused, not created again
    foreign = {**tmpl, "metadata": {**tmpl["metadata"], "labels": {}}}
    wh.snapshot = replace(wh.snapshot, templates={key: foreign})
    _s, doc = await post(wh, "mutate", body)
    assert "patch" not in doc["response"]
    assert "not managed by draguard" in doc["response"]["warnings"][0]


async def test_migrate_template_creation_failure_withdraws_patch(policy_dir: Callable[[str], Path]) -> None:
    wh = make_webhook(
        policy_dir("enforce"),
        creator=RecordingCreator(fail=TimeoutError("API server slow")),
        labels={"team-a": {"draguard.io/migration-mode": "migrate"}},
    )
    _s, doc = await post(wh, "mutate", review(workload("Pod", legacy_pod_spec())))
    assert doc["response"]["allowed"] is True and "patch" not in doc["response"]
    assert "could not be created" in doc["response"]["warnings"][0]
    metrics = wh.metrics.render().decode()
    assert 'draguard_generated_objects_total{outcome="failed"} 1.0' in metrics


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
async def test_delete_and_connect_pass(operation: str, policy_dir: Callable[[str], Path]) -> None:
    wh = make_webhook(policy_dir("enforce"))
    obj = workload("Pod", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
    for ep in ("validate", "mutate"):
        status, doc = await post(wh, ep, review(obj, operation=operation))
        assert status == 200 and doc["response"]["allowed"] is True and len(doc["response"]) == 2
    assert f'operation="{operation}",verdict="ignored"' in wh.metrics.render().decode()


async def test_update_is_checked(policy_dir: Callable[[str], Path]) -> None:
    wh = make_webhook(policy_dir("enforce"))
    obj = workload("Deployment", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
    _s, doc = await post(wh, "validate", review(obj, group="apps", kind="Deployment", operation="UPDATE"))
    assert doc["response"]["allowed"] is False


async def test_other_kinds_and_subresources_pass_and_are_counted(policy_dir: Callable[[str], Path]) -> None:
    wh = make_webhook(policy_dir("enforce"))
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}}
    status, doc = await post(wh, "validate", review(cm, kind="ConfigMap"))
    assert status == 200 and doc["response"] == {"uid": doc["response"]["uid"], "allowed": True}
    obj = workload("Pod", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
    _s, doc = await post(wh, "validate", review(obj, sub_resource="status", operation="UPDATE"))
    assert doc["response"]["allowed"] is True
    text = wh.metrics.render().decode()
    # Kinds draguard does not check share one label value: a caller chooses the kind it sends.
    assert (
        'draguard_admission_ignored_total{endpoint="validate",kind="other",operation="CREATE"} 1.0'
        in text
    )
    assert "ConfigMap" not in text


async def test_rule_exception_never_500(
    policy_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rule that raises: validate denies naming the rule, mutate allows without a patch; both counted."""
    import webhook.engine.evaluate as ev
    from webhook.engine.rules import RuleModule, registry
    from webhook.engine.rules.base import FunctionRule

    def boom(item: Any, rc: Any) -> Any:
        raise RuntimeError("kaboom")

    broken = RuleModule("boom", (FunctionRule("boom/rule", boom),))
    monkeypatch.setattr(ev, "modules", lambda names=None: (*registry(), broken))
    wh = make_webhook(
        policy_dir("enforce"),
        creator=RecordingCreator(),
        labels={"team-a": {"draguard.io/migration-mode": "migrate"}},
    )
    obj = workload("Pod", legacy_pod_spec())
    status, doc = await post(wh, "validate", review(obj))
    assert status == 200 and doc["response"]["allowed"] is False
    assert "internal/boom" in doc["response"]["status"]["message"]
    assert "kaboom" in doc["response"]["status"]["message"]
    status, doc = await post(wh, "mutate", review(obj))
    assert status == 200 and doc["response"]["allowed"] is True and "patch" not in doc["response"]
    text = wh.metrics.render().decode()
    assert 'draguard_rule_errors_total{endpoint="validate",rule="internal/boom"} 1.0' in text
    assert 'draguard_rule_errors_total{endpoint="mutate",rule="internal/boom"} 1.0' in text


async def test_metrics_count_requests_findings_and_latency(policy_dir: Callable[[str], Path]) -> None:
    wh = make_webhook(policy_dir("warn"))
    obj = workload("Pod", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
    await post(wh, "validate", review(obj))
    async with TestClient(TestServer(wh.build_app())) as c:
        r = await c.get("/metrics")
        text = await r.text()
    assert r.status == 200
    assert (
        'draguard_admission_requests_total{endpoint="validate",kind="Pod",'
        'operation="CREATE",verdict="warned"} 1.0' in text
    )
    assert 'draguard_findings_total{endpoint="validate",mode="warn",rule="tier/gpu-tiers"} 1.0' in text
    assert 'draguard_admission_duration_seconds_count{endpoint="validate"} 1.0' in text
    for name in (
        "dra_resource_claims_total",
        "dra_resource_claims_pending",
        "dra_resource_claims_allocated",
        "dra_allocation_duration_seconds_count",
        "draguard_policy_reload_failures_total",
    ):
        assert name in text


async def test_info_log_line_per_review_without_the_object(policy_dir: Callable[[str], Path]) -> None:
    import io
    import logging

    from webhook.server import logs

    stream = io.StringIO()
    logs.setup("info", stream)
    try:
        wh = make_webhook(policy_dir("enforce"))
        obj = workload("Pod", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
        status, _doc = await post(wh, "validate", review(obj))
    finally:
        logging.getLogger().handlers.clear()
    assert status == 200
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    entry = next(e for e in lines if e["msg"] == "admission")
    assert entry["uid"] == "0b8e3f3c-1111-4a5e-9e1a-3c6f0d2a7b01"
    assert entry["verdict"] == "denied" and entry["rules"] == ["tier/gpu-tiers"]
    assert entry["object"] == "Pod/team-a/w"
    assert "llm-server" not in stream.getvalue()  # the object itself is not logged at info


async def test_review_cache_answers_repeats_with_their_own_uid(policy_dir: Callable[[str], Path]) -> None:
    wh = make_webhook(policy_dir("enforce"))
    obj = workload("Deployment", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
    # What repeats in a cluster: the same UPDATE (a GitOps sync that changes nothing).
    first = review(obj, group="apps", kind="Deployment", operation="UPDATE", uid="11111111-aaaa")
    second = review(obj, group="apps", kind="Deployment", operation="UPDATE", uid="22222222-bbbb")
    async with TestClient(TestServer(wh.build_app())) as c:
        d1 = await (await c.post("/validate", json=first)).json()
        d2 = await (await c.post("/validate", json=second)).json()
        assert d1["response"]["uid"] == "11111111-aaaa" and d2["response"]["uid"] == "22222222-bbbb"
        assert {**d1["response"], "uid": ""} == {**d2["response"], "uid": ""}
        text = wh.metrics.render().decode()
        assert 'draguard_review_cache_total{result="hit"} 1.0' in text
        # New policies (a new snapshot generation) are never answered from the old entries.
        write_policies(Path(wh.opts.policies), "warn")
        assert wh.load_policies()
        d3 = await (await c.post("/validate", json=second)).json()
        assert d3["response"]["allowed"] is True
        # A different object is a different entry.
        other = review(workload("Pod", legacy_pod_spec()), uid="33333333-cccc")
        d4 = await (await c.post("/validate", json=other)).json()
        assert d4["response"]["uid"] == "33333333-cccc"
        assert any("migrate/legacy-gpu" in w for w in d4["response"]["warnings"])


async def test_validating_creates_are_each_evaluated_and_never_stored(
    policy_dir: Callable[[str], Path],
) -> None:
    """The API server gives every object a fresh uid and creationTimestamp before validating a
    CREATE: two such requests are never the same, and the cache keeps no entry for them."""
    wh = make_webhook(policy_dir("enforce"))
    obj = workload("Deployment", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
    async with TestClient(TestServer(wh.build_app())) as c:
        for uid in ("11111111-aaaa", "22222222-bbbb"):
            body = review(obj, group="apps", kind="Deployment", uid=uid)
            d = await (await c.post("/validate", json=body)).json()
            assert d["response"]["uid"] == uid and d["response"]["allowed"] is False
        text = wh.metrics.render().decode()
    assert 'draguard_review_cache_total{result="hit"} 0.0' in text
    assert 'draguard_review_cache_total{result="miss"} 2.0' in text
    assert wh.review_cache is not None and len(wh.review_cache) == 0


QUOTA_CASES = [(k, *WORKLOADS[k]) for k in sorted(WORKLOADS) if k != "PodTemplate"] + [
    ("ResourceClaim", "resource.k8s.io", v) for v in DRA_VERSIONS
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("kind", "group", "version"), QUOTA_CASES)
async def test_quota_rule_modes(kind: str, group: str, version: str, mode: str, tmp_path: Path) -> None:
    """Two A100s against a budget of one, from a workload (via a cluster template) or a claim."""
    wh = make_webhook(write_policies(tmp_path / "pol", mode, quota=True))
    if kind == "ResourceClaim":
        obj = dra_object(kind, version)
        obj["spec"]["devices"]["requests"][0].get("exactly", obj["spec"]["devices"]["requests"][0])[
            "count"
        ] = 2
    else:
        spec = tier_pod_spec()
        spec["resourceClaims"].append({"name": "gpu2", "resourceClaimTemplateName": "one-a100"})
        spec["containers"][0]["resources"]["claims"].append({"name": "gpu2"})
        obj = workload(kind, spec)
    status, doc = await post(wh, "validate", review(obj, group=group, version=version, kind=kind))
    assert status == 200
    assert_placed(doc["response"], "quota/budgets", mode)


async def test_migration_template_created_in_a_served_version(policy_dir: Callable[[str], Path]) -> None:
    """A cluster serving only v1beta1 gets the generated template in v1beta1's shape."""
    from webhook.server.caches import ClusterCache
    from webhook.server.metrics import Metrics

    creator = RecordingCreator()
    wh = make_webhook(
        policy_dir("enforce"), creator=creator, labels={"team-a": {"draguard.io/migration-mode": "migrate"}}
    )
    wh.cache = ClusterCache(
        http=None, metrics=Metrics(), dra_version="v1beta1", served=frozenset({"v1beta1"})
    )
    _s, doc = await post(wh, "mutate", review(workload("Pod", legacy_pod_spec())))
    assert "patch" in doc["response"]
    [tmpl] = creator.made
    assert tmpl["apiVersion"] == "resource.k8s.io/v1beta1"
    req = tmpl["spec"]["spec"]["devices"]["requests"][0]
    assert "exactly" not in req and req["deviceClassName"] == "gpu.nvidia.com-a100"
    k8s.ApiClient().deserialize(json.dumps(tmpl), "V1beta1ResourceClaimTemplate", "application/json")


async def test_managed_fields_are_not_judged(policy_dir: Callable[[str], Path]) -> None:
    """No rule reads who wrote which field: an API server's managedFields, however deep, change
    nothing in the answer (the caches and the audit drop them as well)."""
    wh = make_webhook(policy_dir("enforce"))
    obj = workload("Deployment", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(150):  # past the engine's 100-level limit
        node["f:x"] = {}
        node = node["f:x"]
    managed = json.loads(json.dumps(obj))
    managed["metadata"]["managedFields"] = [
        {"manager": "kubectl", "operation": "Update", "apiVersion": "apps/v1", "fieldsType": "FieldsV1",
         "fieldsV1": deep}
    ]  # fmt: skip
    _, plain = await post(wh, "validate", review(obj, group="apps", kind="Deployment"))
    _, with_fields = await post(wh, "validate", review(managed, group="apps", kind="Deployment"))
    assert plain["response"]["allowed"] is False
    assert "[tier/gpu-tiers]" in plain["response"]["status"]["message"]
    assert with_fields["response"] == plain["response"]
