"""Checks that fail when they should: no input is not "no findings", duplicate keys are errors,
`--fail-on` sets the threshold, and several reports come from one run."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.review.conftest import FIXTURES, Run

POLICIES = str(FIXTURES / "policies")
INVENTORY = str(FIXTURES / "inventory.yaml")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_an_empty_directory_is_an_error_unless_allowed(draguard: Callable[..., Run], workdir: Path) -> None:
    (workdir / "deploy").mkdir()
    (workdir / "deploy" / "notes.yaml").write_text("just: data\n", encoding="utf-8")  # no kind
    run = draguard("review", "deploy", "--policies", POLICIES)
    assert run.code == 2
    assert "no Kubernetes objects in deploy (1 file read, 1 document(s) without a kind)" in run.err
    assert "--allow-empty" in run.err
    allowed = draguard("review", "deploy", "--policies", POLICIES, "--allow-empty")
    assert allowed.code == 0, allowed.err
    assert "0 objects in 1 file" in allowed.out


def test_a_wrong_path_is_an_error(draguard: Callable[..., Run], workdir: Path) -> None:
    run = draguard("review", "deplyo", "--policies", POLICIES, "--allow-empty")
    assert run.code == 2 and "deplyo: no such file or directory" in run.err


def test_duplicate_keys_name_the_file_and_both_lines(draguard: Callable[..., Run], workdir: Path) -> None:
    (workdir / "claim.yaml").write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: a\n  namespace: ns\n"
        "spec:\n  devices:\n    requests:\n    - name: gpu\n      exactly:\n"
        "        deviceClassName: gpu.nvidia.com-h100\n        deviceClassName: gpu.nvidia.com-a100\n",
        encoding="utf-8",
    )
    run = draguard("review", "claim.yaml", "--policies", POLICIES)
    assert run.code == 2
    assert "claim.yaml:12:9: duplicate key 'deviceClassName' (first on line 11, again on line 12)" in run.err


def test_duplicate_keys_are_found_next_to_merge_keys(draguard: Callable[..., Run], workdir: Path) -> None:
    # Merge keys take PyYAML's own constructor path; an explicit duplicate there is still an error,
    # while a key overriding a merged one is not.
    (workdir / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: &l {x: '1'}\n"
        "data:\n  <<: *l\n  x: '2'\n  y: '3'\n  y: '4'\n",
        encoding="utf-8",
    )
    run = draguard("review", "cm.yaml", "--policies", POLICIES)
    assert run.code == 2 and "cm.yaml:10:3: duplicate key 'y' (first on line 9, again on line 10)" in run.err


LEGACY = """\
apiVersion: v1
kind: Pod
metadata:
  name: legacy
  namespace: {namespace}
spec:
  containers:
  - name: c
    image: busybox
    resources:
      limits:
        nvidia.com/gpu: 1
"""


@pytest.mark.parametrize(
    ("fail_on", "codes"),
    # exit code for: a warning only, an audit finding only
    [("error", (0, 0)), ("warning", (1, 0)), ("info", (1, 1)), ("never", (0, 0))],
)
def test_fail_on_sets_the_threshold(
    draguard: Callable[..., Run], workdir: Path, fail_on: str, codes: tuple[int, int]
) -> None:
    # The fixtures' MigrationPolicy warns in `default` and only records (audit) in `legacy-batch`.
    (workdir / "warn.yaml").write_text(LEGACY.format(namespace="default"), encoding="utf-8")
    (workdir / "audit.yaml").write_text(LEGACY.format(namespace="legacy-batch"), encoding="utf-8")
    for file, code in zip(("warn.yaml", "audit.yaml"), codes, strict=True):
        run = draguard("review", file, "--policies", POLICIES, "--fail-on", fail_on, "-f", "json")
        modes = {f["mode"] for f in json.loads(run.out)["findings"]}
        assert modes == {"warn" if file == "warn.yaml" else "audit"}, run.out
        assert run.code == code, (file, run.err)


def test_fail_on_never_still_fails_on_unreadable_input(draguard: Callable[..., Run], workdir: Path) -> None:
    (workdir / "bad.yaml").write_text("kind: [\n", encoding="utf-8")
    assert draguard("review", "bad.yaml", "--fail-on", "never", "--policies", POLICIES).code == 2


def test_several_formats_from_one_run(
    draguard: Callable[..., Run], in_fixtures: Path, tmp_path: Path
) -> None:
    sarif, junit = tmp_path / "r.sarif", tmp_path / "r.xml"
    run = draguard(
        "review", "manifests", "--policies", "policies", "--inventory", "inventory.yaml",
        "--format", "github", "--format", f"sarif={sarif}", "-f", f"junit={junit}",
    )  # fmt: skip
    assert run.code == 1, run.err
    assert run.out.startswith("::")  # github to stdout
    doc = json.loads(sarif.read_text(encoding="utf-8"))
    assert doc["version"] == "2.1.0" and doc["runs"][0]["results"]
    assert ET.fromstring(junit.read_text(encoding="utf-8")).get("failures") != "0"
    # The old single-format form still works, with --output.
    out = tmp_path / "one.json"
    single = draguard("review", "manifests", "--policies", "policies", "-f", "json", "-o", str(out))
    assert single.code == 1 and single.out == ""
    assert json.loads(out.read_text(encoding="utf-8"))["summary"]["objects"] > 0


def test_two_formats_on_stdout_or_an_unknown_format_are_usage_errors(
    draguard: Callable[..., Run], in_fixtures: Path
) -> None:
    both = draguard("review", "manifests", "-f", "text", "-f", "json")
    assert both.code == 2 and "--format text and json would all write to stdout" in both.err
    unknown = draguard("review", "manifests", "-f", "yaml")
    assert unknown.code == 2 and "unknown format 'yaml'" in unknown.err
