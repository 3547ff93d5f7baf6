"""The GitHub Action (action.yml): actionlint checks it through the workflow that uses it, every action it
calls is pinned by digest, and its review step, run here on a real git repository with a base branch,
reads the policies from the base so a pull request cannot except itself."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kbundle import REPO

from tests.gotool import go_tool

ACTION = REPO / "action.yml"
SCRIPT = REPO / "scripts" / "action-review.sh"
WORKFLOW = REPO / ".github" / "workflows" / "review.yml"

# A claim without a device class: the API server rejects it (structure/invalid, an error).
BAD_CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: no-class, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {count: 1}
"""
EXCEPT_ALL = """\
apiVersion: policy.draguard.io/v1alpha1
kind: PolicyException
metadata: {name: let-me-pass}
spec:
  namespaces: ["*"]
  expires: "2999-01-01"
  reason: added by the pull request itself
"""


def test_actionlint_checks_the_workflow_that_uses_the_action() -> None:
    res = subprocess.run(
        [str(go_tool("actionlint")), "-shellcheck=", "-pyflakes=", str(WORKFLOW)],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["review"]["steps"]
    assert any(s.get("uses") == "./" for s in steps), "the workflow runs the action users get"


def test_every_action_the_action_calls_is_pinned_by_digest() -> None:
    pinned = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
    steps = yaml.safe_load(ACTION.read_text())["runs"]["steps"]
    uses = [s["uses"] for s in steps if "uses" in s]
    assert uses and all(pinned.match(u) for u in uses), uses
    # No input reaches a shell script through ${{ }} (template injection): only through env.
    for s in steps:
        assert "${{" not in s.get("run", ""), s["name"]


def test_fork_pull_requests_skip_the_steps_that_need_write_access() -> None:
    steps = {s.get("name", s.get("uses")): s for s in yaml.safe_load(ACTION.read_text())["runs"]["steps"]}
    for name in ("Upload SARIF", "Pull-request comment (one, updated on each push)"):
        assert "head.repo.full_name == github.repository" in steps[name]["if"], name
        assert steps[name]["continue-on-error"] is True


def _git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="ci", GIT_AUTHOR_EMAIL="ci@example.invalid",
               GIT_COMMITTER_NAME="ci", GIT_COMMITTER_EMAIL="ci@example.invalid")  # fmt: skip
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def pr_repo(tmp_path: Path) -> Path:
    """A repository whose base branch (origin/main) has the shipped policies, and whose pull request
    adds an invalid claim and a PolicyException that would excuse it."""
    repo = tmp_path / "repo"
    (repo / "deploy").mkdir(parents=True)
    shutil.copytree(REPO / "policies", repo / "policies", ignore=shutil.ignore_patterns("tests"))
    (repo / "deploy" / "ok.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "base")
    _git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    _git(repo, "checkout", "-q", "-b", "pr")
    (repo / "deploy" / "claim.yaml").write_text(BAD_CLAIM)
    (repo / "policies" / "zz-exception.yaml").write_text(EXCEPT_ALL)
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "pr")
    return repo


def _run(repo: Path, tmp: Path, **env: str) -> tuple[int, dict[str, str], str]:
    out_file = tmp / "github_output"
    out_file.write_text("")
    bindir = Path(sys.executable).parent  # the draguard console script of this environment
    full = dict(os.environ)
    full.update(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", GITHUB_OUTPUT=str(out_file))
    full.update(DRAGUARD_OUT=str(tmp / "reports"), DRAGUARD_PATHS="deploy/", DRAGUARD_BASE_REF="main")
    full.update(env)
    res = subprocess.run(
        ["bash", str(SCRIPT)], cwd=repo, capture_output=True, text=True, env=full, timeout=300
    )
    outputs = dict(line.split("=", 1) for line in out_file.read_text().splitlines() if "=" in line)
    return res.returncode, outputs, res.stdout + res.stderr


def test_policies_come_from_the_base_branch_so_a_pr_cannot_except_itself(
    pr_repo: Path, tmp_path: Path
) -> None:
    rc, outputs, log = _run(pr_repo, tmp_path)
    assert rc == 0, log  # the step itself succeeds; the action's last step fails the job on exit-code 1
    assert outputs["exit-code"] == "1", log
    assert "::error" in log and "claim.yaml" in log  # an annotation on the new file
    sarif = json.loads(Path(outputs["sarif"]).read_text())
    assert any(r["level"] == "error" for run in sarif["runs"] for r in run["results"])
    assert "no-class" in Path(outputs["markdown"]).read_text()
    # Policies from the pull request's own tree let its exception through: why base is the default.
    rc, outputs, log = _run(pr_repo, tmp_path, DRAGUARD_TRUSTED_FROM="head")
    assert (rc, outputs["exit-code"]) == (0, "0"), log


def test_a_missing_base_branch_or_bad_input_is_an_error_not_a_pass(pr_repo: Path, tmp_path: Path) -> None:
    rc, outputs, log = _run(pr_repo, tmp_path, DRAGUARD_BASE_REF="nope")
    assert (rc, outputs["exit-code"]) == (2, "2"), log
    assert "fetch-depth: 0" in log
    rc, outputs, log = _run(pr_repo, tmp_path, DRAGUARD_FAIL_ON="sometimes")
    assert rc == 2 and "fail-on must be" in log
    rc, outputs, log = _run(pr_repo, tmp_path, DRAGUARD_POLICIES="no-such-dir")
    assert rc == 2 and "no-such-dir does not exist on origin/main" in log
