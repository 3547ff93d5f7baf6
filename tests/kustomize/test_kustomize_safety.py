"""Safety properties of the built bundle, checked on every overlay (and the components that change them)."""

from __future__ import annotations

from typing import Any

import pytest
from kbundle import OVERLAYS, Obj, build, containers, find, one

from webhook.dra.workloads import CRD_POD_TEMPLATES, CRD_RESOURCES

EXCLUDED = {"kube-system", "draguard-system", "draguard-driver"}
RESOURCE_VERSIONS = {"v1", "v1beta1", "v1beta2"}
# (group, resource) pairs the validating webhooks must see.
REQUIRED_RULES = {
    ("", "pods"),
    ("", "replicationcontrollers"),
    ("apps", "deployments"),
    ("apps", "replicasets"),
    ("apps", "statefulsets"),
    ("apps", "daemonsets"),
    ("batch", "jobs"),
    ("batch", "cronjobs"),
    ("resource.k8s.io", "resourceclaims"),
    ("resource.k8s.io", "resourceclaimtemplates"),
    ("resource.k8s.io", "deviceclasses"),
    # Every workload CRD of the built-in table, so admission judges what review judges.
    *((group, resource) for (group, _kind), (resource, _versions) in CRD_RESOURCES.items()),
}
INJECTOR_VERBS = {"get", "list", "watch", "patch"}
CREATE_ONLY = {"resourceclaims", "resourceclaimtemplates"}
# /mutate only rewrites workloads' device-plugin requests: nothing in resource.k8s.io reaches it.
REQUIRED_MUTATE_RULES = {(g, r) for g, r in REQUIRED_RULES if g != "resource.k8s.io"}


def _rules(hook: Obj) -> list[tuple[str, str, str, tuple[str, ...]]]:
    out = []
    for r in hook["rules"]:
        for g in r["apiGroups"]:
            for v in r["apiVersions"]:
                for res in r["resources"]:
                    out.append((g, v, res, tuple(r["operations"])))
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_webhook_configurations_are_safe(overlay: str) -> None:
    objs = build(overlay)
    mwc = one(objs, "MutatingWebhookConfiguration", "draguard")
    vwc = one(objs, "ValidatingWebhookConfiguration", "draguard")
    for cfg, policy, timeout in ((mwc, "Ignore", 2), (vwc, "Fail", 3)):
        hooks = cfg["webhooks"]
        assert len({h["name"] for h in hooks}) == len(hooks)
        covered: set[tuple[str, str]] = set()
        for h in hooks:
            admin_only = h["name"] == "deviceclasses.validate.draguard.io"
            # DeviceClasses (admin objects the bundle ships) never wait on a webhook that is not up.
            assert h["failurePolicy"] == ("Ignore" if admin_only else policy), (cfg["kind"], h["name"])
            assert h["timeoutSeconds"] == timeout, (cfg["kind"], h["name"])
            assert h["sideEffects"] == "NoneOnDryRun"
            assert h["admissionReviewVersions"] == ["v1"]
            if not admin_only:
                sel = h["namespaceSelector"]["matchExpressions"]
                assert {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": sorted(EXCLUDED),
                } in [{**e, "values": sorted(e["values"])} for e in sel], h["name"]
            assert "objectSelector" not in h, "labels on objects can be spoofed; exclude by namespace name"
            for g, v, res, ops in _rules(h):
                if admin_only:
                    assert (g, res) == ("resource.k8s.io", "deviceclasses"), h["name"]
                if res in CREATE_ONLY:
                    # Immutable specs: UPDATEs (finalizers, reservedFor, allocation) are the scheduler's
                    # and the resourceclaim controller's, and must never reach the webhook.
                    assert set(ops) == {"CREATE"}, (h["name"], res, ops)
                else:
                    assert set(ops) == {"CREATE", "UPDATE"}, (h["name"], ops)
                assert "*" not in (g, v, res)
                assert "/" not in res, "subresources (pods/status, ...) must not reach the webhook"
                covered.add((g, res))
                if g == "resource.k8s.io":
                    assert {vv for gg, vv, rr, _ in _rules(h) if rr == res} == RESOURCE_VERSIONS, res
                crd = next((vs for (cg, _k), (cr, vs) in CRD_RESOURCES.items() if (cg, cr) == (g, res)), None)
                if crd is not None:
                    assert {vv for gg, vv, rr, _ in _rules(h) if (gg, rr) == (g, res)} == set(crd), res
            if cfg["kind"] == "MutatingWebhookConfiguration":
                assert h["reinvocationPolicy"] == "IfNeeded"
        assert covered == (REQUIRED_RULES if cfg is vwc else REQUIRED_MUTATE_RULES), cfg["kind"]


