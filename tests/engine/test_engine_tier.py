"""tier/<policy>: classification and the DeviceClass check, across claims, templates and the inventory."""

from __future__ import annotations

import pytest
from engine_helpers import objs, rules, run

from webhook.core.findings import Mode
from webhook.dra.inventory import Inventory
from webhook.engine import resolve
from webhook.engine.context import Context
from webhook.engine.rules import tier
from webhook.policy.load import PolicyError, parse_policy_text
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


def test_a_label_cannot_move_a_detected_llm_off_its_tier() -> None:
    # The label once overrode image detection: a vLLM pod labelled `training` got A100s.
    text = TEMPLATES + deployment(
        "a100", "vllm/vllm-openai:latest", labels="{draguard.io/workload-class: training}"
    )
    (f,) = run(text).findings
    assert f.mode is Mode.ENFORCE and "'llm'" in f.message and 'image "vllm/vllm-openai:latest"' in f.message
    assert "label draguard.io/workload-class=training does not widen" in f.fix
    assert "relabelTo" in f.fix and "PolicyException" in f.fix


def test_an_explicit_label_wins_when_nothing_else_speaks() -> None:
    text = TEMPLATES + deployment(
        "h100", "example.com/app:1", labels="{draguard.io/workload-class: training}"
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


# -- LLM detection ------------------------------------------------------------------------------


def pod(image: str, command: str = "[]", args: str = "[]", labels: str = "{}", claim: str = "a100") -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: p, namespace: ml, labels: {labels}}}
spec:
  containers:
  - name: c
    image: {image}
    command: {command}
    args: {args}
    resources: {{claims: [{{name: g}}]}}
  resourceClaims: [{{name: g, resourceClaimTemplateName: {claim}}}]
