"""Workload CRDs in the audit, against a real API server as the bundle's `draguard-audit` account:
a CRD of the built-in table is found by discovery, judged by its pod templates and watched; its pods
are judged through it, as a Deployment's are; a kind a WorkloadKindPolicy adds without RBAC for the
audit is named in the ClusterPolicyReport (and its pods judged themselves); an object nested past
what the decoder follows does not stop the scan."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kapi import Api, api_server, wait_for
from kaudit import NS, REPO, RULE, install, policies_with_h200_only, running_audit, sample, watch_driven

from webhook.audit.controller import AuditController, AuditOptions

MX_POLICY = REPO / "tests" / "fixtures" / "workload-kinds" / "mxjob.yaml"


def _crd(plural: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kubeflow.org"},
        "spec": {
            "group": "kubeflow.org",
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                            },
                        }
                    },
                }
            ],
        },
    }


def _pod_spec(template: str) -> dict[str, Any]:
    return {
        "containers": [
            {"name": "main", "image": "vllm/vllm-openai:v0.6.3", "resources": {"claims": [{"name": "gpu"}]}}
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
    }


def _job(kind: str, name: str, template: str, **spec: Any) -> dict[str, Any]:
    key = "pytorchReplicaSpecs" if kind == "PyTorchJob" else "mxReplicaSpecs"
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": {key: {"Worker": {"replicas": 2, "template": {"spec": _pod_spec(template)}}}, **spec},
    }


def _owned_pod(name: str, owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "ownerReferences": [{**ref, "controller": True}]},
        "spec": _pod_spec("llm-h100"),
    }


def _create(a: Api, obj: dict[str, Any]) -> dict[str, Any]:
    res = a.kubectl("create", "-o", "json", "-f", "-", stdin=json.dumps(obj))
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout)
    return out


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Path]]:
    with api_server() as a:
        crds = (_crd("pytorchjobs", "PyTorchJob"), _crd("mxjobs", "MXJob"))
        yield a, install(a, tmp_path_factory.mktemp("audit") / "kubeconfig", crds=crds)


@pytest.fixture(scope="module")
def controller(api: tuple[Api, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuditController]:
    a, kubeconfig = api
    # Objects there before the audit starts: the first full scan judges them.
    job = _create(a, _job("PyTorchJob", "train", "llm-h100"))
    _create(a, _owned_pod("train-worker-0", job))
    mpi = _create(a, _job("MXJob", "mpi", "llm-h100"))
    _create(a, _owned_pod("mpi-worker-0", mpi))
    policies = policies_with_h200_only(tmp_path_factory.mktemp("policies"), MX_POLICY)
    opts = AuditOptions(str(policies), interval=3600.0, poll_interval=0.5, debounce=0.3)
    with running_audit(kubeconfig, opts) as ctl:
        yield ctl


def _report(a: Api, cluster: bool = False) -> dict[str, Any]:
    args = ("clusterpolicyreports.wgpolicyk8s.io", "draguard-audit") if cluster else (
        "policyreports.wgpolicyk8s.io", "draguard-audit", "-n", NS)  # fmt: skip
    res = a.kubectl("get", *args, "-o", "json")
    return json.loads(res.stdout) if res.returncode == 0 else {}


def _entries(a: Api, name: str) -> list[tuple[str, str, str]]:
    return sorted(
        (r["resources"][0]["kind"], r["result"], r["rule"])
        for r in _report(a).get("results", [])
        if r["resources"][0]["name"] == name
    )


def test_a_workload_crd_is_judged_and_its_pods_through_it(
    api: tuple[Api, Path], controller: AuditController
) -> None:
    a, _ = api
    assert _entries(a, "train") == [("PyTorchJob", "fail", RULE)]
    [entry] = [r for r in _report(a)["results"] if r["resources"][0]["name"] == "train"]
    assert entry["resources"][0]["apiVersion"] == "kubeflow.org/v1" and entry["resources"][0]["uid"]
    assert _entries(a, "train-worker-0") == []  # judged through its PyTorchJob


def test_a_kind_the_audit_may_not_list_is_named_and_its_pods_judged(
    api: tuple[Api, Path], controller: AuditController
) -> None:
    a, _ = api
    errors = [r for r in _report(a, cluster=True).get("results", []) if r["rule"] == "audit/cannot-list"]
    assert [r["resources"][0]["name"] for r in errors] == ["mxjobs.kubeflow.org"]
    assert errors[0]["result"] == "error" and "ClusterRole" in errors[0]["message"]
    assert _entries(a, "mpi") == []
    # Its owner is not judged, so the pod is: the finding is not lost.
    assert _entries(a, "mpi-worker-0") == [("Pod", "fail", RULE)]


def test_a_workload_crd_is_watched(api: tuple[Api, Path], controller: AuditController) -> None:
    a, _ = api
    _create(a, _job("PyTorchJob", "late", "llm-h100"))
    wait_for(lambda: _entries(a, "late") == [("PyTorchJob", "fail", RULE)], "the new PyTorchJob", timeout=30)
    a.kubectl("delete", "pytorchjob", "late", "-n", NS)
    wait_for(lambda: _entries(a, "late") == [], "the deleted PyTorchJob's entry to go", timeout=30)
    assert controller.scans_ok == 1  # the watch did it


def test_an_object_nested_too_deep_for_the_decoder_does_not_stop_the_scan(
    api: tuple[Api, Path], controller: AuditController
) -> None:
    a, _ = api
    before = controller.scans_ok
    text = json.dumps(_job("PyTorchJob", "deep", "llm-h100", extra="DEEP"))
    text = text.replace('"DEEP"', '{"d":' * 2000 + '"bottom"' + "}" * 2000)  # past json's 1,000 levels
    res = a.kubectl("create", "-f", "-", stdin=text)
    assert res.returncode == 0, res.stderr  # the API server keeps it (up to 10,000 levels)
    # Its watch event is past the event decoder's depth too: read with the deep part cut off, it
    # re-judges the namespace (no full scan), whose list is read the same way.
    wait_for(lambda: _entries(a, "deep") == [("PyTorchJob", "fail", RULE)], "the deep PyTorchJob", timeout=30)
    assert controller.scans_ok == before
    # A full scan lists it among the others and goes on.
    controller.opts = dataclasses.replace(controller.opts, full_scan_gap=0.0)
    controller.changes.request_full()
    wait_for(lambda: controller.scans_ok > before, "a full scan with the deep object", timeout=60)
    assert _entries(a, "deep") == [("PyTorchJob", "fail", RULE)]  # judged on its pod templates
    assert _entries(a, "train") == [("PyTorchJob", "fail", RULE)]


def test_a_kind_the_audit_may_not_watch_is_tried_once_per_full_scan(
    api: tuple[Api, Path], controller: AuditController
) -> None:
    # Without RBAC for MXJobs the watch gets 403: it stops, instead of retrying every 30 s and
    # logging each time, and is tried once more after each full scan (RBAC may have come since).
    def mpi() -> list[Any]:
        return [w for w in controller.watches if w.res.name == "mxjobs"]

    def refused() -> float:
        return sample(controller, "draguard_audit_watch_events_total", resource="mxjobs", what="refused")

    def stopped() -> bool:
        return len(mpi()) == 1 and mpi()[0].refused and not mpi()[0].thread.is_alive()

    wait_for(stopped, "a stopped watch")
    before, scans = refused(), controller.scans_ok
    assert before >= 1
    controller.opts = dataclasses.replace(controller.opts, full_scan_gap=0.0)
    controller.changes.request_full()
    wait_for(lambda: controller.scans_ok > scans, "a full scan", timeout=60)
    wait_for(lambda: refused() == before + 1, "the watch tried once more", timeout=30)
    assert len(mpi()) == 1 and mpi()[0].refused  # replaced, not added to
    assert not any(w.refused for w in controller.watches if w.res.name == "pytorchjobs")


def _jobset_crd() -> dict[str, Any]:
    crd = _crd("jobsets", "JobSet")
    crd["metadata"]["name"] = "jobsets.jobset.x-k8s.io"
    crd["spec"]["group"] = "jobset.x-k8s.io"
    crd["spec"]["versions"][0]["name"] = "v1alpha2"
    return crd


def test_a_workload_crd_installed_later_is_listed_and_watched_within_seconds(
    api: tuple[Api, Path], tmp_path: Path
) -> None:
    # An operator installed while the audit runs: discovery finds its kind, a full scan lists it and
    # its watch starts, without waiting for the periodic scan (an hour away here).
    a, kubeconfig = api
    opts = watch_driven(policies_with_h200_only(tmp_path / "policies"), discovery_interval=0.5)
    spec = {"template": {"spec": {"template": {"spec": _pod_spec("llm-h100")}}}}
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "shards", "namespace": NS},
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 2, **spec}]},
    }

    def kinds(ctl: AuditController) -> set[str]:
        return {c.kind for c in ctl.state.collections} if ctl.state is not None else set()

    with running_audit(kubeconfig, opts) as ctl:
        try:
            assert "JobSet" not in kinds(ctl)
            assert a.kubectl("apply", "-f", "-", stdin=json.dumps(_jobset_crd())).returncode == 0
            wait_for(lambda: "JobSet" in kinds(ctl), "a full scan that lists JobSets", timeout=30)
            # The new kind's watch starts after that scan, so it asks for one more (what was created
            # in between): once that one is done, only the watch can bring a new JobSet in.
            wait_for(lambda: ctl.scans_ok >= 3 and ctl.changes.full_since is None, "the watch's full scan")
            before = ctl.scans_ok
            body = json.dumps(jobset)
            wait_for(lambda: a.kubectl("create", "-f", "-", stdin=body).returncode == 0, "the JobSet created")
            wait_for(lambda: _entries(a, "shards") == [("JobSet", "fail", RULE)], "the JobSet judged")
            assert ctl.scans_ok == before
        finally:
            a.kubectl("delete", "crd", "jobsets.jobset.x-k8s.io", "--ignore-not-found", "--wait=true")