def test_every_workload_crd_of_the_table_is_routed() -> None:
    assert set(CRD_RESOURCES) == set(CRD_POD_TEMPLATES)
    want = {(g, r) for (g, _k), (r, _vs) in CRD_RESOURCES.items()}
    objs = build("gke")
    # docs/workloads.md patches these entries by index to route a CRD a WorkloadKindPolicy adds.
    for cfg, index in (("ValidatingWebhookConfiguration", 5), ("MutatingWebhookConfiguration", 3)):
        hooks = one(objs, cfg, "draguard")["webhooks"]
        (hook,) = [h for h in hooks if h["name"].startswith("workload-crds.")]
        assert hooks.index(hook) == index
        # No matchCondition: a CRD keeps its templates where only the table knows.
        assert "matchConditions" not in hook
        assert {(g, r) for g, _v, r, _o in _rules(hook)} == want


def test_fail_open_component_switches_only_validation_to_ignore() -> None:
    objs = build("gke", ("fail-open-validation",))
    vwc = one(objs, "ValidatingWebhookConfiguration", "draguard")
    assert {h["failurePolicy"] for h in vwc["webhooks"]} == {"Ignore"}
    assert {h["timeoutSeconds"] for h in vwc["webhooks"]} == {3}
    assert {
        h["failurePolicy"] for h in one(objs, "MutatingWebhookConfiguration", "draguard")["webhooks"]
    } == {"Ignore"}


def _rbac_rules(objs: tuple[Obj, ...]) -> list[tuple[Obj, Obj]]:
    return [(o, r) for o in objs if o["kind"] in {"Role", "ClusterRole"} for r in o.get("rules", [])]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_has_no_wildcards_and_secrets_only_by_name(overlay: str) -> None:
    objs = build(overlay)
    rules = _rbac_rules(objs)
    assert rules
    for role, r in rules:
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert not any("*" in x for x in r.get(field, [])), (role["metadata"]["name"], r)
        if "secrets" in r["resources"]:
            if r["verbs"] == ["create"]:
                # create cannot be narrowed by name; only the cert Job's namespaced Role holds it.
                assert (role["kind"], role["metadata"]["name"]) == ("Role", "draguard-certs")
                assert role["metadata"]["namespace"] == "draguard-system"
            else:
                assert set(r["resourceNames"]) <= {"draguard-webhook-tls", "draguard-webhook-tls-ca"}, r
                assert set(r["verbs"]) <= {"get", "update"}, r
        if (
            "mutatingwebhookconfigurations" in r["resources"]
            or "validatingwebhookconfigurations" in r["resources"]
        ):
            # Name-scoped: the certs Job patches caBundle; the webhook's injector also watches them.
            assert r["resourceNames"] == ["draguard"], r
            assert set(r["verbs"]) <= {"get", "list", "watch", "patch"} and "patch" in r["verbs"], r
    for binding in find(objs, "RoleBinding") + find(objs, "ClusterRoleBinding"):
        assert binding["roleRef"]["name"] == binding["metadata"]["name"]
        assert all(
            s["kind"] == "ServiceAccount"
            and s["namespace"] == ("draguard-driver" if s["name"] == "draguard-driver" else "draguard-system")
            for s in binding["subjects"]
        )


