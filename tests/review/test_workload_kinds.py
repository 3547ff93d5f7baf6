"""`draguard review` and `draguard migrate` read a CRD a WorkloadKindPolicy adds, as admission does."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.review.conftest import Run

SHIPPED = Path(__file__).resolve().parents[2] / "policies"
KINDS = (SHIPPED.parent / "tests" / "fixtures" / "workload-kinds" / "mxjob.yaml").read_text()
MXJOB = """\
apiVersion: kubeflow.org/v1
kind: MXJob
metadata: {name: allreduce, namespace: team-a}
spec:
  mxReplicaSpecs:
    Scheduler:
      replicas: 1
      template:
        spec:
          containers: [{name: scheduler, image: mxjob/mxnet:gpu}]
    Worker:
      replicas: 3
      template:
        spec:
          containers:
          - name: worker
            image: nvcr.io/nvidia/pytorch:24.01-py3
            resources: {limits: {nvidia.com/gpu: 8}}
"""


def _policies(tmp_path: Path, extra: str | None) -> str:
    d = tmp_path / "policies"
    shutil.copytree(SHIPPED, d, ignore=shutil.ignore_patterns("tests"))
    if extra is not None:
        (d / "workload-kinds.yaml").write_text(extra)
    return str(d)


def test_review_judges_the_crd_only_with_the_policy(draguard: Callable[..., Run], tmp_path: Path) -> None:
    f = tmp_path / "mxjob.yaml"
    f.write_text(MXJOB)
    plain = draguard("review", str(f), "--policies", _policies(tmp_path / "a", None), "-f", "json")
    assert plain.code == 0 and json.loads(plain.out)["findings"] == [], plain.out
    run = draguard("review", str(f), "--policies", _policies(tmp_path / "b", KINDS), "-f", "json")
    assert run.code == 1, run.err
    quota = [x for x in json.loads(run.out)["findings"] if x["rule"] == "quota/team-budgets"]
    assert any("24 GPU-equivalents" in x["message"] for x in quota), quota


def test_migrate_rewrites_the_crd_templates(draguard: Callable[..., Run], tmp_path: Path) -> None:
    f = tmp_path / "mxjob.yaml"
    f.write_text(MXJOB)
    run = draguard("migrate", str(f), "--policies", _policies(tmp_path, KINDS), "--write")
    assert run.code == 0, run.err
    docs = [d for d in yaml.safe_load_all(f.read_text()) if d]
    assert [d["kind"] for d in docs] == ["MXJob", "ResourceClaimTemplate"]
    worker = docs[0]["spec"]["mxReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["resourceClaims"][0]["resourceClaimTemplateName"] == docs[1]["metadata"]["name"]
    assert "limits" not in worker["containers"][0]["resources"]
    assert "resourceClaims" not in docs[0]["spec"]["mxReplicaSpecs"]["Scheduler"]["template"]["spec"]


def test_a_bad_entry_is_a_clear_error(draguard: Callable[..., Run], tmp_path: Path) -> None:
    f = tmp_path / "mxjob.yaml"
    f.write_text(MXJOB)
    bad = KINDS.replace("replicas: [./replicas]", "replicas: [./replicas]\n      container: yes-please")
    run = draguard("review", str(f), "--policies", _policies(tmp_path, bad))
    assert run.code == 2
    assert "workload-kinds.yaml:14: spec.kinds[0].templates[0].container" in run.err, run.err
    assert "Traceback" not in run.err
