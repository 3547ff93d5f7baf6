"""The seed article's scenarios as manifests for the local cluster (used by `draguard demo` and e2e tests).

Each function takes the namespace to use and returns YAML for `kubectl apply -f -`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

DRIVER = "gpu.nvidia.com"
A100 = "gpu.nvidia.com-a100"
H100 = "gpu.nvidia.com-h100"
MIGRATE_LABELS = {"draguard.io/migration-mode": "migrate"}
PYTORCH = "nvcr.io/nvidia/pytorch:24.01-py3"


# What a container of a GPU claim prints first: its GPUs as the driver's CDI spec gave them.
SHOW_GPUS = (
    'echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; '
    'echo "device nodes: $(cd /dev && echo nvidia*)"; '
    "exec sleep 3600"
)


def _requests(device_class: str, count: int, indent: str) -> str:
    """The `requests` of a claim spec asking `count` devices of `device_class`, at `indent`."""
    return (
        f"{indent}requests:\n{indent}- name: gpu\n{indent}  exactly:\n"
        f"{indent}    deviceClassName: {device_class}\n{indent}    count: {count}\n"
    )


def _head(api: str, kind: str, ns: str, name: str) -> str:
    """An object's first lines, up to `spec:`."""
    return f"apiVersion: {api}\nkind: {kind}\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n"


def _claim(ns: str, name: str, device_class: str, count: int, constraints: str = "") -> str:
    """A ResourceClaim `name` for `count` devices of `device_class` (`constraints`: lines under devices)."""
    head = _head("resource.k8s.io/v1", "ResourceClaim", ns, name)
    return head + "  devices:\n" + _requests(device_class, count, "    ") + constraints


def _template(ns: str, name: str, device_class: str, count: int = 1) -> str:
    """A ResourceClaimTemplate `name` for `count` devices of `device_class`."""
    head = _head("resource.k8s.io/v1", "ResourceClaimTemplate", ns, name)
    return head + "  spec:\n    devices:\n" + _requests(device_class, count, "      ")