def _verbs(role: Obj) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for r in role["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                out.setdefault((g, res), set()).update(r["verbs"])
    return out


def test_webhook_and_driver_permissions_are_exactly_what_they_need() -> None:
    objs = build("base")
    assert _verbs(one(objs, "ClusterRole", "draguard-webhook")) == {
        ("resource.k8s.io", "resourceslices"): {"list", "watch"},
        ("resource.k8s.io", "deviceclasses"): {"list", "watch"},
        # get/list: tier verdicts read what the caches lack: a claim's owner pod, a claim a pod names,
        # the pending pods that name a user's claim (webhook/server/lookups.py).
        ("resource.k8s.io", "resourceclaims"): {"list", "watch", "get"},
        ("resource.k8s.io", "resourceclaimtemplates"): {"list", "watch", "create", "get"},
        ("", "pods"): {"get", "list"},
        ("", "namespaces"): {"list", "watch"},
        ("", "resourcequotas"): {"list", "watch"},
        # The admission inventory: taints DeviceTaintRules add, labels per-device node selectors read.
        ("resource.k8s.io", "devicetaintrules"): {"list", "watch"},
        ("", "nodes"): {"list", "watch"},
        # caBundle injection only, by name (the ValidatingAdmissionPolicy limits it to caBundle).
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): INJECTOR_VERBS,
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): INJECTOR_VERBS,
    }
    for r in one(objs, "ClusterRole", "draguard-webhook")["rules"]:
        if r["apiGroups"] == ["admissionregistration.k8s.io"]:
            assert r["resourceNames"] == ["draguard"], r
    # The webhook reads its certificate from the mounted Secret: no Secret rights at all.
    assert find(objs, "Role", "draguard-webhook") == []
    assert find(objs, "RoleBinding", "draguard-webhook") == []
    ledger = one(objs, "Role", "draguard-webhook-quota-ledger")
    assert ledger["metadata"]["namespace"] == "draguard-quota"
    assert ledger["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get", "list", "create", "update", "delete"],
        }
    ]
    assert _verbs(one(objs, "ClusterRole", "draguard-driver")) == {
        ("resource.k8s.io", "resourceslices"): {"get", "list", "watch", "create", "update", "delete"},
        ("resource.k8s.io", "resourceclaims"): {"get"},
        # Claim device status: the API server allows associated-node writes only to claims allocated on
        # the driver's own node, per driver name (below); arbitrary-node is never granted.
        ("resource.k8s.io", "resourceclaims/status"): {"patch"},
        ("resource.k8s.io", "resourceclaims/driver"): {"associated-node:patch", "associated-node:update"},
        ("", "nodes"): {"get"},
        # A Warning Event on its own Node when another GPU driver serves it (the slice policy
        # allows no other Event).
        ("events.k8s.io", "events"): {"create"},
    }
    driver_rules = one(objs, "ClusterRole", "draguard-driver")["rules"]
    (status_rule,) = [r for r in driver_rules if r["resources"] == ["resourceclaims/driver"]]
    assert status_rule["resourceNames"] == ["gpu.nvidia.com"], "only this driver's entries"
    # The audit lists and watches what it judges and consults (no get: a scan is paged lists; a
    # slice change asks for a full scan) and writes only reports.
    lw = {"list", "watch"}
    assert _verbs(one(objs, "ClusterRole", "draguard-audit")) == {
        **{("", r): lw for r in ("pods", "replicationcontrollers", "namespaces")},
        **{("apps", r): lw for r in ("deployments", "replicasets", "statefulsets", "daemonsets")},
        **{("batch", r): lw for r in ("jobs", "cronjobs")},
        **{
            ("resource.k8s.io", r): lw
            for r in ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices")
        },
        # the built-in workload CRD table, exactly
        **{(g, r): lw for (g, _k), (r, _vs) in CRD_RESOURCES.items()},
        **{
            ("wgpolicyk8s.io", r): {"get", "list", "create", "patch", "delete"}
            for r in ("policyreports", "clusterpolicyreports")
        },
    }
    sa_of = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["serviceAccountName"]
        for o in objs
        if o["kind"] in {"Deployment", "DaemonSet", "Job"}
    }
    assert sa_of == {
        "draguard-webhook": "draguard-webhook",
        "draguard-driver": "draguard-driver",
        "draguard-certs": "draguard-certs",
        "draguard-audit": "draguard-audit",
    }


