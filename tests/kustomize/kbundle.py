"""Helpers for the bundle tests: build kustomizations with the real kustomize, find objects in the output.

Builds use the standalone `kustomize` binary when it is on PATH, else `kubectl kustomize`; with
neither, the tests skip with that reason. Results are cached per directory (each build is a subprocess).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE = REPO / "kustomize"
BASE = KUSTOMIZE / "base"
OVERLAYS = ("aks", "gke", "eks", "local")
COMPONENTS = (
    "cert-manager",
    "monitoring",
    "fail-open-validation",
    "eks-host-network",
    "gke-webhook-port-443",
    "network-policy",
    "apiserver-client-auth",
    "enforce-without-webhook",
    "gpu-sharing",
    "dynamic-mig",
)

Obj = dict[str, Any]


class BuildError(AssertionError):
    """kustomize refused the kustomization; carries its stderr."""


def kustomize_command() -> list[str] | None:
    """kustomize, else the machine's kubectl, else the kubectl `make k8s` built (`make test` puts that
    on PATH too; a test run on its own may not have it)."""
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        from webhook.dev.procs import ClusterError, find_bin_dir

        try:
            built = find_bin_dir() / "kubectl"
        except ClusterError:
            return None
        kubectl = str(built) if os.access(built, os.X_OK) else None
    return [kubectl, "kustomize"] if kubectl else None


def run_build(directory: Path) -> list[Obj]:
    cmd = kustomize_command()
    if cmd is None:
        raise BuildError("neither kustomize nor kubectl is on PATH")
    proc = subprocess.run([*cmd, str(directory)], capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise BuildError(f"kustomize build {directory} failed:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@functools.cache
def build(overlay: str, components: tuple[str, ...] = ()) -> tuple[Obj, ...]:
    """Build `kustomize/<overlay>` ("base" or an overlay name), optionally with extra components.

    Components are added the way a user would: a kustomization that lists the overlay as a resource
    and the components under `components:` (relative paths; kustomize rejects absolute ones).
    """
    root = BASE if overlay == "base" else KUSTOMIZE / "overlays" / overlay
    if not components:
        return tuple(run_build(root))
    with tempfile.TemporaryDirectory(prefix="draguard-kustomize-") as tmp:
        rel = lambda p: os.path.relpath(p, tmp)  # noqa: E731
        lines = [
            "apiVersion: kustomize.config.k8s.io/v1beta1",
            "kind: Kustomization",
            "resources:",
            f"  - {rel(root)}",
            "components:",
            *[f"  - {rel(KUSTOMIZE / 'components' / c)}" for c in components],
        ]
        Path(tmp, "kustomization.yaml").write_text("\n".join(lines) + "\n")
        return tuple(run_build(Path(tmp)))


def find(objs: tuple[Obj, ...] | list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objs if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: tuple[Obj, ...] | list[Obj], kind: str, name: str) -> Obj:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected exactly one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_template(obj: Obj) -> Obj | None:
    """Where each controller kind keeps the template of its pods (metadata and spec)."""
    kind = obj.get("kind")
    if kind in {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "ReplicationController"}:
        return obj["spec"]["template"]  # type: ignore[no-any-return]
    if kind == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]  # type: ignore[no-any-return]
    return None


def pod_spec(obj: Obj) -> Obj | None:
    """Where each workload kind keeps its pod spec."""
    if obj.get("kind") == "Pod":
        return obj["spec"]  # type: ignore[no-any-return]
    template = pod_template(obj)
    return template["spec"] if template is not None else None


def containers(obj: Obj) -> Iterator[Obj]:
    spec = pod_spec(obj)
    if spec is None:
        return
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


def webhook_configs(objs: tuple[Obj, ...]) -> list[Obj]:
    return find(objs, "MutatingWebhookConfiguration") + find(objs, "ValidatingWebhookConfiguration")