def pod_manifest(
    ns: str,
    name: str,
    image: str,
    *,
    container: str = "main",
    node: str | None = None,
    command: str | None = None,
    argv: Sequence[str] = (),
    gpus: int = 0,
    claim: tuple[str, str] | None = None,
    claim_ref: str = "gpu",
    restart_never: bool = False,
) -> str:
    """One Pod: every scenario's pod is built here.

    `node` pins it; `command` runs through `sh -c`, else `argv` (if any) is the command; `gpus` asks
    device-plugin GPUs (nvidia.com/gpu); `claim` is (`resourceClaimName` or `resourceClaimTemplateName`,
    its value) for the claim `claim_ref` the container uses.
    """
    lines = _head("v1", "Pod", ns, name).splitlines()
    if node:
        lines += ["  nodeSelector:", f"    kubernetes.io/hostname: {node}"]
    if restart_never:
        lines.append("  restartPolicy: Never")
    lines += ["  terminationGracePeriodSeconds: 1", "  containers:"]
    lines += [f"  - name: {container}", f"    image: {image}"]
    if command:
        lines.append(f"    command: [sh, -c, {json.dumps(command)}]")
    elif argv:
        lines.append(f"    command: [{', '.join(argv)}]")
    if gpus:
        lines += ["    resources:", "      limits:", f"        nvidia.com/gpu: {gpus}"]
    if claim:
        key, value = claim
        lines += ["    resources:", "      claims:", f"      - name: {claim_ref}", "  resourceClaims:",
                  f"  - name: {claim_ref}", f"    {key}: {value}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def legacy_pod(ns: str, image: str | None = None, node: str | None = None, command: str | None = None) -> str:
    """The article's device-plugin pod: two whole GPUs through the `nvidia.com/gpu` extended resource.

    `image`, `node` and `command` make it a pod that runs on a real node and prints what it sees.
    """
    return pod_manifest(ns, "gpu-training-legacy", image or PYTORCH, container="trainer", node=node,
                        command=command, gpus=2)  # fmt: skip


def claim_pod(
    ns: str, name: str, device_class: str, count: int, image: str, node: str, command: str = SHOW_GPUS
) -> str:
    """A pod with its own claim (`<name>-gpu`) for `count` devices, on `node`, printing its GPUs
    (or running `command`)."""
    ref = ("resourceClaimName", f"{name}-gpu")
    pod = pod_manifest(ns, name, image, node=node, command=command, claim=ref)
    return _claim(ns, f"{name}-gpu", device_class, count) + "---\n" + pod


def shell_pod(ns: str, name: str, image: str, node: str) -> str:
    """A pod without devices that sleeps, for `kubectl exec` probes."""
    return pod_manifest(ns, name, image, node=node, command="exec sleep 3600")


def llm_template(ns: str, device_class: str) -> str:
    """A one-GPU ResourceClaimTemplate of `device_class`, named llm-<a100|h100>."""
    return _template(ns, f"llm-{device_class.rsplit('-', 1)[-1]}", device_class)


def llm_deployment(
    ns: str,
    device_class: str,
    replicas: int = 2,
    *,
    image: str | None = None,
    node: str | None = None,
    command: str | None = None,
) -> str:
    """An LLM inference Deployment (app: llm-inference-*) using the llm_template of `device_class`.

    Apply the template first: the webhook resolves claim templates from its watch cache, which
    learns of a new template a moment after it is created. `image`, `node` and `command` make it
    one that runs on a real node (the `app` label still marks it an LLM for the tier policy).
    """
    short = device_class.rsplit("-", 1)[-1]
    extra = ""
    if node:
        extra += f"      nodeSelector:\n        kubernetes.io/hostname: {node}\n"
    if command:
        extra += "      terminationGracePeriodSeconds: 1\n"
    run = f"        command: [sh, -c, {json.dumps(command)}]\n" if command else ""
    return f"""\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: llm-inference-{short}
  namespace: {ns}
spec:
  replicas: {replicas}
  selector:
    matchLabels:
      app: llm-inference-{short}
  template:
    metadata:
      labels:
        app: llm-inference-{short}
    spec:
{extra}      containers:
      - name: inference-server
        image: {image or "vllm/vllm-openai:v0.6.3"}
{run}        resources:
          claims:
          - name: gpu
      resourceClaims:
      - name: gpu
        resourceClaimTemplateName: llm-{short}
"""


def mig_profile_deviceclass(name: str = "gpu.nvidia.com-a100-mig-3g20gb-typo") -> str:
    """The article's MIG DeviceClass: `migProfile` is not an attribute the driver publishes."""
    return f"""\
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: {name}
spec:
  selectors:
  - cel:
      expression: >-
        device.driver == 'gpu.nvidia.com' &&
        device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100 80GB PCIe' &&
        device.attributes['gpu.nvidia.com'].migProfile == '3g.20gb'
"""


def big_a100_claim(ns: str, count: int = 9) -> str:
    """A claim for more A100s than a team-* namespace's budget (8)."""
    return _claim(ns, "too-many-a100", A100, count)


def training_claim(
    ns: str, image: str | None = None, node: str | None = None, command: str | None = None
) -> str:
    """The article's 4-GPU training claim, with the interconnect attribute the driver really publishes."""
    constraints = (
        "    constraints:\n    - requests: [gpu]\n      matchAttribute: gpu.nvidia.com/nvlinkDomain\n"
    )
    claim = _claim(ns, "training-gpu-claim", A100, 4, constraints)
    pod = pod_manifest(ns, "distributed-training", image or PYTORCH, container="trainer", node=node,
                       command=command, argv=("torchrun", "--nproc_per_node=4", "train.py"),
                       claim=("resourceClaimName", "training-gpu-claim"), claim_ref="training-gpus",
                       restart_never=True)  # fmt: skip
    return claim + "---\n" + pod


def plain_gpu_pod(ns: str, name: str = "gpu-pod") -> str:
    """A pod asking one H100 through a claim template (for the webhook-down checks)."""
    pod = pod_manifest(ns, name, "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                       claim=("resourceClaimTemplateName", f"{name}-h100"))
    return _template(ns, f"{name}-h100", H100) + "---\n" + pod
