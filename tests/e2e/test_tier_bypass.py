"""Ways around the tier policy, each tried through the real API server and shown closed.

* a vLLM pod asking for A100s as a KEP-5004 extended resource (the DeviceClass's implicit
  `deviceclass.resource.kubernetes.io/<class>` name, or a class's `extendedResourceName`);
* a vLLM pod created before its claim template: the claim the resourceclaim controller makes from the
  template is judged by the pod's class;
* a template created a moment before its pod: judged from the API server, whatever the watch saw;
* a vLLM pod labelled `draguard.io/workload-class: training`;
* a namespace owner relabelling the namespace's `draguard.io/*` labels (ValidatingAdmissionPolicy).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import Kubectl, wait_for
from webhook.dev import scenarios
from webhook.dev.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
VLLM = "vllm/vllm-openai:v0.6.3"
IMPLICIT = "deviceclass.resource.kubernetes.io/"


@pytest.fixture(autouse=True)
def _webhook(cluster: LocalCluster) -> None:
    if "webhook" not in (cluster.state.get("pids") or {}):
        pytest.fail("the webhook is not part of this cluster", pytrace=False)


def ext_pod(ns: str, name: str, resource: str, image: str = VLLM) -> str:
    return f"""\
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}}}
spec:
  containers:
  - name: server
    image: {image}
    resources:
      limits: {{{resource}: "1"}}
"""


def template(ns: str, name: str, device_class: str) -> str:
    return f"""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}, namespace: {ns}}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {{deviceClassName: {device_class}, count: 1}}
"""


def claim_pod(ns: str, name: str, tmpl: str, image: str = VLLM, labels: str = "{}") -> str:
    return f"""\
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}, labels: {labels}}}
spec:
  containers:
  - name: server
    image: {image}
    resources: {{claims: [{{name: gpu}}]}}
  resourceClaims: [{{name: gpu, resourceClaimTemplateName: {tmpl}}}]
"""


def a100_class(name: str, resource: str) -> dict[str, Any]:
    """A DeviceClass of whole A100s that also serves the extended resource `resource`."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "extendedResourceName": resource,
            "selectors": [
                {
                    "cel": {
                        "expression": "device.driver == 'gpu.nvidia.com' && "
                        "device.attributes['gpu.nvidia.com'].type == 'gpu' && "
                        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100 80GB PCIe'"
                    }
                }
            ],
        },
    }


def denied_by_tier(proc: Any, hook: str = "pods.validate.draguard.io") -> None:
    assert proc.returncode != 0, proc.stdout
    assert f'admission webhook "{hook}" denied the request' in proc.stderr, proc.stderr
    assert "[tier/gpu-tiers]" in proc.stderr and "'llm'" in proc.stderr, proc.stderr


# -- KEP-5004 extended resources ----------------------------------------------------------------


def test_vllm_on_a100_through_the_implicit_extended_resource_is_denied(
    kubectl: Kubectl, namespace: Callable[..., str]
) -> None:
    ns = namespace("ext")
    denied = kubectl.apply(ext_pod(ns, "vllm-a100", IMPLICIT + scenarios.A100))
    denied_by_tier(denied)
    assert f"extended resource {IMPLICIT}{scenarios.A100}" in denied.stderr
    assert kubectl.run("get", "pod", "vllm-a100", "-n", ns).returncode != 0

    admitted = kubectl.apply(ext_pod(ns, "vllm-h100", IMPLICIT + scenarios.H100))
    assert admitted.returncode == 0, admitted.stderr

    # The scheduler serves the request through DRA with a claim it creates for the pod (owned by
    # it); that claim passes through the webhook too and is admitted, H100 being the llm tier.
    def claimed() -> dict[str, Any] | None:
        pod = kubectl.get("pod", "vllm-h100", ns)
        status = pod["status"].get("extendedResourceClaimStatus") or {}
        return pod if status.get("resourceClaimName") and pod["spec"].get("nodeName") else None

    pod = wait_for(claimed, "the H100 pod scheduled with its extended-resource claim", timeout=90)
    claim = kubectl.get(
        "resourceclaim", pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"], ns
    )
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
    [owner] = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "vllm-h100", pod["metadata"]["uid"])
    assert pod["spec"]["nodeName"] == "gpu-h100-0"


