"""`draguard review --base REF`: verdicts that changed between a git ref and the working tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.review.conftest import FIXTURES, Run

pytestmark = pytest.mark.skipif(not shutil.which("git"), reason="needs git")

TIER = """\
# Which GPUs training may use.
apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata:
  name: gpu-tiers
spec:
  mode: enforce
  classes:
  - name: training
    match:
      labels:
        draguard.io/workload-class: training
    deviceClasses: [{classes}]
"""

JOB = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-a100
  namespace: team-a
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com-a100
---
apiVersion: batch/v1
kind: Job
metadata:
  name: finetune
  namespace: team-a
spec:
  template:
    metadata:
      labels:
        draguard.io/workload-class: training
    spec:
      restartPolicy: Never
      containers:
      - name: trainer
        image: nvcr.io/nvidia/pytorch:24.01-py3
        resources:
          claims:
          - name: gpu
      resourceClaims:
      - name: gpu
        resourceClaimTemplateName: one-a100
"""


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout


def commit_tier(repo: Path, classes: str, message: str) -> None:
    (repo / "policies" / "tier.yaml").write_text(TIER.format(classes=classes))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    r = tmp_path / "gitops"
    (r / "policies").mkdir(parents=True)
    (r / "apps").mkdir()
    (r / "apps" / "finetune.yaml").write_text(JOB)
    shutil.copy(FIXTURES / "inventory.yaml", r / "inventory.yaml")
    git(r, "init", "-q", "-b", "main")
    commit_tier(r, "gpu.nvidia.com-a100, gpu.nvidia.com-h100", "training may use A100 and H100")
    monkeypatch.chdir(r)
    return r


ARGS = ("review", "apps", "--inventory", "inventory.yaml")


def _status(repo: Path) -> str:
    return git(repo, "status", "--porcelain")


def test_tightened_policy_reports_newly_denied_and_blames_the_policy(
    repo: Path, draguard: Callable[..., Run]
) -> None:
    commit_tier(repo, "gpu.nvidia.com-h100", "training: H100 only")
    before = {p: p.stat().st_mtime_ns for p in repo.rglob("*") if ".git" not in p.parts}

    run = draguard(*ARGS, "--base", "HEAD~1", "-f", "json")
    assert run.code == 1, run.err
    doc = json.loads(run.out)
    assert doc["base"]["ref"] == "HEAD~1"
    assert doc["policyChanges"] == [
        {"kind": "GpuTierPolicy", "name": "gpu-tiers", "change": "modified", "file": "policies/tier.yaml"}
    ]
    (change,) = doc["changes"]
    assert change["change"] == "newly-denied"
    assert change["rule"] == "tier/gpu-tiers"
    assert change["object"]["name"] == "finetune"
    assert change["baseMode"] is None and change["mode"] == "enforce"
    assert change["causes"] == ["GpuTierPolicy gpu-tiers modified (policies/tier.yaml)"]
    assert change["file"] == "apps/finetune.yaml"

    text = draguard(*ARGS, "--base", "HEAD~1").out
    assert "Newly denied (1)" in text
    assert "because: GpuTierPolicy gpu-tiers modified (policies/tier.yaml)" in text

    # The work tree and index are untouched: no checkout, no stash.
    assert _status(repo) == ""
    after = {p: p.stat().st_mtime_ns for p in repo.rglob("*") if ".git" not in p.parts}
    assert after == before


def test_loosened_policy_reports_no_longer_denied(repo: Path, draguard: Callable[..., Run]) -> None:
    commit_tier(repo, "gpu.nvidia.com-h100", "training: H100 only")
    commit_tier(repo, "gpu.nvidia.com-a100, gpu.nvidia.com-h100", "training may use A100 again")
    run = draguard(*ARGS, "--base", "HEAD~1", "-f", "json")
    assert run.code == 0, run.err
    (change,) = json.loads(run.out)["changes"]
    assert change["change"] == "no-longer-denied"
    assert change["baseMode"] == "enforce" and change["mode"] is None
    assert change["causes"] == ["GpuTierPolicy gpu-tiers modified (policies/tier.yaml)"]
    md = draguard(*ARGS, "--base", "HEAD~1", "-f", "markdown").out
    assert "#### No longer denied (1)" in md


def test_unchanged_policy_and_manifest_changes_nothing(repo: Path, draguard: Callable[..., Run]) -> None:
    run = draguard(*ARGS, "--base", "HEAD")
    assert run.code == 0
    assert "No verdict changed." in run.out


def test_manifest_edit_in_the_work_tree_is_attributed_to_the_object(
    repo: Path, draguard: Callable[..., Run]
) -> None:
    commit_tier(repo, "gpu.nvidia.com-h100", "training: H100 only")
    # Uncommitted fix: the template asks for an H100 now.
    job = repo / "apps" / "finetune.yaml"
    job.write_text(JOB.replace("gpu.nvidia.com-a100", "gpu.nvidia.com-h100"))
    run = draguard(*ARGS, "--base", "HEAD", "-f", "json")
    assert run.code == 0
    (change,) = json.loads(run.out)["changes"]
    assert change["change"] == "no-longer-denied"
    # The Job itself is unchanged; the template it uses is what changed.
    assert change["object"]["kind"] == "Job"
    assert change["causes"] == [
        "related objects changed: ResourceClaimTemplate/team-a/one-a100 (apps/finetune.yaml)"
    ]


