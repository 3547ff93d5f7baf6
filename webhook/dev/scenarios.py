"""The seed article's scenarios as manifests for the local cluster (used by `draguard demo` and e2e tests).

Each function takes the namespace to use and returns YAML for `kubectl apply -f -`.
"""

from __future__ import annotations

DRIVER = "gpu.nvidia.com"
A100 = "gpu.nvidia.com-a100"
H100 = "gpu.nvidia.com-h100"
MIGRATE_LABELS = {"draguard.io/migration-mode": "migrate"}


def legacy_pod(ns: str) -> str:
    """The article's device-plugin pod: two whole GPUs through the `nvidia.com/gpu` extended resource."""
    return f"""\
apiVersion: v1
kind: Pod
metadata:
  name: gpu-training-legacy
  namespace: {ns}
spec:
  containers:
  - name: trainer
    image: nvcr.io/nvidia/pytorch:24.01-py3
    resources:
      limits:
        nvidia.com/gpu: 2
"""


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


def training_claim(ns: str) -> str:
    """The article's 4-GPU training claim, with the interconnect attribute the driver really publishes."""
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
  restartPolicy: Never
  containers:
  - name: trainer
    image: nvcr.io/nvidia/pytorch:24.01-py3
    command: [torchrun, --nproc_per_node=4, train.py]
    resources:
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