def test_vllm_on_a100_through_a_declared_extended_resource_name_is_denied(
    kubectl: Kubectl, namespace: Callable[..., str]
) -> None:
    ns = namespace("ext-name")
    name = f"e2e-a100-{uuid.uuid4().hex[:6]}"
    resource = f"example.com/{name}"
    made = kubectl.apply(json.dumps(a100_class(name, resource)))
    assert made.returncode == 0, made.stderr
    try:
        pod = ext_pod(ns, "vllm-named", resource)
        # The webhook learns of the new class from its watch: probe with server dry runs until it does.
        wait_for(
            lambda: kubectl.run("apply", "--dry-run=server", "-f", "-", input=pod).returncode != 0,
            "the webhook to know the new DeviceClass",
            timeout=30,
        )
        denied = kubectl.apply(pod)
        denied_by_tier(denied)
        assert f"served by DeviceClass {name}" in denied.stderr
    finally:
        kubectl.run("delete", "deviceclass", name, "--wait=false")


def test_a_class_declared_after_the_pod_still_cannot_serve_it_a100s(
    kubectl: Kubectl, namespace: Callable[..., str]
) -> None:
    """The pod came first, when no class served its resource: the scheduler's claim is judged."""
    ns = namespace("ext-late")
    name = f"e2e-late-{uuid.uuid4().hex[:6]}"
    resource = f"example.com/{name}"
    made = kubectl.apply(ext_pod(ns, "vllm-late", resource))
    assert made.returncode == 0, made.stderr  # nothing serves example.com/... yet: not draguard's to judge
    made = kubectl.apply(json.dumps(a100_class(name, resource)))
    assert made.returncode == 0, made.stderr
    try:

        def refused() -> list[dict[str, Any]]:
            # The scheduler retries a refused claim: under load an earlier try may have been refused
            # because the pod could not be read in time (the rule fails closed); wait for the verdict.
            return [
                e
                for e in _events(kubectl, ns, "vllm-late")
                if e.get("reason") == "FailedScheduling"
                and "tier/gpu-tiers" in e.get("message", "")
                and f"requests {name}" in e.get("message", "")
            ]

        [event, *_] = wait_for(refused, "the scheduler's claim for the pod to be refused", timeout=90)
        assert "workload class 'llm'" in event["message"], event["message"]
        assert not kubectl.get("pod", "vllm-late", ns)["spec"].get("nodeName")
        assert [c["metadata"]["name"] for c in kubectl.items("resourceclaims", ns)] == []
    finally:
        kubectl.run("delete", "deviceclass", name, "--wait=false")


# -- claims made from templates -----------------------------------------------------------------


def _events(kubectl: Kubectl, ns: str, pod: str) -> list[dict[str, Any]]:
    return [e for e in kubectl.items("events", ns) if e["involvedObject"].get("name") == pod]


def test_pod_before_its_template_cannot_get_a100s(kubectl: Kubectl, namespace: Callable[..., str]) -> None:
    ns = namespace("order")
    # The template does not exist yet, so the pod itself cannot be judged: it is admitted and waits.
    made = kubectl.apply(claim_pod(ns, "early", "later-a100"))
    assert made.returncode == 0, made.stderr
    made = kubectl.apply(template(ns, "later-a100", scenarios.A100))
    assert made.returncode == 0, made.stderr

    # The resourceclaim controller now makes the pod's claim from the template; draguard judges it
    # by the pod's class and refuses it, and the controller reports that on the pod.
    def refused() -> list[dict[str, Any]]:
        return [
            e
            for e in _events(kubectl, ns, "early")
            if e.get("reason") == "FailedResourceClaimCreation" and "tier/gpu-tiers" in e.get("message", "")
        ]

    [event, *_] = wait_for(refused, "the controller's claim for the early pod to be refused", timeout=60)
    assert scenarios.A100 in event["message"] and "pod early's workload class 'llm'" in event["message"]
    assert [c["metadata"]["name"] for c in kubectl.items("resourceclaims", ns)] == []
    assert not kubectl.get("pod", "early", ns)["spec"].get("nodeName")

    # The same order with an H100 template: the claim is made and the pod is scheduled.
    assert kubectl.apply(claim_pod(ns, "early-h100", "later-h100")).returncode == 0
    assert kubectl.apply(template(ns, "later-h100", scenarios.H100)).returncode == 0

    def scheduled() -> dict[str, Any] | None:
        pod = kubectl.get("pod", "early-h100", ns)
        return pod if pod["spec"].get("nodeName") and pod["status"].get("resourceClaimStatuses") else None

    pod = wait_for(scheduled, "the early H100 pod to get its claim and a node", timeout=90)
    assert pod["spec"]["nodeName"] == "gpu-h100-0"


