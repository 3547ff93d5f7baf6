"""Every output format of `draguard review`, against golden files and the formats' own rules."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.review.conftest import Run, check_golden
from webhook.review.formats.github import escape_data, escape_property

ARGS = ("review", "manifests", "--policies", "policies", "--inventory", "inventory.yaml", "--root", ".")
SUFFIX = {
    "text": "txt",
    "json": "json",
    "markdown": "md",
    "sarif": "sarif",
    "junit": "xml",
    "github": "github.txt",
}


@pytest.mark.parametrize("fmt", list(SUFFIX))
def test_format_matches_golden(fmt: str, draguard: Callable[..., Run], in_fixtures: Path) -> None:
    run = draguard(*ARGS, "--format", fmt)
    assert run.code == 1, run.err  # the fixtures hold enforce-mode findings
    assert run.err == ""
    # JUnit times are measured: compare everything else.
    out = re.sub(r'time="[0-9.]+"', 'time="T"', run.out) if fmt == "junit" else run.out
    check_golden(f"review.{SUFFIX[fmt]}", out)


def test_json_has_exactly_the_documented_shape(draguard: Callable[..., Run], in_fixtures: Path) -> None:
    doc = json.loads(draguard(*ARGS, "-f", "json").out)
    assert set(doc) == {"findings", "summary", "kubernetesVersion"}
    assert doc["kubernetesVersion"] == "1.37"  # the release selectors were judged for
    assert set(doc["summary"]) == {"objects", "errors", "warnings", "audits"}
    assert doc["summary"]["objects"] == 13
    modes = {f["mode"] for f in doc["findings"]}
    assert modes == {"enforce", "warn", "audit"}
    for f in doc["findings"]:
        assert set(f) == {"file", "line", "object", "rule", "severity", "mode", "message", "fix"}
        assert set(f["object"]) == {"apiVersion", "kind", "namespace", "name"}
        assert isinstance(f["line"], int) and f["line"] >= 1
    assert doc["summary"]["errors"] == sum(1 for f in doc["findings"] if f["mode"] == "enforce")
    # The finding on the constraint points at the matchAttribute line, not the document start.
    inter = next(f for f in doc["findings"] if f["rule"] == "structure/interconnect")
    assert inter["file"] == "manifests/team-ml/training-claim.yaml"
    lines = Path("manifests/team-ml/training-claim.yaml").read_text().splitlines()
    assert "matchAttribute" in lines[inter["line"] - 1]


def test_sarif_has_the_2_1_0_required_keys_and_types(draguard: Callable[..., Run], in_fixtures: Path) -> None:
    doc = json.loads(draguard(*ARGS, "-f", "sarif").out)
    assert doc["version"] == "2.1.0"
    assert isinstance(doc["$schema"], str) and "sarif" in doc["$schema"]
    assert isinstance(doc["runs"], list) and len(doc["runs"]) == 1
    run = doc["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "draguard" and isinstance(driver["version"], str)
    rule_ids = [r["id"] for r in driver["rules"]]
    assert len(rule_ids) == len(set(rule_ids))
    for rule in driver["rules"]:
        assert isinstance(rule["id"], str)
        assert isinstance(rule["shortDescription"]["text"], str) and rule["shortDescription"]["text"]
        assert isinstance(rule["help"]["text"], str) and rule["help"]["text"]
        assert rule["defaultConfiguration"]["level"] in {"error", "warning", "note"}
    assert run["results"], "the fixtures have findings"
    for res in run["results"]:
        assert isinstance(res["ruleId"], str)
        assert rule_ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] in {"error", "warning", "note", "none"}
        assert isinstance(res["message"]["text"], str) and res["message"]["text"]
        loc = res["locations"][0]["physicalLocation"]
        assert isinstance(loc["artifactLocation"]["uri"], str)
        assert not loc["artifactLocation"]["uri"].startswith("/")
        assert isinstance(loc["region"]["startLine"], int) and loc["region"]["startLine"] >= 1
    levels = {r["level"] for r in run["results"]}
    assert levels == {"error", "warning", "note"}


def test_junit_has_one_case_per_object_and_rule_that_fired(
    draguard: Callable[..., Run], in_fixtures: Path
) -> None:
    run = draguard(*ARGS, "-f", "junit")
    root = ET.fromstring(run.out)
    assert root.tag == "testsuites"
    cases = root.findall("./testsuite/testcase")
    findings = json.loads(draguard(*ARGS, "-f", "json").out)["findings"]
    fired = {(f["file"], f["object"]["kind"], f["object"]["name"], f["rule"]) for f in findings}
    clean = 13 - len({k[:3] for k in fired})  # objects nothing fired on: one passing case each
    assert len(cases) == len(fired) + clean
    enforced = {k for k in fired if any(
        (f["file"], f["object"]["kind"], f["object"]["name"], f["rule"]) == k and f["mode"] == "enforce"
        for f in findings)}  # fmt: skip
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == len(enforced) == int(root.get("failures", "-1"))
    # Warnings are visible to GitLab and GitHub reporters: a skipped case with the message.
    warned = [c for c in cases if c.find("skipped") is not None]
    assert warned and all(c.find("skipped").get("message", "").startswith("warning: ") for c in warned)  # type: ignore[union-attr]
    assert int(root.get("skipped", "-1")) == len(warned)
    assert int(root.get("tests", "-1")) == len(cases)
    assert float(root.get("time", "-1")) > 0
    for suite in root.findall("testsuite"):
        assert int(suite.get("tests", "-1")) == len(suite.findall("testcase"))
        assert suite.get("file") == suite.get("name")
    for c in cases:
        assert c.get("file", "").startswith("manifests/") and float(c.get("time", "-1")) >= 0
    lined = [c for c in failed if c.get("line")]
    assert lined and all(int(c.get("line", "0")) >= 1 for c in lined)


def test_github_annotations_escape_data_and_properties() -> None:
    assert escape_data("100% done\r\nnext") == "100%25 done%0D%0Anext"
    assert escape_property("dir,a:b/x%.yaml\n") == "dir%2Ca%3Ab/x%25.yaml%0A"
    # data keeps ':' and ',' (only properties need them escaped)
    assert escape_data("a:b,c") == "a:b,c"


def test_github_annotation_lines(draguard: Callable[..., Run], in_fixtures: Path) -> None:
    out = draguard(*ARGS, "-f", "github").out.splitlines()
    annotations = [ln for ln in out if ln.startswith(("::error ", "::warning ", "::notice "))]
    assert any(
        ln.startswith("::error file=manifests/team-ml/training-claim.yaml,line=15,") for ln in annotations
    )
    assert any(ln.startswith("::warning ") for ln in annotations)
    assert any(ln.startswith("::notice ") for ln in annotations)
    for ln in annotations:
        props, _, message = ln[2:].partition("::")
        assert "\n" not in message and "\r" not in message
        for prop in props.split(" ", 1)[1].split(","):
            key, _, value = prop.partition("=")
            assert key in {"file", "line", "title"}
            assert ":" not in value and "," not in value


def test_text_is_plain_off_a_tty_and_respects_no_color(
    draguard: Callable[..., Run], in_fixtures: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = draguard(*ARGS).out
    assert "\033[" not in plain
    assert plain.rstrip().splitlines()[-1] == (
        "13 objects in 7 files (2 ignored: kinds no rule reads): "
        "4 errors (enforce), 10 warnings, 1 audit finding"
    )
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert "\033[31menforce\033[0m" in draguard(*ARGS).out
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\033[" not in draguard(*ARGS).out


def test_markdown_is_a_pr_comment(draguard: Callable[..., Run], in_fixtures: Path) -> None:
    md = draguard(*ARGS, "-f", "markdown").out
    assert md.startswith("### draguard review\n")
    assert "❌ **denied**" in md
    table = [ln for ln in md.splitlines() if ln.startswith("| ❌")]
    assert len(table) == 4
    for row in table:  # messages with pipes or newlines must not break the table
        assert row.count(" | ") >= 5 and "\n" not in row


def test_output_file(draguard: Callable[..., Run], in_fixtures: Path, tmp_path: Path) -> None:
    target = tmp_path / "report.sarif"
    run = draguard(*ARGS, "-f", "sarif", "--output", str(target))
    assert run.code == 1 and run.out == ""
    assert json.loads(target.read_text())["version"] == "2.1.0"


def _unescape(value: str) -> str:
    for code, ch in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        value = value.replace(code, ch)
    return value


def test_github_escaping_round_trips() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    @given(st.text(alphabet=st.sampled_from("ab%:,\r\n %25%0A"), max_size=40))
    def check(text: str) -> None:
        prop = escape_property(text)
        assert not set(prop) & set(":,\r\n")
        assert _unescape(prop) == text
        data = escape_data(text)
        assert not set(data) & set("\r\n")
        assert _unescape(data) == text

    check()


# -- paths relative to the repository root; GitHub's annotation limit -----------------------------

PLAIN = ("review", "manifests", "--policies", "policies", "--inventory", "inventory.yaml")


def _sarif_uris(out: str) -> list[dict[str, str]]:
    run = json.loads(out)["runs"][0]
    return [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in run["results"]]


def test_paths_are_relative_to_the_git_top_level_by_default(
    draguard: Callable[..., Run], in_fixtures: Path
) -> None:
    # Run from tests/review/fixtures: code scanning resolves URIs against the repository root.
    for loc in _sarif_uris(draguard(*PLAIN, "-f", "sarif").out):
        assert loc["uriBaseId"] == "%SRCROOT%"
        assert loc["uri"].startswith("tests/review/fixtures/manifests/"), loc
    annotations = [ln for ln in draguard(*PLAIN, "-f", "github").out.splitlines() if "file=" in ln]
    assert annotations and all("file=tests/review/fixtures/manifests/" in ln for ln in annotations)
    root = ET.fromstring(draguard(*PLAIN, "-f", "junit").out)
    assert all(c.get("file", "").startswith("tests/review/fixtures/") for c in root.iter("testcase"))


def test_absolute_inputs_are_made_relative_or_become_file_uris(
    draguard: Callable[..., Run], in_fixtures: Path, tmp_path: Path
) -> None:
    inside = ("review", str(in_fixtures / "manifests"), *PLAIN[2:], "-f", "sarif")
    for loc in _sarif_uris(draguard(*inside, "--root", str(in_fixtures)).out):
        assert loc["uri"].startswith("manifests/") and loc["uriBaseId"] == "%SRCROOT%"
    # Outside the root: an absolute file: URI and no uriBaseId (SARIF1004).
    for loc in _sarif_uris(draguard(*inside, "--root", str(tmp_path)).out):
        assert loc["uri"].startswith("file:///") and "uriBaseId" not in loc


def test_github_annotations_stay_within_the_per_step_limit(tmp_path: Path) -> None:
    from webhook.core.findings import Finding, Mode, ObjectRef, Report, Severity
    from webhook.review.formats import ReviewResult
    from webhook.review.formats.github import ANNOTATIONS_PER_KIND, render

    ref = ObjectRef("v1", "Pod", "ns", "p")
    findings = [Finding(rule="quota/x", severity=Severity.ERROR, mode=Mode.ENFORCE, object=ref,
                        message=f"error {i}", file="a.yaml", line=i + 1) for i in range(25)]  # fmt: skip
    findings += [Finding(rule="cel/x", severity=Severity.WARNING, mode=Mode.WARN, object=ref,
                         message=f"warning {i}", file="a.yaml", line=100 + i) for i in range(3)]  # fmt: skip
    out = render(ReviewResult(Report(findings=findings))).splitlines()
    errors = [ln for ln in out if ln.startswith("::error ")]
    assert len(errors) == ANNOTATIONS_PER_KIND == 10
    assert "16 more errors than GitHub annotates per step" in errors[-1]
    assert len([ln for ln in out if ln.startswith("::warning ")]) == 3
    # Nothing is lost: the rest is in the log, in a group.
    logged = [ln for ln in out if ": enforce: [quota/x]" in ln]
    assert len(logged) == 16 and any("error 24" in ln for ln in logged)
    assert "::group::" in "\n".join(out) and "::endgroup::" in out