def test_sarif_with_base_annotates_only_new_denials(repo: Path, draguard: Callable[..., Run]) -> None:
    commit_tier(repo, "gpu.nvidia.com-h100", "training: H100 only")
    doc = json.loads(draguard(*ARGS, "--base", "HEAD~1", "-f", "sarif").out)
    results = doc["runs"][0]["results"]
    assert [r["ruleId"] for r in results] == ["tier/gpu-tiers"]
    assert draguard(*ARGS, "--base", "HEAD", "-f", "sarif").code == 0


def test_bad_ref_and_outside_a_repository(repo: Path, draguard: Callable[..., Run], tmp_path: Path) -> None:
    run = draguard(*ARGS, "--base", "no-such-branch")
    assert run.code == 2
    assert "no-such-branch: unknown git revision" in run.err
    outside = tmp_path / "loose"
    outside.mkdir()
    (outside / "a.yaml").write_text(JOB)
    os.chdir(outside)
    run = draguard("review", "a.yaml", "--base", "HEAD")
    assert run.code == 2 and "needs a git repository" in run.err


MIGRATION = """\
apiVersion: policy.draguard.io/v1alpha1
kind: MigrationPolicy
metadata:
  name: legacy-gpu
spec:
  defaultMode: {mode}
  mappings:
  - resource: nvidia.com/gpu
    deviceClass: {cls}
"""

LEGACY = """\
apiVersion: v1
kind: Pod
metadata:
  name: old-trainer
  namespace: team-a
spec:
  containers:
  - name: t
    image: nvcr.io/nvidia/pytorch:24.01-py3
    resources:
      limits:
        nvidia.com/gpu: 2
"""


@pytest.mark.parametrize("mode", ["migrate", "warn"])
def test_changed_rewrite_is_reported_with_its_policy(
    repo: Path, draguard: Callable[..., Run], mode: str
) -> None:
    (repo / "apps" / "legacy.yaml").write_text(LEGACY)
    (repo / "policies" / "migration.yaml").write_text(MIGRATION.format(mode=mode, cls="gpu.nvidia.com-a100"))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "legacy pod, mapped to A100")
    (repo / "policies" / "migration.yaml").write_text(MIGRATION.format(mode=mode, cls="gpu.nvidia.com-h100"))
    run = draguard(*ARGS, "--base", "HEAD", "-f", "json")
    assert run.code == 0, run.err
    doc = json.loads(run.out)
    (change,) = doc["changes"]
    assert change["change"] == "rewrite-changed"
    assert change["rule"] == "migrate/legacy-gpu"
    assert change["baseMode"] == change["mode"] == "warn"
    assert change["causes"] == ["MigrationPolicy legacy-gpu modified (policies/migration.yaml)"]
    assert "gpu.nvidia.com-h100" in change["message"]


def test_excluded_paths_are_skipped_on_both_sides(repo: Path, draguard: Callable[..., Run]) -> None:
    """`.draguard.yaml`'s `exclude` holds for `--base` too: a vendored file tightened by the policy is
    not reported, in the working tree nor at the base."""
    vendor = repo / "apps" / "vendor"
    vendor.mkdir()
    (vendor / "upstream.yaml").write_text(JOB.replace("finetune", "upstream").replace("one-a100", "up-a100"))
    (repo / ".draguard.yaml").write_text("review:\n  exclude: [apps/vendor/]\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "vendored job")
    commit_tier(repo, "gpu.nvidia.com-h100", "training: H100 only")
    run = draguard(*ARGS, "--base", "HEAD~1", "-f", "json")
    assert run.code == 1, run.err
    changed = {c["object"]["name"] for c in json.loads(run.out)["changes"]}
    assert "finetune" in changed and "upstream" not in changed
    # Without the configuration the vendored job is judged like any other.
    run = draguard(*ARGS, "--base", "HEAD~1", "-f", "json", "--no-config")
    assert {"finetune", "upstream"} <= {c["object"]["name"] for c in json.loads(run.out)["changes"]}


@pytest.mark.parametrize("filters", [True, False], ids=["tarfile-filters", "python-3.11.2"])
def test_the_base_tree_is_exported_without_links_out_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filters: bool
) -> None:
    """Python before 3.11.4 (Debian bookworm's 3.11.2) has no tarfile filters; `--base` then filters by
    hand, and neither way may a branch's link point the review outside the exported tree."""
    from webhook.review import diff

    if filters and not diff._EXTRACTION_FILTERS:
        pytest.skip("this Python has no tarfile extraction filters")
    monkeypatch.setattr(diff, "_EXTRACTION_FILTERS", filters)
    repo = tmp_path / "repo"
    (repo / "deploy").mkdir(parents=True)
    (repo / "deploy" / "claim.yaml").write_text("kind: ResourceClaim\n")
    (repo / "deploy" / "alias.yaml").symlink_to("claim.yaml")
    (repo / "deploy" / "passwd.yaml").symlink_to("/etc/passwd")
    (repo / "deploy" / "up.yaml").symlink_to("../../outside.yaml")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.invalid")  # fmt: skip
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)
    dest = tmp_path / "base"
    dest.mkdir()
    diff.export_tree("HEAD", repo, dest)  # a link out is left out, not a failure of the whole review
    assert (dest / "deploy" / "claim.yaml").read_text() == "kind: ResourceClaim\n"
    assert (dest / "deploy" / "alias.yaml").read_text() == "kind: ResourceClaim\n"
    for name in ("passwd.yaml", "up.yaml"):
        assert not (dest / "deploy" / name).is_symlink() and not (dest / "deploy" / name).exists()