def test_a_template_made_a_moment_before_its_pod_is_judged_at_once(
    kubectl: Kubectl, namespace: Callable[..., str]
) -> None:
    """No waiting for the watch: the webhook reads a template it has not seen from the API server."""
    ns = namespace("fresh")
    for i in range(3):
        assert kubectl.apply(template(ns, f"fresh-{i}", scenarios.A100)).returncode == 0
        denied = kubectl.apply(claim_pod(ns, f"vllm-{i}", f"fresh-{i}"))
        denied_by_tier(denied)
        assert f"ResourceClaimTemplate fresh-{i}" in denied.stderr


def test_a_label_does_not_move_vllm_onto_a100s(kubectl: Kubectl, namespace: Callable[..., str]) -> None:
    ns = namespace("relabel")
    assert kubectl.apply(template(ns, "a100", scenarios.A100)).returncode == 0
    denied = kubectl.apply(claim_pod(ns, "sneaky", "a100", labels="{draguard.io/workload-class: training}"))
    denied_by_tier(denied)
    assert "does not widen" in denied.stderr
    # Code launched as a Python module from a custom image is recognised too.
    module_pod = claim_pod(ns, "module", "a100", image="registry.example.com/serving:1").replace(
        "    resources:", "    command: [python3, -m, vllm.entrypoints.openai.api_server]\n    resources:"
    )
    denied_by_tier(kubectl.apply(module_pod))


# -- namespace labels -----------------------------------------------------------------------------


@pytest.fixture
def label_policy(kubectl: Kubectl) -> Iterator[None]:
    """The bundle's namespace-label policy, plus a namespace editor who is no namespace-label admin."""
    policy = (REPO / "kustomize" / "base" / "namespace-labels" / "policy.yaml").read_text()
    editor = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: e2e-namespace-editor}
