"""Workload CRDs in the real admission path: a CRD of the built-in table is routed by the shipped webhook
configuration and judged by its pod templates; a CRD added by a WorkloadKindPolicy is judged once its
resource is routed too."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import Kubectl, wait_for
from webhook.dev.cluster import REPO_ROOT, LocalCluster

MX_POLICY = REPO_ROOT / "tests" / "fixtures" / "workload-kinds" / "mxjob.yaml"


def _crd(plural: str, kind: str, version: str) -> str:
    return f"""\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.kubeflow.org
spec:
  group: kubeflow.org
  scope: Namespaced
  names: {{plural: {plural}, singular: {kind.lower()}, kind: {kind}, listKind: {kind}List}}
  versions:
  - name: {version}
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
"""


def _job(api: str, kind: str, replicas_key: str, ns: str, name: str, workers: int) -> str:
    """A training job with a launcher/master and `workers` x 8 device-plugin GPUs."""
    def pod(gpus: int) -> dict[str, object]:
        c: dict[str, object] = {"name": "main", "image": "nvcr.io/nvidia/pytorch:24.01-py3"}
        if gpus:
            c["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        return {"spec": {"containers": [c]}}

    return json.dumps({
        "apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": ns},
        "spec": {replicas_key: {"Master": {"replicas": 1, "template": pod(0)},
                                "Worker": {"replicas": workers, "template": pod(8)}}},
    })  # fmt: skip


@pytest.fixture(scope="module")
def crds(cluster: LocalCluster, kubectl: Kubectl) -> Iterator[None]:
    if "webhook" not in (cluster.state.get("pids") or {}):
        pytest.skip("the webhook is not part of this cluster (webhook/server missing)")
    made = kubectl.apply(
        _crd("pytorchjobs", "PyTorchJob", "v1") + "---\n" + _crd("mxjobs", "MXJob", "v1")
    )
    assert made.returncode == 0, made.stderr
    for name in ("pytorchjobs.kubeflow.org", "mxjobs.kubeflow.org"):
        kubectl.ok("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    try:
        yield
    finally:
        kubectl.run("delete", "crd", "pytorchjobs.kubeflow.org", "mxjobs.kubeflow.org", "--wait=false")


def _denied(kubectl: Kubectl, manifest: str) -> str:
    """stderr of a refused create, once the API server serves the kind (a new CRD takes a moment)."""
    def refused() -> str | None:
        proc = kubectl.run("create", "--dry-run=server", "-f", "-", input=manifest)
        return proc.stderr if proc.returncode != 0 and "denied the request" in proc.stderr else None

    return str(wait_for(refused, "the webhook to judge the workload CRD", timeout=30))


def _judged(kubectl: Kubectl, ns: str, api: str, kind: str, replicas_key: str) -> str:
    """3 workers x 8 device-plugin GPUs (24 GPU-equivalents against the team-* budget of 16) are
    denied by the workload-crds webhook and not stored; 1 worker is admitted and stored. Returns the
    denial's stderr."""
    big = _job(api, kind, replicas_key, ns, "big", workers=3)
    stderr = _denied(kubectl, big)
    assert 'admission webhook "workload-crds.validate.draguard.io" denied the request' in stderr
    assert "[quota/team-budgets]" in stderr and "24 GPU-equivalents" in stderr
    assert kubectl.apply(big).returncode != 0
    assert kubectl.run("get", kind.lower(), "big", "-n", ns).returncode != 0
    small = kubectl.apply(_job(api, kind, replicas_key, ns, "small", workers=1))
    assert small.returncode == 0, small.stderr
    assert kubectl.get(kind.lower(), "small", ns)["spec"][replicas_key]["Worker"]["replicas"] == 1
    return stderr


def test_a_pytorchjob_is_judged_by_its_pod_templates(
    crds: None, kubectl: Kubectl, namespace: Callable[..., str]
) -> None:
    _judged(kubectl, namespace("team"), "kubeflow.org/v1", "PyTorchJob", "pytorchReplicaSpecs")


@pytest.fixture
def mx_routed(cluster: LocalCluster, kubectl: Kubectl, crds: None, tmp_path: Path) -> Iterator[None]:
    """The webhook with the shipped policies plus a WorkloadKindPolicy for MXJob, and the validating
    configuration's workload-crds entry routing mxjobs, as an admin adding a CRD would set them."""
    policies = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", policies, ignore=shutil.ignore_patterns("tests"))
    shutil.copy(MX_POLICY, policies / "workload-kinds.yaml")
    shipped = Path(cluster.state["policies"])
    cluster.stop("webhook")
    cluster.start_webhook(policies)
    hooks = kubectl.get("validatingwebhookconfiguration", "draguard")["webhooks"]
    i = next(n for n, h in enumerate(hooks) if h["name"] == "workload-crds.validate.draguard.io")
    rule = {"apiGroups": ["kubeflow.org"], "apiVersions": ["v1"], "resources": ["mxjobs"],
            "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}  # fmt: skip
    kubectl.ok("patch", "validatingwebhookconfiguration", "draguard", "--type=json", "-p", json.dumps([
        {"op": "test", "path": f"/webhooks/{i}/name", "value": "workload-crds.validate.draguard.io"},
        {"op": "add", "path": f"/webhooks/{i}/rules/-", "value": rule},
    ]))  # fmt: skip
    try:
        yield
    finally:
        cluster.stop("webhook")
        # Re-registering applies the bundle's configuration again, without the added rule.
        cluster.start_webhook(shipped)
        hooks = kubectl.get("validatingwebhookconfiguration", "draguard")["webhooks"]
        assert all("mxjobs" not in r["resources"] for h in hooks for r in h["rules"])


def test_a_policy_declared_crd_is_judged_once_routed(
    mx_routed: None, kubectl: Kubectl, namespace: Callable[..., str]
) -> None:
    stderr = _judged(kubectl, namespace("team"), "kubeflow.org/v1", "MXJob", "mxReplicaSpecs")
    assert "/spec/mxReplicaSpecs/Worker/template/spec" in stderr


def test_an_unrouted_crd_is_not_judged(crds: None, kubectl: Kubectl, namespace: Callable[..., str]) -> None:
    """Without the policy and the rule (the shipped state), an MXJob never reaches the webhook."""
    ns = namespace("team")
    big = kubectl.apply(_job("kubeflow.org/v1", "MXJob", "mxReplicaSpecs", ns, "big", workers=3))
    assert big.returncode == 0, big.stderr
    assert "draguard" not in big.stderr
