"""`.draguard.yaml`: where it is found, what it sets, that flags win, and that every mistake in it is
one clear line (file, line, key, fix) with exit 2, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.review.conftest import FIXTURES, Run

# legacy/: one warn-mode and one audit-mode migration finding; team-ml/: enforce-mode findings.
SETTINGS = "review:\n  policies: policies\n  inventory: inventory.yaml\n"


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository holding the review fixtures, the working directory at its root."""
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "manifests", root / "manifests")
    shutil.copytree(FIXTURES / "policies", root / "policies")
    shutil.copy(FIXTURES / "inventory.yaml", root / "inventory.yaml")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    monkeypatch.chdir(root)
    return root


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _rules(run: Run) -> list[tuple[str, str]]:
    return sorted((f["rule"], f["file"]) for f in json.loads(run.out)["findings"])


def test_fail_on_from_the_file_and_the_flag_wins(draguard: Callable[..., Run], repo: Path) -> None:
    _write(repo / ".draguard.yaml", SETTINGS + "  fail-on: warning\n")
    assert draguard("review", "manifests/legacy").code == 1  # a warn-mode finding fails now
    assert draguard("review", "manifests/legacy", "--fail-on", "error").code == 0
    assert draguard("review", "manifests/legacy", "--no-config", "--policies", "policies",
                    "--inventory", "inventory.yaml").code == 0


def test_found_at_the_repository_root_from_a_subdirectory(
    draguard: Callable[..., Run], repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(repo / ".draguard.yaml", SETTINGS + "  paths: [manifests/legacy]\n  format: json\n")
    monkeypatch.chdir(repo / "manifests" / "team-ml")
    run = draguard("review")  # paths, policies, inventory and format all from the file
    assert run.code == 0, run.err
    assert [r for r, _ in _rules(run)] == ["migrate/legacy-gpu", "migrate/legacy-gpu"]
    assert all("legacy" in f for _, f in _rules(run))


def test_the_working_directory_file_comes_before_the_root_one(
    draguard: Callable[..., Run], repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(repo / ".draguard.yaml", "review:\n  fail-on: never\n")
    sub = repo / "manifests"
    _write(sub / ".draguard.yaml", "review:\n  policies: ../policies\n  inventory: ../inventory.yaml\n"
           "  fail-on: info\n")
    monkeypatch.chdir(sub)
    assert draguard("review", "legacy").code == 1  # info: the audit finding fails


def test_config_flag_and_no_config(draguard: Callable[..., Run], repo: Path) -> None:
    _write(repo / ".draguard.yaml", "review:\n  bogus: 1\n")  # would fail if read
    other = _write(repo / "ci.yaml", SETTINGS + "  format: [json]\n")
    run = draguard("review", "manifests/legacy", "--config", str(other))
    assert run.code == 0 and len(_rules(run)) == 2
    assert draguard("review", "manifests/legacy", "--no-config", "--policies", "policies").code == 0
    missing = draguard("review", "manifests/legacy", "--config", "nope.yaml")
    assert missing.code == 2 and "nope.yaml: config file not found" in missing.err


def test_formats_and_outputs_from_the_file(draguard: Callable[..., Run], repo: Path) -> None:
    _write(repo / ".draguard.yaml", SETTINGS + "  format: [text, sarif=out/review.sarif]\n")
    (repo / "out").mkdir()
    run = draguard("review", "manifests/legacy")
    assert "migrate/legacy-gpu" in run.out  # text on stdout
    sarif = json.loads((repo / "out" / "review.sarif").read_text(encoding="utf-8"))
    assert len(sarif["runs"][0]["results"]) == 2
    # A --format on the command line replaces the file's list.
    run = draguard("review", "manifests/legacy", "--format", "json")
    assert len(_rules(run)) == 2


def test_exclude_paths_and_globs(draguard: Callable[..., Run], repo: Path) -> None:
    exclude = "  exclude: [manifests/team-ml, '**/old-*.yaml']\n"
    _write(repo / ".draguard.yaml", SETTINGS + "  format: json\n" + exclude)
    run = draguard("review", "manifests")
    files = {f for _, f in _rules(run)}
    assert "manifests/legacy/gpu-training-legacy.yaml" in files, files
    assert not any("team-ml" in f or "old-job" in f for f in files), files
    every = draguard("review", "manifests", "--no-config", "--policies", "policies", "-f", "json")
    assert any("team-ml" in f for _, f in _rules(every)) and any("old-job" in f for _, f in _rules(every))


def test_allow_empty_from_the_file_and_its_negation(draguard: Callable[..., Run], repo: Path) -> None:
    (repo / "empty").mkdir()
    _write(repo / ".draguard.yaml", SETTINGS + "  allow-empty: true\n")
    assert draguard("review", "empty").code == 0
    refused = draguard("review", "empty", "--no-allow-empty")
    assert refused.code == 2 and "no Kubernetes objects" in refused.err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("review:\n  fail_on: warning\n",
         ".draguard.yaml:2: review.fail_on: unknown setting; did you mean 'fail-on'?"),
        ("reveiw:\n  fail-on: warning\n", ".draguard.yaml:1: unknown key 'reveiw'; did you mean 'review'?"),
        ("review:\n  fail-on: warnings\n",
         ".draguard.yaml:2: review.fail-on: 'warnings' is not one of error, warning, info, never"),
        ("review:\n  allow-empty: 'yes'\n",
         ".draguard.yaml:2: review.allow-empty: expected true or false, got a string ('yes')"),
        ("review:\n  paths: {a: 1}\n",
         ".draguard.yaml:2: review.paths: expected a list of strings, got a mapping"),
        ("review:\n  format: [json, xml]\n", ".draguard.yaml:2: review.format: unknown format 'xml'"),
        ("review:\n  policies: 42\n",
         ".draguard.yaml:2: review.policies: expected a non-empty string, got a number"),
        ("review: [fail-on]\n", ".draguard.yaml:1: review: expected a mapping of settings, got a list"),
        ("- review\n", ".draguard.yaml:1: expected a mapping with a 'review:' section, got a list"),
        ("review:\n  exclude: [../elsewhere]\n", ".draguard.yaml:2: review.exclude: '../elsewhere' leaves"),
        ("review:\n  fail-on: [a\n", ".draguard.yaml:3:1: invalid YAML"),
        ("review:\n  fail-on: error\n  fail-on: never\n", ".draguard.yaml:3:3: duplicate key 'fail-on'"),
        ("review: {}\n---\nreview: {}\n", ".draguard.yaml:3: more than one YAML document"),
    ],
)
def test_mistakes_are_one_clear_line(
    draguard: Callable[..., Run], repo: Path, text: str, expected: str
) -> None:
    _write(repo / ".draguard.yaml", text)
    run = draguard("review", "manifests/legacy")
    assert run.code == 2
    assert run.out == ""
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.err, run.err
    assert lines[0].startswith("draguard review: " + expected), lines[0]


def test_unquoted_version_number_is_read_as_written(draguard: Callable[..., Run], repo: Path) -> None:
    _write(repo / ".draguard.yaml", SETTINGS + "  kubernetes-version: 1.35\n  format: json\n")
    run = draguard("review", "manifests/legacy")
    assert run.code == 0, run.err
    assert json.loads(run.out)["kubernetesVersion"] == "1.35"
