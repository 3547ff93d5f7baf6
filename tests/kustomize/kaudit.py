"""The audit against a bare API server: the bundle's audit CRDs and RBAC installed, a stricter tier
policy, claim templates, and an AuditController run in a thread as `draguard audit run` runs it."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kapi import Api, sa_kubeconfig, wait_for

from webhook.audit.controller import AuditController, AuditOptions
from webhook.server.caches import KubeHttp

REPO = Path(__file__).resolve().parents[2]
AUDIT = REPO / "kustomize" / "base" / "audit"
DEVICECLASSES = REPO / "kustomize" / "base" / "deviceclasses" / "deviceclasses.yaml"
NS = "ml"
RULE = "tier/llm-h200-only"
H200_ONLY = f"""\
apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata:
  name: llm-h200-only
spec:
  mode: enforce
  namespaces: [{NS}]
  classes:
  - name: llm
    match:
      imageWords: [vllm]
    deviceClasses: [gpu.nvidia.com-h200]
"""
REPORT_CRDS = ("policyreports.wgpolicyk8s.io", "clusterpolicyreports.wgpolicyk8s.io")


def template(name: str, device_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}
        },
    }


def install(
    a: Api, kubeconfig: Path, *, deviceclasses: bool = True, crds: tuple[dict[str, Any], ...] = ()
) -> Path:
    """The audit's CRDs, ServiceAccount and RBAC (and DeviceClasses, extra CRDs), each CRD waited
    for until Established; the claim templates llm-h100 and llm-h200 when `deviceclasses`. Returns
    a kubeconfig of the bundle's draguard-audit ServiceAccount, written at `kubeconfig`."""
    steps: list[tuple[str, ...]] = [
        ("apply", "-f", str(AUDIT / "crds.yaml")),
        ("apply", "-f", str(AUDIT / "serviceaccount.yaml"), "-f", str(AUDIT / "rbac.yaml")),
    ]
    if deviceclasses:
        steps.append(("apply", "-f", str(DEVICECLASSES)))
    for args in steps:
        res = a.kubectl(*args)
        assert res.returncode == 0, (args, res.stderr)
    for crd in crds:
        assert a.kubectl("apply", "-f", "-", stdin=json.dumps(crd)).returncode == 0
    for name in (*REPORT_CRDS, *(c["metadata"]["name"] for c in crds)):
        res = a.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")
        assert res.returncode == 0, res.stderr
    if deviceclasses:
        for t in (template("llm-h100", "gpu.nvidia.com-h100"), template("llm-h200", "gpu.nvidia.com-h200")):
            res = a.kubectl("create", "-f", "-", stdin=json.dumps(t))
            assert res.returncode == 0, res.stderr
    return sa_kubeconfig(a, "draguard-audit", kubeconfig)


def policies_with_h200_only(into: Path, *extra: Path) -> Path:
    """The shipped policies, the stricter tier policy, and `extra` policy files, in `into`."""
    shutil.copytree(REPO / "policies", into, ignore=shutil.ignore_patterns("tests"), dirs_exist_ok=True)
    (into / "llm-h200.yaml").write_text(H200_ONLY)
    for path in extra:
        shutil.copy(path, into / path.name)
    return into


def sample(ctl: AuditController, name: str, **labels: str) -> float:
    """A metric of the controller's registry (0 when it has no such sample yet)."""
    return ctl.metrics.registry.get_sample_value(name, labels) or 0.0


def watch_driven(policies: Path, **extra: Any) -> AuditOptions:
    """Options under which only watches can bring a change in: the periodic scan an hour away, a
    short debounce, and full scans as soon as a watch asks for one."""
    return AuditOptions(
        str(policies), interval=3600.0, poll_interval=0.5, debounce=0.3, full_scan_gap=0.0, **extra
    )


@contextmanager
def running_audit(kubeconfig: Path, opts: AuditOptions) -> Iterator[AuditController]:
    """An AuditController in a thread, yielded once its first full scan is done."""
    ctl = AuditController(KubeHttp.from_kubeconfig(str(kubeconfig)), opts)
    thread = threading.Thread(target=ctl.run, daemon=True)
    thread.start()
    wait_for(lambda: ctl.scans_ok >= 1, "the first full scan", timeout=60)
    try:
        yield ctl
    finally:
        ctl.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
