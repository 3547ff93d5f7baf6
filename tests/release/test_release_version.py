"""The version a release build derives from git tags (scripts/release/version.py), on real repositories."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version
from release_scripts import SCRIPTS, commit, git, load, new_repo

version = load("version")


def cli(repo: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "version.py"), "--repo", str(repo), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_untagged_repository_is_a_development_build_of_pyprojects_version(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "r", "0.4.0")
    head = commit(repo, "two")
    v = version.derive(repo)
    assert (v.python, v.oci, v.release, v.tag) == (
        f"0.4.0.dev2+g{head[:12]}",
        f"0.4.0-dev.2.g{head[:12]}",
        False,
        None,
    )
    assert Version(v.python) < Version("0.4.0")


def test_a_tagged_commit_is_that_release_and_the_next_commit_a_dev_of_the_next_patch(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "r")
    git(repo, "tag", "-a", "v1.2.3", "-m", "release")
    res = cli(repo, "--require-release", "--json")
    assert res.returncode == 0, res.stderr
    assert (
        '"python": "1.2.3"' in res.stdout
        and '"oci": "1.2.3"' in res.stdout
        and '"release": true' in res.stdout
    )

    head = commit(repo, "after")
    v = version.derive(repo)
    assert v.python == f"1.2.4.dev1+g{head[:12]}" and v.oci == f"1.2.4-dev.1.g{head[:12]}"
    assert Version("1.2.3") < Version(v.python) < Version("1.2.4")
    res = cli(repo, "--require-release")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "is not a release: it derives 1.2.4.dev1" in res.stderr


def test_release_candidates_order_before_the_release_and_after_each_other(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "r")
    git(repo, "tag", "v2.0.0-rc.1")
    v = version.derive(repo)
    assert (v.python, v.oci, v.release) == ("2.0.0rc1", "2.0.0-rc.1", True)
    commit(repo, "fix")
    dev = version.derive(repo)
    assert Version("2.0.0rc1") < Version(dev.python) < Version("2.0.0rc2") < Version("2.0.0")
    assert dev.oci.startswith("2.0.0-rc.2.dev.1.g")


def test_tags_that_are_not_versions_are_ignored(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "r", "0.9.0")
    git(repo, "tag", "v1.2")
    git(repo, "tag", "v1.2.3.4")
    git(repo, "tag", "release-3")
    v = version.derive(repo)
    assert v.tag is None and v.python.startswith("0.9.0.dev1+g") and not v.release


def test_uncommitted_changes_are_never_the_release(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "r")
    git(repo, "tag", "v1.0.0")
    (repo / "log.txt").write_text("edited\n")
    v = version.derive(repo)
    assert not v.release and v.python.startswith("1.0.0+g") and v.python.endswith(".dirty")
    assert "+" not in v.oci and v.oci.endswith("-dirty")
    Version(v.python)  # still a valid PEP 440 version


def test_stamp_writes_only_the_project_version_and_dunder_versions(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[build-system]\nrequires = ["x"]\n\n[project]\nname = "d"\nversion = "0.1.0"\n'
        '\n[tool.other]\nversion = "7"\n'
    )
    init = tmp_path / "__init__.py"
    init.write_text('"""doc"""\n\n__version__ = "0.1.0"\n')
    version.stamp("1.4.0", [pyproject, init])
    assert pyproject.read_text().count('version = "1.4.0"') == 1 and 'version = "7"' in pyproject.read_text()
    assert '__version__ = "1.4.0"' in init.read_text()

    bare = tmp_path / "other.py"
    bare.write_text("x = 1\n")
    with pytest.raises(version.VersionError, match="expected exactly one version line to stamp, found 0"):
        version.stamp("1.4.0", [bare])


def test_cli_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    res = cli(tmp_path)  # not a git repository
    assert res.returncode == 1 and res.stderr.startswith("version.py: ") and "Traceback" not in res.stderr
    repo = new_repo(tmp_path / "r")
    res = cli(repo, "--github-output", env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 1 and "needs $GITHUB_OUTPUT" in res.stderr


def test_github_output_gives_later_jobs_every_form(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "r")
    git(repo, "tag", "v3.1.4")
    out = tmp_path / "out"
    res = cli(repo, "--github-output", env={"PATH": "/usr/bin:/bin", "GITHUB_OUTPUT": str(out)})
    assert res.returncode == 0, res.stderr
    assert out.read_text().splitlines() == ["version=3.1.4", "oci_tag=3.1.4", "release=true"]
