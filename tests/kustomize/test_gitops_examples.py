"""examples/gitops: an Argo CD Application and a Flux Kustomization per overlay, pointing at what the
engine tests (test_gitops_engines.py) sync, with the settings the bundle relies on."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kbundle import OVERLAYS, REPO

EXAMPLES = REPO / "examples" / "gitops"


def _docs(path: Path) -> list[dict[str, object]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_argo_cd_application(overlay: str) -> None:
    [app] = _docs(EXAMPLES / "argocd" / f"{overlay}.yaml")
    assert app["apiVersion"] == "argoproj.io/v1alpha1" and app["kind"] == "Application"
    spec = app["spec"]
    assert spec["source"]["path"] == f"kustomize/overlays/{overlay}"  # type: ignore[index]
    assert (REPO / spec["source"]["path"] / "kustomization.yaml").is_file()  # type: ignore[index]
    ignored = {(d["group"], d["kind"]): d["jqPathExpressions"] for d in spec["ignoreDifferences"]}  # type: ignore[index]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert ignored[("admissionregistration.k8s.io", kind)] == [".webhooks[]?.clientConfig.caBundle"]
    assert "RespectIgnoreDifferences=true" in spec["syncPolicy"]["syncOptions"]  # type: ignore[index]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_flux_kustomization_waits_and_workloads_depend_on_it(overlay: str) -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _docs(EXAMPLES / "flux" / f"{overlay}.yaml")}  # type: ignore[index]
    ks = docs[("Kustomization", "draguard")]["spec"]
    assert ks["path"] == f"./kustomize/overlays/{overlay}"  # type: ignore[index]
    assert (REPO / ks["path"] / "kustomization.yaml").is_file()  # type: ignore[index]
    assert ks["wait"] is True and ks["prune"] is True  # type: ignore[index]
    assert ks["sourceRef"] == {"kind": "GitRepository", "name": "draguard"}  # type: ignore[index]
    assert ("GitRepository", "draguard") in docs
    workloads = docs[("Kustomization", "gpu-workloads")]["spec"]
    assert workloads["dependsOn"] == [{"name": "draguard"}]  # type: ignore[index]