"""


@pytest.mark.parametrize(
    ("image", "command", "args", "reason"),
    [
        ("example.com/py:3.12", "[python, -m, vllm.entrypoints.openai.api_server]", "[--model, m]", "vllm"),
        ("example.com/py:3.12", "[python3]", "[-m, vllm.entrypoints.api_server]", "vllm"),
        (
            "example.com/py:3.12",
            "[/opt/venv/bin/python3, -u, -mvllm.entrypoints.openai.api_server]",
            "[]",
            "vllm",
        ),
        (
            "example.com/py:3.12",
            "[bash, -c]",
            "['exec python3 -m vllm.entrypoints.openai.api_server']",
            "vllm",
        ),
        ("example.com/py:3.12", "[python3, -m, sglang.launch_server]", "[--model-path, m]", "sglang"),
        ("lmsysorg/sglang:v0.4.1-cu124", "[]", "[]", "sglang"),
        ("ghcr.io/huggingface/text-generation-inference:2.4", "[]", "[]", "text-generation-inference"),
        ("example.com/tgi:1", "[text-generation-launcher]", "[--model-id, m]", "text-generation-launcher"),
        ("nvcr.io/nvidia/tensorrt-llm/release:0.17.0", "[]", "[]", "tensorrt-llm"),
        ("example.com/trt:1", "[trtllm-serve]", "[m]", "trtllm-serve"),
        ("nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3", "[tritonserver]", "[]", "trtllm"),
        ("nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3.3", "[]", "[]", "nvcr.io/nim"),
        ("ghcr.io/ggml-org/llama.cpp:server-cuda", "[]", "[]", "llama.cpp"),
        ("example.com/gguf-runner:1", "[/app/llama-server]", "[-m, /models/q.gguf]", "llama-server"),
        ("ollama/ollama:0.5.4", "[]", "[]", "ollama"),
        ("example.com/ollama-base:1", "[ollama]", "[serve]", "ollama"),
        # A server's name glued to its version in a tag (verl's images).
        ("hiyouga/verl:ngc-th2.6.0-cu126-vllm0.8.4-flashinfer0.2.2-cxx11abi0", "[]", "[]", "verl"),
        ("example.com/rl:1", "[python3, -m, verl.trainer.main_ppo]", "[]", "verl"),
        ("openmmlab/lmdeploy:v0.7.0-cu12", "[]", "[]", "lmdeploy"),
        ("example.com/py:3.12", "[lmdeploy, serve, api_server]", "[internlm/internlm2_5-7b]", "lmdeploy"),
        ("rayproject/ray-llm:2.46.0-py311-cu124", "[]", "[]", "ray-llm"),
        ("nvcr.io/nvidia/tritonserver:24.08-vllm-python-py3", "[tritonserver]", "[]", "vllm"),
        ("example.com/trt:1", "[python3, -m, tensorrt_llm.commands.serve]", "[m]", "tensorrt_llm"),
        ("example.com/py:3.12", "[python3, -m, llama_cpp.server]", "[--model, m.gguf]", "llama_cpp"),
        ("example.com/py:3.12", "[python3, -m, sglang.launch_server]", "[]", "sglang"),
    ],
)
def test_llm_servers_are_detected_from_image_command_and_args(
    image: str, command: str, args: str, reason: str
) -> None:
    (f,) = run(TEMPLATES + pod(image, command, args)).findings
    assert f.rule == "tier/gpu-tiers" and "'llm'" in f.message and reason in f.message
    assert "gpu.nvidia.com-a100" in f.message
    # The same workload on an H100 is fine.
    assert run(TEMPLATES + pod(image, command, args, claim="h100")).findings == []


@pytest.mark.parametrize(
    ("image", "command", "args", "labels"),
    [
        ("example.com/embed:1", "[]", "[]", "{app: allminilm-embedder}"),
        ("example.com/allminilm:1", "[python3, -m, http.server]", "[]", "{}"),
        ("example.com/py:1", "[python3, train.py]", "[-m, vllm.cfg]", "{}"),  # the script's -m
        ("example.com/tools:1", "[llama-bench]", "[-m, vllm.gguf]", "{}"),
        ("example.com/vllmx:1", "[]", "[]", "{app.kubernetes.io/name: smallmodels}"),
        # Embedding and vision servers.
        ("ghcr.io/huggingface/text-embeddings-inference:1.5", "[]", "[--model-id, BAAI/bge-large]", "{}"),
        ("nvcr.io/nvidia/tritonserver:24.01-py3", "[tritonserver]", "[--model-repository=/m/resnet50]", "{}"),
        # A version glued to another name gives only that name (py3.11: py), nothing an LLM is known by.
        ("example.com/verlx:py3.11-cu12.4", "[]", "[]", "{}"),
    ],
)
def test_lookalikes_are_not_llm(image: str, command: str, args: str, labels: str) -> None:
    assert run(TEMPLATES + pod(image, command, args, labels)).findings == []


def test_llm_label_words_match_whole_words() -> None:
    for value in ("chat-llm", "llm-inference", "my.llm.api"):
        (f,) = run(TEMPLATES + pod("busybox", labels=f"{{app: {value}}}")).findings
        assert f"label app={value}" in f.message
    assert run(TEMPLATES + pod("busybox", labels="{app: allminilm-embedder}")).findings == []


def test_python_modules() -> None:
    assert tier.python_modules(["python3", "-m", "vllm.entrypoints.openai.api_server"]) == [
        "vllm.entrypoints.openai.api_server"
    ]
    assert tier.python_modules(["sh", "-c", "exec", "python", "-u", "-msglang.launch_server", "--x"]) == [
        "sglang.launch_server"
    ]
    assert tier.python_modules(["python", "-c", "import vllm", "-m", "vllm"]) == []
    assert tier.python_modules(["llama-server", "-m", "m.gguf"]) == []


# -- a label or annotation cannot widen what the evidence allows --------------------------------

RELABEL_POLICY = """
apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata: {name: t}
spec:
  classes:
  - name: llm
    match: {images: ["*vllm*"]}
    deviceClasses: [gpu.nvidia.com-h100]
    relabelTo: [embeddings]
  - name: embeddings
    match: {labels: {draguard.io/workload-class: embeddings}}
    deviceClasses: [gpu.nvidia.com-a100]
  - name: inference
    match: {labels: {draguard.io/workload-class: inference}, images: ["*triton*"]}
    deviceClasses: ["gpu.nvidia.com-*"]
  - name: dev
    match: {labels: {draguard.io/workload-class: dev}}
    deviceClasses: ["*-mig-*"]
"""


def test_relabel_to_lets_the_policy_allow_a_declared_class() -> None:
    labelled = "{draguard.io/workload-class: embeddings}"
    assert run(TEMPLATES + pod("vllm/vllm-openai:1", labels=labelled), policies=RELABEL_POLICY).findings == []
    # Another declared class is not in relabelTo: both classes apply, and llm denies the A100.
    (f,) = run(
        TEMPLATES + pod("vllm/vllm-openai:1", labels="{draguard.io/workload-class: inference}"),
        policies=RELABEL_POLICY,
    ).findings
    assert "'llm'" in f.message and "relabelTo of class 'llm' in GpuTierPolicy t" in f.fix


def test_a_label_can_make_a_workload_stricter() -> None:
    # Triton may use any full GPU, but labelled `dev` it keeps to MIG slices too.
    (f,) = run(
        TEMPLATES + pod("nvcr.io/nvidia/tritonserver:24.12-py3", labels="{draguard.io/workload-class: dev}"),
        policies=RELABEL_POLICY,
    ).findings
    assert "'dev'" in f.message and "label draguard.io/workload-class=dev" in f.message


def test_relabel_to_must_name_a_class() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy_text(RELABEL_POLICY.replace("relabelTo: [embeddings]", "relabelTo: [nope]"), "p.yaml")
    assert e.value.field_path == "spec.classes[0].relabelTo[0]" and "unknown class 'nope'" in str(e.value)


def test_a_policy_exception_covers_a_relabelled_workload() -> None:
    exc = """
