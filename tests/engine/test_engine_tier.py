"""tier/<policy>: classification and the DeviceClass check, across claims, templates and the inventory."""

from __future__ import annotations

import pytest
from engine_helpers import rules, run

from webhook.core.findings import Mode
from webhook.dra.inventory import Inventory
from webhook.policy.load import parse_policy_text
from webhook.policy.model import WorkloadFacts

TEMPLATES = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: a100, namespace: ml}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com-a100}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: h100, namespace: ml}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com-h100}
---
"""


def deployment(
    template: str,
    image: str = "busybox",
    command: str = "[sleep, '1']",
    labels: str = "{}",
    kind: str = "Deployment",
) -> str:
    return f"""
apiVersion: apps/v1
kind: {kind}
metadata: {{name: w, namespace: ml}}
spec:
  template:
    metadata: {{labels: {labels}}}
    spec:
      containers:
      - name: c
        image: {image}
        command: {command}
        resources: {{claims: [{{name: g}}]}}
      resourceClaims:
      - name: g
        resourceClaimTemplateName: {template}
"""


@pytest.mark.parametrize(
    ("image", "command", "labels"),
    [
        ("vllm/vllm-openai:v0.6.3", "[python3]", "{}"),
        ("busybox", "[vllm, serve, meta-llama/Llama-3-8B]", "{}"),
        ("busybox", "[sh, -c, 'exec vllm serve x']", "{}"),
        ("busybox", "[sleep]", "{draguard.io/workload-class: llm}"),
        ("busybox", "[sleep]", "{app: my-llm-api}"),
    ],
)
def test_llm_workload_on_a100_is_denied(image: str, command: str, labels: str) -> None:
    text = TEMPLATES + deployment("a100", image, command, labels)
    (f,) = run(text).findings
    assert f.rule == "tier/gpu-tiers" and f.mode is Mode.ENFORCE and "'llm'" in f.message
    assert f.line is not None and text.splitlines()[f.line - 1].strip() == "- name: g"  # resourceClaims entry


def test_llm_workload_on_h100_is_allowed() -> None:
    assert rules(run(TEMPLATES + deployment("h100", "vllm/vllm-openai:v0.6.3"))) == []


def test_unclassified_workload_is_not_restricted() -> None:
    assert rules(run(TEMPLATES + deployment("a100"))) == []


def test_training_is_allowed_a100_but_not_mig() -> None:
    assert rules(run(TEMPLATES + deployment("a100", command="[torchrun, --nproc_per_node=1, t.py]"))) == []
    mig = TEMPLATES.replace("gpu.nvidia.com-a100}", "gpu.nvidia.com-a100-mig-3g20gb}")
    (f,) = run(mig + deployment("a100", command="[torchrun, t.py]")).findings
    assert "'training'" in f.message and 'command "torchrun"' in f.message


def test_explicit_label_wins_over_image() -> None:
    text = TEMPLATES + deployment(
        "a100", "vllm/vllm-openai:latest", labels="{draguard.io/workload-class: training}"
    )
    assert rules(run(text)) == []


@pytest.mark.parametrize("kind", ["StatefulSet", "DaemonSet", "Job", "ReplicaSet"])
def test_every_workload_kind_is_checked(kind: str) -> None:
    assert rules(run(TEMPLATES + deployment("a100", "vllm/vllm-openai:1", kind=kind))) == ["tier/gpu-tiers"]


def test_template_resolved_from_the_inventory() -> None:
    inv = Inventory.from_objects(
        [
            {
                "apiVersion": "resource.k8s.io/v1beta1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "a100", "namespace": "ml"},
                "spec": {
                    "spec": {
                        "devices": {"requests": [{"name": "g", "deviceClassName": "gpu.nvidia.com-a100"}]}
                    }
                },
            }
        ]
    )
    (f,) = run(deployment("a100", "vllm/vllm-openai:1"), inventory=inv).findings
    assert "ResourceClaimTemplate a100" in f.message
    # A template in another namespace does not resolve: no verdict rather than a guess.
    other = deployment("a100", "vllm/vllm-openai:1").replace("namespace: ml", "namespace: other")
    assert rules(run(other, inventory=inv)) == []


def test_resource_claim_and_first_available_alternatives() -> None:
    text = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: shared, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
      firstAvailable:
      - {name: big, deviceClassName: gpu.nvidia.com-h100}
      - {name: small, deviceClassName: gpu.nvidia.com-a100}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml}
spec:
  containers: [{name: c, image: vllm/vllm-openai:1, resources: {claims: [{name: g}]}}]
  resourceClaims: [{name: g, resourceClaimName: shared}]
"""
    (f,) = run(text).findings
    assert "gpu.nvidia.com-a100" in f.message and "ResourceClaim shared" in f.message


def test_scope_and_audit_mode() -> None:
    policy = """
apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata: {name: llm}
spec:
  mode: audit
  namespaces: ["ml"]
  classes:
  - {name: llm, match: {images: ["*vllm*"]}, deviceClasses: [gpu.nvidia.com-h100]}
"""
    (f,) = run(TEMPLATES + deployment("a100", "vllm/vllm-openai:1"), policies=policy).findings
    assert f.rule == "tier/llm" and f.mode is Mode.AUDIT
    other = (TEMPLATES + deployment("a100", "vllm/vllm-openai:1")).replace("namespace: ml", "namespace: dev")
    assert run(other, policies=policy).findings == []


def test_classification_order_labels_then_images_then_commands() -> None:
    pset = parse_policy_text("""
apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata: {name: t}
spec:
  classes:
  - {name: a, match: {commands: [python*]}, deviceClasses: [x]}
  - {name: b, match: {images: ["*img*"]}, deviceClasses: [x]}
  - {name: c, match: {annotations: {team/kind: "c*"}}, deviceClasses: [x]}
""")
    (pol,) = pset.tier
    facts = WorkloadFacts({}, {"team/kind": "cv"}, ("img:1",), ("/usr/bin/python3",))
    assert pol.classify(facts).tier.name == "c"  # type: ignore[union-attr]
    facts = WorkloadFacts({}, {}, ("img:1",), ("/usr/bin/python3",))
    assert pol.classify(facts).tier.name == "b"  # type: ignore[union-attr]
    facts = WorkloadFacts({}, {}, ("other",), ("/usr/bin/python3",))
    assert pol.classify(facts).tier.name == "a"  # type: ignore[union-attr]
    assert pol.classify(WorkloadFacts({}, {}, (), ())) is None