def _restricted(ctr: Obj, pod: Obj, where: str) -> None:
    sc: dict[str, Any] = ctr.get("securityContext", {})
    psc: dict[str, Any] = pod.get("securityContext", {})
    assert sc.get("runAsNonRoot") or psc.get("runAsNonRoot"), where
    assert (sc.get("runAsUser") or psc.get("runAsUser", 0)) != 0, where
    assert sc.get("readOnlyRootFilesystem") is True, where
    assert sc.get("allowPrivilegeEscalation") is False, where
    assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
    assert "add" not in sc.get("capabilities", {}), where
    assert (sc.get("seccompProfile") or psc.get("seccompProfile")) == {"type": "RuntimeDefault"}, where
    assert not pod.get("hostPID") and not pod.get("hostIPC"), where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_except_the_driver_is_restricted(overlay: str) -> None:
    checked = 0
    for o in build(overlay):
        for c in containers(o):
            res = c.get("resources", {})
            where = f"{o['kind']}/{o['metadata']['name']}:{c['name']}"
            assert res.get("requests", {}).keys() >= {"cpu", "memory"}, where
            assert res.get("limits", {}).keys() >= {"cpu", "memory"}, where
            spec = (
                o["spec"]["template"]["spec"]
                if o["kind"] != "CronJob"
                else o["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            )
            if o["metadata"]["name"] == "draguard-driver":
                # Privileged by necessity (/dev/nvidia*), root for the kubelet's root-owned directories;
                # still a read-only root filesystem.
                assert c["securityContext"] == {
                    "privileged": True, "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False,
                    "readOnlyRootFilesystem": True,
                }  # fmt: skip
                continue
            _restricted(c, spec, where)
            checked += 1
    # webhook, cert Job, cert CronJob, audit
    assert checked == 4


@pytest.mark.parametrize("overlay", ["aks", "gke", "eks"])
def test_webhook_deployment_is_highly_available(overlay: str) -> None:
    objs = build(overlay)
    dep = one(objs, "Deployment", "draguard-webhook")
    spec = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert spec["priorityClassName"] == "system-cluster-critical"
    spread = {t["topologyKey"]: t for t in spec["topologySpreadConstraints"]}
    assert spread["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert spread["kubernetes.io/hostname"]["maxSkew"] == 1
    c = spec["containers"][0]
    port = next(p for p in c["ports"] if p["name"] == "https")["containerPort"]
    # Probes on their own port: the admission port may require the API server's client certificate.
    probe = next(p for p in c["ports"] if p["name"] == "probes")["containerPort"]
    assert c["args"][c["args"].index("--probe-port") + 1] == str(probe) and probe != port
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes", "scheme": "HTTP"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes", "scheme": "HTTP"}
    assert c["lifecycle"]["preStop"]["sleep"]["seconds"] >= 5
    assert spec["terminationGracePeriodSeconds"] > c["lifecycle"]["preStop"]["sleep"]["seconds"] + 3
    assert c["args"][c["args"].index("--port") + 1] == str(port)
    assert port == (443 if overlay == "gke" else 8443)
    pdb = one(objs, "PodDisruptionBudget", "draguard-webhook")
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["maxUnavailable"] == 1
    svc = one(objs, "Service", "draguard-webhook")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]
    for cfg in (
        one(objs, "MutatingWebhookConfiguration", "draguard"),
        one(objs, "ValidatingWebhookConfiguration", "draguard"),
    ):
        for h in cfg["webhooks"]:
            assert h["clientConfig"]["service"]["name"] == "draguard-webhook"
            assert h["clientConfig"]["service"]["namespace"] == "draguard-system"
            assert h["clientConfig"]["service"]["port"] == 443


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_driver_daemonset_contract(overlay: str) -> None:
    ds = one(build(overlay), "DaemonSet", "draguard-driver")
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert c["args"][:2] == ["driver", "run"]
    assert c["args"][c["args"].index("--node-name") + 1] == "$(NODE_NAME)"
    assert c["args"][c["args"].index("--driver-name") + 1] == "gpu.nvidia.com"
    assert ("--sim" in c["args"]) == (overlay == "local") and ("--real" in c["args"]) == (overlay != "local")
    vols = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    host = {vols[n]["hostPath"]["path"]: m for n, m in mounts.items() if "hostPath" in vols[n]}
    assert host["/var/lib/kubelet/plugins"]["mountPath"] == "/var/lib/kubelet/plugins"
    # DRA needs no mount propagation: the plugin only creates sockets and files there.
    assert all("mountPropagation" not in host[p] for p in ("/var/lib/kubelet/plugins", "/var/run/cdi"))
    assert host["/var/lib/kubelet/plugins_registry"]["mountPath"] == "/var/lib/kubelet/plugins_registry"
    assert host["/var/run/cdi"]["mountPath"] == "/var/run/cdi"
    assert ("/dev" in host) == (overlay != "local")
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["tolerations"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mounts_match_volumes_and_the_tls_secret(overlay: str) -> None:
    for o in build(overlay):
        spec = (
            o["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            if o["kind"] == "CronJob"
            else o["spec"]["template"]["spec"]
            if o["kind"] in {"Deployment", "DaemonSet", "Job"}
            else None
        )
        if spec is None:
            continue
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["name"] in vols, (
                    f"{o['kind']}/{o['metadata']['name']}: mount {m['name']} has no volume"
                )
        if "tls" in vols:
            assert vols["tls"]["secret"]["secretName"] == "draguard-webhook-tls"