---
apiVersion: policy.draguard.io/v1alpha1
kind: PolicyException
metadata: {name: rag-embeddings}
spec:
  expires: 2099-01-01
  reason: embedding model served by vLLM
  rules: ["tier/*"]
  namespaces: [ml]
"""
    text = TEMPLATES + pod("vllm/vllm-openai:1", labels="{draguard.io/workload-class: inference}")
    (f,) = run(text, policies=RELABEL_POLICY + exc).findings
    assert f.mode is Mode.AUDIT


# -- KEP-5004 extended resources ----------------------------------------------------------------


def ext_pod(image: str, resource: str, count: str = "1", where: str = "limits", init: str = "") -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: p, namespace: ml}}
spec:
{init}  containers:
  - name: c
    image: {image}
    resources: {{{where}: {{{resource}: "{count}"}}}}
"""


A100_WITH_NAME = Inventory.from_objects(
    [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com-a100"},
            "spec": {"extendedResourceName": "example.com/a100"},
        }
    ]
)


@pytest.mark.parametrize("where", ["limits", "requests"])
def test_extended_resource_of_a_device_class_counts_for_tier(where: str) -> None:
    text = ext_pod(
        "vllm/vllm-openai:1", "deviceclass.resource.kubernetes.io/gpu.nvidia.com-a100", where=where
    )
    (f,) = run(text).findings
    assert f.rule == "tier/gpu-tiers" and f.mode is Mode.ENFORCE
    assert (
        "extended resource deviceclass.resource.kubernetes.io/gpu.nvidia.com-a100 of container 'c'"
        in f.message
    )
    assert "deviceclass.resource.kubernetes.io/gpu.nvidia.com-h100" in f.fix
    ok = ext_pod("vllm/vllm-openai:1", "deviceclass.resource.kubernetes.io/gpu.nvidia.com-h100", where=where)
    assert run(ok).findings == []


def test_extended_resource_name_declared_by_a_device_class_counts_for_tier() -> None:
    (f,) = run(ext_pod("vllm/vllm-openai:1", "example.com/a100"), inventory=A100_WITH_NAME).findings
    assert "example.com/a100" in f.message and "served by DeviceClass gpu.nvidia.com-a100" in f.message
    # No class serves the name: a device plugin's resource, not draguard's to judge.
    assert run(ext_pod("vllm/vllm-openai:1", "example.com/a100")).findings == []


def test_extended_requests_and_pod_totals() -> None:
    init = """  initContainers:
  - {name: warm, image: x, resources: {limits: {deviceclass.resource.kubernetes.io/a: "3"}}}
  - {name: side, image: x, restartPolicy: Always, resources: {requests: {example.com/a100: 1}}}
"""
    obj = objs(ext_pod("x", "deviceclass.resource.kubernetes.io/a", "2", init=init))[0].obj
    reqs = resolve.extended_requests(obj, A100_WITH_NAME.classes)
    assert [(r.container, r.device_class, r.count, r.init, r.sidecar) for r in reqs] == [
        ("warm", "a", 3, True, False),
        ("side", "gpu.nvidia.com-a100", 1, True, True),
        ("c", "a", 2, False, False),
    ]
    assert reqs[0].pointer == "/spec/initContainers/0/resources/limits/deviceclass.resource.kubernetes.io~1a"
    # The init container runs alone (3 > 2); the sidecar runs with the app containers.
    assert resolve.extended_claims(obj, A100_WITH_NAME.classes) == {"a": 3, "gpu.nvidia.com-a100": 1}
    assert resolve.extended_resource_classes("cpu", A100_WITH_NAME.classes) == []
    assert resolve.extended_resource_classes("nvidia.com/gpu", A100_WITH_NAME.classes) == []


# -- claims the control plane makes for a pod ---------------------------------------------------


