"""Review output of a hostile tree: every name and message is escaped for the format it lands in.

The reviewed files may come from an untrusted pull request, and CI runners act on what review
prints (GitHub workflow commands), render it (Markdown comments) or parse it (JUnit, SARIF).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.review.conftest import Run

# A claim whose name carries line breaks, workflow commands, a terminal escape, HTML inside
# backticks and a control character XML 1.0 forbids.
HOSTILE_NAME = r"evil\n::add-mask::secret\r::stop-commands::tok\u001b[2J`<img src=x onerror=alert(1)>`\u0001"
CLAIM = f"""\
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaim
metadata:
  name: "{HOSTILE_NAME}"
  namespace: ns
spec:
  devices:
    requests:
    - name: gpu
      deviceClassName: gpu.nvidia.com
"""
# File names a pull request can add: workflow commands, backticks with HTML, a line break.
HOSTILE_FILES = ("::error::forged.yaml", "a`<img src=x>`.yaml", "##[add-mask]m.yaml", "nl\n::warning::x.yaml")

# What the GitHub runner treats as a command: `::name` after leading blanks, and `##[` anywhere.
COMMAND = re.compile(r"^\s*::|##\[")


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in HOSTILE_FILES:
        (tmp_path / name).write_text(CLAIM, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _review(draguard: Callable[..., Run], fmt: str) -> Run:
    run = draguard("review", ".", "--root", ".", "-f", fmt)  # no policies/: the built-in checks
    assert run.code == 0, run.err  # deprecated-version warnings only
    return run


def test_text_output_starts_no_workflow_command_and_no_terminal_escape(
    draguard: Callable[..., Run], hostile: Path
) -> None:
    out = _review(draguard, "text").out
    assert "\033" not in out and "\r" not in out and "\x01" not in out
    assert "\\x1b[2J" in out  # written out, so the reader still sees what the name holds
    for line in out.splitlines():
        assert not COMMAND.search(line), line
    assert "\\::error::forged.yaml" in out  # the file is still named, neutralised


def test_github_output_has_only_draguards_own_commands(draguard: Callable[..., Run], hostile: Path) -> None:
    out = _review(draguard, "github").out
    commands = [ln for ln in out.splitlines() if COMMAND.search(ln)]
    # One annotation per finding (4 files) and nothing else a runner would act on.
    assert len(commands) == len(HOSTILE_FILES)
    for ln in commands:
        assert re.match(r"::warning file=[^:,]*,line=\d+,title=[^:,]*::", ln), ln
        message = ln.split("::", 2)[2]
        assert "\r" not in message and "\033" not in message
    assert "file=%3A%3Aerror%3A%3Aforged.yaml" in out
    assert "evil%0A::add-mask::secret%0D::stop-commands::tok" in out


def test_github_log_lines_past_the_annotation_limit_are_neutralised(
    draguard: Callable[..., Run], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # More than 10 warnings: the rest go to the log as plain lines, where a file named `::…`
    # would start a command.
    for i in range(12):
        (tmp_path / f"::stop-commands::t{i:02}.yaml").write_text(CLAIM, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    out = _review(draguard, "github").out
    log = out.split("::group::", 1)[1].split("::endgroup::", 1)[0].splitlines()[1:]
    assert len(log) == 3
    for line in log:
        assert not COMMAND.search(line), line
        assert line.startswith("\\::stop-commands::t")


def test_markdown_output_has_no_raw_html(draguard: Callable[..., Run], hostile: Path) -> None:
    out = _review(draguard, "markdown").out
    rows = [ln for ln in out.splitlines() if ln.startswith("| ⚠️")]
    assert len(rows) == len(HOSTILE_FILES)
    for row in rows:
        # Outside code spans (found as CommonMark finds them) no `<` may remain.
        prose = re.sub(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", "", row)
        assert "<" not in prose.replace("<br>", ""), row
    # The file name with backticks is one code span whose fence is longer than its backticks.
    assert "``a`<img src=x>`.yaml:1``" in out


def test_junit_output_is_xml_1_0_whatever_the_names(draguard: Callable[..., Run], hostile: Path) -> None:
    out = _review(draguard, "junit").out
    root = ET.fromstring(out.encode("utf-8"))  # raises on a character XML 1.0 forbids
    names = [case.get("name", "") for case in root.iter("testcase")]
    assert len(names) == len(HOSTILE_FILES)
    assert all("\\x01" in name and "\\x1b" in name for name in names)


def test_json_and_sarif_round_trip_the_names(draguard: Callable[..., Run], hostile: Path) -> None:
    expected = json.loads(f'"{HOSTILE_NAME}"')
    doc = json.loads(_review(draguard, "json").out)
    assert {f["object"]["name"] for f in doc["findings"]} == {expected}
    sarif = json.loads(_review(draguard, "sarif").out)
    results = sarif["runs"][0]["results"]
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results}
    assert "%3A%3Aerror%3A%3Aforged.yaml" in uris


def test_a_name_that_is_not_utf8_is_escaped_not_a_traceback(
    draguard: Callable[..., Run], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lone surrogate (legal in a JSON escape) cannot be encoded as UTF-8.
    claim = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "lone\ud800name", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]}},
    }
    (tmp_path / "claim.json").write_text(json.dumps(claim), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    for fmt in ("text", "json", "sarif", "markdown", "junit", "github"):
        out = _review(draguard, fmt).out
        assert "\\ud800" in out or "&#92;ud800" in out, fmt  # Markdown writes the backslash as an entity
    doc = json.loads(_review(draguard, "json").out)
    assert doc["findings"][0]["object"]["name"] == "lone\ud800name"


def test_base_impact_reports_escape_the_names_too(
    draguard: Callable[..., Run], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.review.test_base_diff import git

    repo = tmp_path / "gitops"
    (repo / "apps").mkdir(parents=True)
    (repo / "apps" / "ok.yaml").write_text(CLAIM.replace(HOSTILE_NAME, "fine"), encoding="utf-8")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    # The pull request adds a hostile file: a new warning in the impact report.
    (repo / "apps" / "::error::forged.yaml").write_text(CLAIM, encoding="utf-8")
    monkeypatch.chdir(repo)
    args = ("review", "apps", "--base", "HEAD", "--root", ".")

    text = draguard(*args)
    assert text.code == 0, text.err
    assert "\033" not in text.out and "\r" not in text.out and "\\x1b[2J" in text.out
    for line in text.out.splitlines():
        assert not COMMAND.search(line), line

    markdown = draguard(*args, "-f", "markdown").out
    assert "<img" not in re.sub(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", "", markdown)

    # --fail-on applies to what the change introduces: here one new warning.
    assert draguard(*args, "--fail-on", "warning", "-f", "json").code == 1
    assert draguard(*args, "--fail-on", "error", "-f", "json").code == 0


def test_error_messages_quoting_a_hostile_file_name_are_neutralised(
    draguard: Callable[..., Run], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "##[add-mask]x\033[2J.yaml").write_text("kind: [\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    run = draguard("review", ".")
    assert run.code == 2
    line = run.err.strip().splitlines()[-1]
    assert "invalid YAML" in line and "##\\[add-mask]x\\x1b[2J.yaml" in line
    assert not COMMAND.search(line) and "\033" not in line
