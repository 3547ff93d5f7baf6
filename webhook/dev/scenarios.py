"""The seed article's scenarios as manifests for the local cluster (used by `draguard demo` and e2e tests).

Each function takes the namespace to use and returns YAML for `kubectl apply -f -`.
"""

from __future__ import annotations

import json

DRIVER = "gpu.nvidia.com"
A100 = "gpu.nvidia.com-a100"
H100 = "gpu.nvidia.com-h100"
MIGRATE_LABELS = {"draguard.io/migration-mode": "migrate"}


# What a container of a GPU claim prints first: its GPUs as the driver's CDI spec gave them.
SHOW_GPUS = (
    'echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; '
    'echo "device nodes: $(cd /dev && echo nvidia*)"; '
    "exec sleep 3600"
)


def _runs_on(node: str | None, image: str | None, command: str | None) -> tuple[str, str]:
    """(pod-spec lines, container lines) that pin a pod to `node` and run `command` in `image`."""
    pod = f"  nodeSelector:\n    kubernetes.io/hostname: {node}\n" if node else ""
    container = f"    command: [sh, -c, {json.dumps(command)}]\n" if command else ""
    return pod, container


def legacy_pod(ns: str, image: str | None = None, node: str | None = None, command: str | None = None) -> str:
    """The article's device-plugin pod: two whole GPUs through the `nvidia.com/gpu` extended resource.

    `image`, `node` and `command` make it a pod that runs on a real node and prints what it sees.
    """
    pod, container = _runs_on(node, image, command)
    return f"""\
apiVersion: v1
kind: Pod
metadata:
  name: gpu-training-legacy
  namespace: {ns}
spec:
{pod}  terminationGracePeriodSeconds: 1
  containers:
  - name: trainer
    image: {image or "nvcr.io/nvidia/pytorch:24.01-py3"}
{container}    resources:
      limits:
        nvidia.com/gpu: 2
"""


def claim_pod(
    ns: str, name: str, device_class: str, count: int, image: str, node: str, command: str = SHOW_GPUS
) -> str:
    """A pod with its own claim (`<name>-gpu`) for `count` devices, on `node`, printing its GPUs
    (or running `command`)."""
    pod, container = _runs_on(node, image, command)
    return f"""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {name}-gpu
  namespace: {ns}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: {device_class}
        count: {count}
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
spec:
{pod}  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {image}
{container}    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimName: {name}-gpu
"""


def shell_pod(ns: str, name: str, image: str, node: str) -> str:
    """A pod without devices that sleeps, for `kubectl exec` probes."""
    pod, container = _runs_on(node, image, "exec sleep 3600")
    return f"""\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
spec:
{pod}  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {image}
{container}"""


def llm_template(ns: str, device_class: str) -> str:
    """A one-GPU ResourceClaimTemplate of `device_class`, named llm-<a100|h100>."""
    short = device_class.rsplit("-", 1)[-1]
    return f"""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: llm-{short}
  namespace: {ns}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: {device_class}
          count: 1
"""


def llm_deployment(ns: str, device_class: str, replicas: int = 2) -> str:
    """An LLM inference Deployment (app: llm-inference-*) using the llm_template of `device_class`.

    Apply the template first: the webhook resolves claim templates from its watch cache, which
    learns of a new template a moment after it is created.
    """
    short = device_class.rsplit("-", 1)[-1]
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
      containers:
      - name: inference-server
        image: vllm/vllm-openai:v0.6.3
        resources:
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
    return f"""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: too-many-a100
  namespace: {ns}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: {A100}
        count: {count}
"""


def training_claim(
    ns: str, image: str | None = None, node: str | None = None, command: str | None = None
) -> str:
    """The article's 4-GPU training claim, with the interconnect attribute the driver really publishes."""
    pod, container = _runs_on(node, image, command)
    default_command = "    command: [torchrun, --nproc_per_node=4, train.py]\n"
    return f"""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: training-gpu-claim
  namespace: {ns}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: {A100}
        count: 4
    constraints:
    - requests: [gpu]
      matchAttribute: gpu.nvidia.com/nvlinkDomain
---
apiVersion: v1
kind: Pod
metadata:
  name: distributed-training
  namespace: {ns}
spec:
{pod}  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: trainer
    image: {image or "nvcr.io/nvidia/pytorch:24.01-py3"}
{container or default_command}    resources:
      claims:
      - name: training-gpus
  resourceClaims:
  - name: training-gpus
    resourceClaimName: training-gpu-claim
"""


def plain_gpu_pod(ns: str, name: str = "gpu-pod") -> str:
    """A pod asking one H100 through a claim template (for the webhook-down checks)."""
    return f"""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: {name}-h100
  namespace: {ns}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: {H100}
          count: 1
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
spec:
  containers:
  - name: main
    image: nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04
    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: {name}-h100
"""