def owned_claim(device_class: str, annotation: str = "resource.kubernetes.io/pod-claim-name: g") -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: p-g-x7k2q
  namespace: ml
  annotations: {{{annotation}}}
  ownerReferences:
  - {{apiVersion: v1, kind: Pod, name: p, uid: '1111', controller: true, blockOwnerDeletion: true}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {{deviceClassName: {device_class}}}
"""


def owner(image: str, uid: str = "1111") -> dict[str, object]:
    obj = dict(objs(pod(image, claim="not-yet-created"))[0].obj)
    obj["metadata"] = {"name": "p", "namespace": "ml", "uid": uid}
    return obj


def admission(related: tuple[dict[str, object], ...] = (), **looked_up: str) -> Context:
    keys = {("Pod" if k == "pod" else "ResourceClaim", "ml", v): "unreadable" for k, v in looked_up.items()}
    return Context(admission=True, related=related, looked_up=keys)  # type: ignore[arg-type]


def test_pod_before_its_template_gives_no_bypass() -> None:
    # The pod came first: its template was unknown, so the pod itself could not be judged...
    assert run(pod("vllm/vllm-openai:1", claim="a100")).findings == []
    # ...but the claim the controller makes from the template is judged by the pod's class.
    (f,) = run(owned_claim("gpu.nvidia.com-a100"), ctx=admission((owner("vllm/vllm-openai:1"),))).findings
    assert f.rule == "tier/gpu-tiers" and f.mode is Mode.ENFORCE
    assert f.object is not None and f.object.kind == "ResourceClaim"
    assert "pod p's workload class 'llm'" in f.message and "claim 'g' of pod p" in f.message
    ok = run(owned_claim("gpu.nvidia.com-h100"), ctx=admission((owner("vllm/vllm-openai:1"),)))
    assert ok.findings == []
    notebook = run(owned_claim("mig-1g10gb.nvidia.com"), ctx=admission((owner("jupyter/base-notebook"),)))
    assert notebook.findings == []


def test_the_scheduler_s_extended_resource_claim_is_judged_by_its_pod() -> None:
    text = owned_claim("gpu.nvidia.com-a100", "resource.kubernetes.io/extended-resource-claim: 'true'")
    (f,) = run(text, ctx=admission((owner("vllm/vllm-openai:1"),))).findings
    assert "the claim made for pod p" in f.message


def test_owned_claim_in_review_finds_its_pod_in_the_input() -> None:
    pod_doc = pod("vllm/vllm-openai:1", claim="a100").replace(
        "{name: p, namespace: ml,", "{name: p, namespace: ml,"
    )
    findings = run(owned_claim("gpu.nvidia.com-a100") + "---" + pod_doc).findings
    assert [f.object.kind for f in findings if f.object] == ["ResourceClaim"]


def test_owned_claim_whose_pod_cannot_be_read_fails_closed() -> None:
    (f,) = run(owned_claim("gpu.nvidia.com-h100"), ctx=admission(pod="p")).findings
    assert f.mode is Mode.ENFORCE and "could not be read" in f.message
    # A uid that does not match is another pod of the same name: not the owner.
    assert (
        run(
            owned_claim("gpu.nvidia.com-a100"), ctx=admission((owner("vllm/vllm-openai:1", "2222"),))
        ).findings
        == []
    )


def test_unowned_or_unlooked_claims_are_left_alone() -> None:
    plain = owned_claim("gpu.nvidia.com-a100").replace("controller: true", "controller: false")
    assert run(plain, ctx=admission((owner("vllm/vllm-openai:1"),))).findings == []
    assert run(owned_claim("gpu.nvidia.com-a100")).findings == []  # review without the pod


def test_pod_naming_a_claim_that_does_not_exist_yet_is_denied_in_admission() -> None:
    text = pod("vllm/vllm-openai:1").replace("resourceClaimTemplateName: a100", "resourceClaimName: later")
    ctx = Context(admission=True, looked_up={("ResourceClaim", "ml", "later"): "absent"})
    (f,) = run(text, ctx=ctx).findings
    assert f.mode is Mode.ENFORCE and "ResourceClaim 'later' does not exist yet" in f.message
    assert "create ResourceClaim later first" in f.fix
    # An unclassified pod, or offline review, is not held to it.
    assert run(text.replace("vllm/vllm-openai:1", "busybox"), ctx=ctx).findings == []
    assert run(text).findings == []


# -- what admission reads from the API server ---------------------------------------------------


def test_lookups_needed_for_claims_made_for_a_pod() -> None:
    from webhook.policy.load import load_policies

    (tiers,) = load_policies("policies").tier
    claim = objs(owned_claim("gpu.nvidia.com-a100"))[0].obj
    assert tier.lookups_needed(claim, [tiers], Inventory.empty(), "ml", {}) == [("Pod", "ml", "p")]
    # When no class of any policy could refuse what the claim asks for, the pod is not needed.
    open_policy = parse_policy_text(
        "apiVersion: policy.draguard.io/v1alpha1\nkind: GpuTierPolicy\nmetadata: {name: o}\n"
        "spec: {classes: [{name: any, match: {images: ['*']}, deviceClasses: ['*']}]}\n"
    ).tier
    assert tier.lookups_needed(claim, open_policy, Inventory.empty(), "ml", {}) == []
    # Out of the policy's scope: nothing to read.
    assert tier.lookups_needed(claim, [tiers], Inventory.empty(), "kube-system", {}) == []


def test_lookups_needed_for_pods_naming_unknown_templates_and_claims() -> None:
    from webhook.policy.load import load_policies

    (tiers,) = load_policies("policies").tier
    text = pod("vllm/vllm-openai:1", claim="a100")
    obj = objs(text)[0].obj
    assert tier.lookups_needed(obj, [tiers], Inventory.empty(), "ml", {}) == [
        ("ResourceClaimTemplate", "ml", "a100")
    ]
    known = Inventory.from_objects([o.obj for o in objs(TEMPLATES)])
    assert tier.lookups_needed(obj, [tiers], known, "ml", {}) == []
    named = objs(text.replace("resourceClaimTemplateName: a100", "resourceClaimName: shared"))[0].obj
    assert tier.lookups_needed(named, [tiers], known, "ml", {}) == [("ResourceClaim", "ml", "shared")]
    # An unclassified workload's verdict does not depend on what it names.
    plain = objs(pod("busybox", claim="a100"))[0].obj
    assert tier.lookups_needed(plain, [tiers], Inventory.empty(), "ml", {}) == []


def test_the_fix_says_what_can_move_a_detected_workload() -> None:
    # Detected by its image, no relabelTo: only an exception helps, not a label.
    (f,) = run(TEMPLATES + pod("vllm/vllm-openai:1")).findings
    assert "ask for a PolicyException" in f.fix and "label its pods" not in f.fix
    # The policy lets llm workloads declare themselves embeddings: the fix says so.
    (g,) = run(TEMPLATES + pod("vllm/vllm-openai:1", claim="a100"), policies=RELABEL_POLICY.replace(
        "deviceClasses: [gpu.nvidia.com-a100]", "deviceClasses: [gpu.nvidia.com-l4]"
    )).findings  # fmt: skip
    assert "label its pods draguard.io/workload-class=<embeddings>" in g.fix


# -- a user's claim keeps to the pods already waiting for it ------------------------------------


def user_claim(device_class: str, name: str = "shared") -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: ml}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {{deviceClassName: {device_class}}}
"""


def waiting(image: str, claim: str = "shared") -> dict[str, object]:
    text = pod(image).replace("resourceClaimTemplateName: a100", f"resourceClaimName: {claim}")
    return dict(objs(text)[0].obj)


def test_a_claim_re_created_under_a_waiting_pod_keeps_to_its_class() -> None:
    # The pod was admitted against an H100 `shared`; the claim was deleted and re-created on A100s.
    ctx = Context(admission=True, related=(waiting("vllm/vllm-openai:1"),))
    (f,) = run(user_claim("gpu.nvidia.com-a100"), ctx=ctx).findings
    assert f.mode is Mode.ENFORCE and f.object is not None and f.object.kind == "ResourceClaim"
    assert "pod p's workload class 'llm'" in f.message and "pod p waits for" in f.message
    assert run(user_claim("gpu.nvidia.com-h100"), ctx=ctx).findings == []
    # Pods naming another claim, or unclassified ones, do not bind it.
    others = Context(admission=True, related=(waiting("vllm/vllm-openai:1", "other"), waiting("busybox")))
    assert run(user_claim("gpu.nvidia.com-a100"), ctx=others).findings == []


def test_pending_pods_that_could_not_all_be_read_give_a_warning() -> None:
    ctx = Context(admission=True, looked_up={("PendingPods", "ml", "shared"): "unreadable"})
    (f,) = run(user_claim("gpu.nvidia.com-a100"), ctx=ctx).findings
    assert f.mode is Mode.WARN and "could not check every pending pod" in f.message


def test_lookups_needed_for_a_users_claim() -> None:
    from webhook.policy.load import load_policies

    (tiers,) = load_policies("policies").tier
    claim = objs(user_claim("gpu.nvidia.com-a100"))[0].obj
    wants = tier.lookups_needed(claim, [tiers], Inventory.empty(), "ml", {})
    assert wants == [("PendingPods", "ml", "shared")]
