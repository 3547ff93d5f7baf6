"""The whole bundle (kustomize/overlays/local) synced by the GitOps engines themselves on the real
node, until it is healthy by each engine's own judgement:

* tools/argosync (Argo CD's gitops-engine): a first sync from empty ends with every object Healthy
  (webhook and audit Deployments available, the driver DaemonSet rolled out, the certificate hook
  Job complete); a second sync changes nothing and keeps caBundle; a `Replace=true` sync ends
  healthy (caBundle comes back); a sync started while no webhook pod runs completes and ends healthy.
* tools/fluxapply (Flux's fluxcd/pkg/ssa, configured as kustomize-controller): a first sync from
  empty and a re-sync, each waited for with kstatus until every object is Current.

After each sync the webhook configurations must serve: an A100 LLM Deployment is denied through the
Service with the injected caBundle. The module starts from an empty install (the session harness's
webhook configurations and DeviceClasses removed, the node's host driver stopped) and gives the
session cluster back as it found it: host webhook registered by URL, host driver running.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.helpers import Kubectl, wait_for
from tests.gotool import go_tool
from webhook.dev import addons, scenarios
from webhook.dev.cluster import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONFIG_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
NAMESPACES = ("draguard-system", "draguard-driver")
SYNC_TIMEOUT = 300


def _as_list(objs: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})


def clear(cluster: LocalCluster, kubectl: Kubectl) -> None:
    """Delete every object of the bundle but its Namespaces (which the session harness shares), and
    what the certificate Job wrote; wait until the pods are gone."""
    objs = addons.bundle_objects(cluster)
    for ns in NAMESPACES:
        # gitops-engine puts a finalizer on hook Jobs; nothing removes it once the sync is over.
        for job in kubectl.run("get", "jobs", "-n", ns, "-o", "name").stdout.split():
            kubectl.run("patch", job, "-n", ns, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    # Configurations first: a fail-closed webhook with no pod behind it would refuse nothing the
    # deletes need, but the session's host webhook must not see a half-deleted bundle either.
    hooks = [o for o in objs if o["kind"] in CONFIG_KINDS]
    rest = [o for o in objs if o["kind"] not in (*CONFIG_KINDS, "Namespace")]
    for batch in (hooks, rest):
        kubectl.ok("delete", "--ignore-not-found", "--cascade=foreground", "--wait=true", "--timeout=180s",
                   "-f", "-", input=_as_list(batch))  # fmt: skip
    for ns in NAMESPACES:
        kubectl.ok(
            "delete", "jobs", "--all", "-n", ns, "--cascade=foreground", "--wait=true", "--timeout=120s"
        )
    kubectl.ok("delete", "secret", "draguard-webhook-tls", "-n", "draguard-system", "--ignore-not-found")
    for kind in ("deviceclasses", "validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        left = kubectl.items(kind, None, "-l", "app.kubernetes.io/part-of=draguard")
        assert not left, f"{kind} left after clearing: {[o['metadata']['name'] for o in left]}"
    for ns in NAMESPACES:
        assert not kubectl.items("pods", ns), f"pods left in {ns}"


@pytest.fixture(scope="module")
def empty(cluster: LocalCluster, kubectl: Kubectl, real_node: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Path]:  # fmt: skip
    """No draguard object but the Namespaces; yields the manifests file the engines sync."""
    cluster.stop(f"driver-{real_node}")
    kube = cluster.kube()
    for s in kube.get(f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{real_node}"
                      ).get("items") or []:  # fmt: skip
        kube.delete(f"/apis/resource.k8s.io/v1/resourceslices/{s['metadata']['name']}")
    manifests = tmp_path_factory.mktemp("gitops") / "local.yaml"
    manifests.write_text(yaml.safe_dump_all(addons.bundle_objects(cluster)))
    try:
        clear(cluster, kubectl)
        yield manifests
    finally:
        clear(cluster, kubectl)
        addons.remove_bundle(cluster)  # the host webhook registered again, the host driver started


def _tool(name: str, cluster: LocalCluster, manifests: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    t0 = time.monotonic()
    res = subprocess.run(
        [str(go_tool(name)), "--kubeconfig", str(cluster.kubeconfig), "--manifests", str(manifests),
         "--timeout", f"{SYNC_TIMEOUT}s", *extra],
        capture_output=True, text=True, timeout=SYNC_TIMEOUT + 60, check=False,
    )  # fmt: skip
    assert res.stdout.strip(), f"{name} printed nothing (rc {res.returncode}):\n{res.stderr[-3000:]}"
    print(f"{name} {' '.join(extra)}: rc {res.returncode} in {time.monotonic() - t0:.1f}s")
    return res.returncode, json.loads(res.stdout)


def _argo_healthy(rc: int, rep: dict[str, Any]) -> None:
    assert rc == 0 and rep["phase"] == "Succeeded", json.dumps(rep, indent=1)[-4000:]
    sick = [h for h in rep["health"] if h["health"] != "Healthy"]
    assert not sick, sick
    health = {(h["kind"], h["name"]) for h in rep["health"]}
    assert {("Deployment", "draguard-webhook"), ("Deployment", "draguard-audit"),
            ("DaemonSet", "draguard-driver"), ("ValidatingWebhookConfiguration", "draguard"),
            ("MutatingWebhookConfiguration", "draguard")} <= health  # fmt: skip
    hooks = [r for r in rep["results"] if r["kind"] == "Job" and r["name"] == "draguard-certs"]
    assert hooks and all(r.get("hookPhase") == "Succeeded" for r in hooks), hooks


def _ca_bundles(kubectl: Kubectl) -> set[str]:
    cfgs = [kubectl.get(k.lower(), "draguard") for k in CONFIG_KINDS]
    return {str(h["clientConfig"].get("caBundle") or "") for c in cfgs for h in c["webhooks"]}


def _serves(kubectl: Kubectl, ns: str) -> str:
    """The bundle's webhook judges through its Service: an A100 LLM Deployment is denied. Returns the
    one caBundle both configurations carry."""
    for kind in CONFIG_KINDS:
        for hook in kubectl.get(kind.lower(), "draguard")["webhooks"]:
            assert hook["clientConfig"]["service"]["name"] == "draguard-webhook", hook["clientConfig"]

    def whole() -> set[str] | None:
        bundles = _ca_bundles(kubectl)
        return bundles if "" not in bundles and len(bundles) == 1 else None

    [ca] = wait_for(whole, "one caBundle in every webhook", 60)
    assert kubectl.apply(scenarios.llm_template(ns, scenarios.A100)).returncode == 0

    def denied() -> str | None:
        proc = kubectl.apply(scenarios.llm_deployment(ns, scenarios.A100), "--dry-run=server")
        return proc.stderr if proc.returncode != 0 and "denied" in proc.stderr else None

    assert "draguard" in wait_for(denied, "the bundle's webhook to deny an A100 LLM Deployment", 60)
    return str(ca)


def _versions(kubectl: Kubectl, manifests: Path) -> dict[str, str]:
    """What a no-op sync leaves alone: each object's generation (its spec) or, for objects without
    one, its resourceVersion. The certificate Job is a hook, recreated by design on every sync."""
    live = json.loads(kubectl.ok("get", "-f", str(manifests), "-o", "json"))["items"]
    out = {}
    for obj in live:
        meta = obj["metadata"]
        if obj["kind"] != "Job":
            key = f"{obj['kind']}/{meta.get('namespace', '')}/{meta['name']}"
            out[key] = str(meta.get("generation") or meta["resourceVersion"])
    return out


def _webhook_pods(kubectl: Kubectl) -> list[dict[str, Any]]:
    return kubectl.items("pods", "draguard-system", "-l", "app.kubernetes.io/name=draguard-webhook")


@pytest.mark.timeout(1800)
def test_argo_cd_syncs_the_bundle_healthy_on_the_real_node(
    cluster: LocalCluster, kubectl: Kubectl, empty: Path, namespace: Callable[..., str]
) -> None:
    clear(cluster, kubectl)
    ns = namespace("argo")

    # First sync from empty: each wave healthy before the next, the last one the configurations.
    rc, first = _tool("argosync", cluster, empty)
    _argo_healthy(rc, first)
    waves = {(r["kind"], r["name"]): r["order"] for r in first["results"]}
    assert max(waves[("Deployment", "draguard-webhook")], waves[("DaemonSet", "draguard-driver")]) < min(
        waves[(k, "draguard")] for k in CONFIG_KINDS
    ), waves
    ca = _serves(kubectl, ns)
    versions = _versions(kubectl, empty)

    # Second sync: no object written (the hook Job runs again, by its delete policy), so no rollout,
    # and caBundle kept. kubectl's client-side apply may still send a patch that changes nothing (an
    # atomic list against its defaulted live copy), so what counts is what the API server stored.
    rc, second = _tool("argosync", cluster, empty)
    _argo_healthy(rc, second)
    after = _versions(kubectl, empty)
    assert {k: (v, after.get(k)) for k, v in versions.items() if after.get(k) != v} == {}
    assert _ca_bundles(kubectl) == {ca}

    # Replace=true: kubectl replace wipes caBundle; the webhook pods' injector writes it back.
    rc, replaced = _tool("argosync", cluster, empty, "--replace")
    _argo_healthy(rc, replaced)
    assert any(r.get("message", "").endswith(" replaced") for r in replaced["results"]), replaced["results"]
    assert _serves(kubectl, ns) == ca

    # No webhook pod at all when the sync starts: its dry-runs and applies of the bundle never wait
    # on the webhook, the sync scales it back up and ends healthy once the pods serve.
    kubectl.ok("scale", "deployment/draguard-webhook", "-n", "draguard-system", "--replicas=0")
    kubectl.ok("wait", "--for=delete", "pod", "-l", "app.kubernetes.io/name=draguard-webhook",
               "-n", "draguard-system", "--timeout=120s")  # fmt: skip
    assert not _webhook_pods(kubectl)
    rc, down = _tool("argosync", cluster, empty)
    _argo_healthy(rc, down)
    assert len([p for p in _webhook_pods(kubectl) if not p["metadata"].get("deletionTimestamp")]) == 3
    assert _serves(kubectl, ns) == ca


def _flux_current(rc: int, rep: dict[str, Any]) -> None:
    assert rc == 0 and rep["applied"] and rep["waited"] and rep["ready"], json.dumps(rep, indent=1)[-4000:]
    subjects = {c["subject"] for c in rep["changes"]}
    for subject in (
        "Deployment/draguard-system/draguard-webhook",
        "DaemonSet/draguard-driver/draguard-driver",
        "Job/draguard-system/draguard-certs",
        "ValidatingWebhookConfiguration/draguard",
    ):
        assert subject in subjects, sorted(subjects)


@pytest.mark.timeout(1200)
def test_flux_syncs_the_bundle_current_on_the_real_node(
    cluster: LocalCluster, kubectl: Kubectl, empty: Path, namespace: Callable[..., str]
) -> None:
    clear(cluster, kubectl)
    ns = namespace("flux")

    # One staged server-side apply of everything, then kstatus until every object is Current.
    rc, first = _tool("fluxapply", cluster, empty, "--wait")
    _flux_current(rc, first)
    assert {c["action"] for c in first["changes"] if not c["subject"].startswith("Namespace/")} == {"created"}
    ca = _serves(kubectl, ns)
    versions = _versions(kubectl, empty)

    # Re-sync: Flux's dry-run diff finds nothing to apply, and the API server stored nothing new.
    rc, second = _tool("fluxapply", cluster, empty, "--wait")
    _flux_current(rc, second)
    changed = [c for c in second["changes"] if c["action"] != "unchanged"]
    assert not changed, changed
    after = _versions(kubectl, empty)
    assert {k: (v, after.get(k)) for k, v in versions.items() if after.get(k) != v} == {}
    assert _ca_bundles(kubectl) == {ca}