rules:
- {apiGroups: [""], resources: [namespaces], verbs: [get, list, create, update, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: e2e-namespace-editor}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: e2e-namespace-editor}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant}
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: platform}
---
# How docs/tiers.md says to grant the right: the bundle's ClusterRole, bound to a group.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: e2e-namespace-label-admins}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: draguard-namespace-labels}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: e2e:platform}
"""
    for doc in (policy, editor):
        made = kubectl.apply(doc)
        assert made.returncode == 0, made.stderr
    yield
    kubectl.run("delete", "-f", "-", "--wait=false", input=policy)
    kubectl.run("delete", "-f", "-", "--wait=false", input=editor)


def _as(
    kubectl: Kubectl, user: str, *args: str, groups: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    who = [f"--as={user}", *(f"--as-group={g}" for g in groups)]
    return kubectl.run(*args, *who)  # type: ignore[no-any-return]


def test_only_namespace_label_admins_change_draguard_labels(
    kubectl: Kubectl, namespace: Callable[..., str], label_policy: None
) -> None:
    ns = namespace("labels", {"draguard.io/team": "ml", "draguard.io/migration-mode": "enforce"})
    # Policies take effect a moment after they are created: probe with a server dry run until it bites.
    wait_for(
        lambda: _as(kubectl, "tenant", "label", "ns", ns, "--overwrite", "draguard.io/team=other",
                    "--dry-run=server").returncode != 0,
        "the namespace-label policy to be in force",
        timeout=60,
    )  # fmt: skip
    for change in (
        ["draguard.io/team=research", "--overwrite"],  # another team's budget
        ["draguard.io/migration-mode=observe", "--overwrite"],  # out of enforcement
        ["draguard.io/migration-mode-"],  # removing it counts too
        ["draguard.io/new=1"],
        # DRA admin access: claims in such a namespace reach devices allocated to other tenants.
        ["resource.kubernetes.io/admin-access=true"],
    ):
        out = _as(kubectl, "tenant", "label", "ns", ns, *change)
        assert out.returncode != 0, (change, out.stdout)
        assert "ValidatingAdmissionPolicy 'draguard-namespace-labels'" in out.stderr, out.stderr
        assert "needs the set verb on namespacelabels.policy.draguard.io" in out.stderr, out.stderr
    labels = kubectl.get("namespace", ns)["metadata"]["labels"]
    assert (labels["draguard.io/team"], labels["draguard.io/migration-mode"]) == ("ml", "enforce")

    assert "resource.kubernetes.io/admin-access" not in labels
    # Other labels stay the editor's to change.
    assert _as(kubectl, "tenant", "label", "ns", ns, "owner=alice").returncode == 0
    # Creating a namespace with a draguard.io label is a change too.
    fresh = f"labels-new-{uuid.uuid4().hex[:6]}"
    doc = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": fresh,
                      "labels": {"draguard.io/team": "ml"}}})  # fmt: skip
    out = kubectl.run("create", "-f", "-", "--dry-run=server", "--as=tenant", input=doc)
    assert out.returncode != 0 and "draguard.io/team" in out.stderr, out.stderr

    # A member of a group bound to ClusterRole draguard-namespace-labels (and a cluster admin) may.
    ok = _as(kubectl, "platform", "label", "ns", ns, "--overwrite", "draguard.io/team=research",
             groups=("e2e:platform",))  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert kubectl.run("label", "ns", ns, "--overwrite", "draguard.io/team=ml").returncode == 0
    assert kubectl.get("namespace", ns)["metadata"]["labels"]["draguard.io/team"] == "ml"
    admin = _as(kubectl, "platform", "label", "ns", ns, "resource.kubernetes.io/admin-access=true",
                groups=("e2e:platform",))  # fmt: skip
    assert admin.returncode == 0, admin.stderr
    # Taking it away again is the label admins' call too.
    out = _as(kubectl, "tenant", "label", "ns", ns, "resource.kubernetes.io/admin-access-")
    assert out.returncode != 0 and "resource.kubernetes.io/admin-access" in out.stderr, out.stderr


def test_a_claim_swapped_under_a_waiting_pod_keeps_to_its_class(
    kubectl: Kubectl, namespace: Callable[..., str]
) -> None:
    ns = namespace("swap")
    claim = f"""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: shared, namespace: {ns}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {{deviceClassName: {scenarios.H100}, count: 1}}
"""
    assert kubectl.apply(claim).returncode == 0
    # The pod is admitted against the H100 claim; no node fits it (nodeSelector), so it waits.
    pod = claim_pod(ns, "waiting", "shared").replace(
        "resourceClaimTemplateName: shared", "resourceClaimName: shared"
    )
    pod = pod.replace("spec:\n", "spec:\n  nodeSelector: {e2e/none: none}\n", 1)  # Pod's only spec
    made = kubectl.apply(pod)
    assert made.returncode == 0, made.stderr
    assert kubectl.ok("delete", "resourceclaim", "shared", "-n", ns)
    swapped = kubectl.apply(claim.replace(scenarios.H100, scenarios.A100))
    denied_by_tier(swapped, hook="dra.validate.draguard.io")
    # The waiting pod was read from the API server on the claim's behalf: the answer says a pod waits
    # for the claim and why it decides, but quotes nothing of it (a forged review could name any
    # namespace; see webhook/server/lookups.py).
    assert "which pod <hidden> waits for, requests gpu.nvidia.com-a100" in swapped.stderr, swapped.stderr
    assert "waiting" not in swapped.stderr
    assert kubectl.apply(claim).returncode == 0  # the same devices again are fine
