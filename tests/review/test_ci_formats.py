"""CI ergonomics: SARIF rule help and suppressions, GitLab Code Quality, the kubectl plugin and
shell completion built from the parser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.review.conftest import FIXTURES, Run
from webhook.review import rules
from webhook.review.formats import RULES_URL

REPO = Path(__file__).resolve().parents[2]
ARGS = ("review", "manifests", "--policies", "policies", "--inventory", "inventory.yaml", "--root", ".")

# No copy of the SARIF 2.1.0 JSON schema ships in a package here, so this is the part of it the
# report uses, transcribed from the standard: required properties, enums and types.
_MESSAGE = {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}
_LEVEL = {"enum": ["none", "note", "warning", "error"]}
SARIF_SUBSET: dict[str, Any] = {
    "type": "object",
    "required": ["version", "runs"],
    "properties": {
        "version": {"enum": ["2.1.0"]},
        "$schema": {"type": "string"},
        "runs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["tool"],
                "properties": {
                    "tool": {
                        "type": "object",
                        "required": ["driver"],
                        "properties": {
                            "driver": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "rules": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["id"],
                                            "properties": {
                                                "id": {"type": "string"},
                                                "shortDescription": _MESSAGE,
                                                "fullDescription": _MESSAGE,
                                                "help": _MESSAGE,
                                                "helpUri": {"type": "string", "format": "uri"},
                                                "defaultConfiguration": {
                                                    "type": "object",
                                                    "properties": {
                                                        "level": _LEVEL
                                                    },
                                                },
                                            },
                                        },
                                    },
                                },
                            }
                        },
                    },
                    "results": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["message"],
                            "properties": {
                                "ruleId": {"type": "string"},
                                "ruleIndex": {"type": "integer", "minimum": -1},
                                "level": _LEVEL,
                                "message": _MESSAGE,
                                "suppressions": {
                                    "type": "array",
                                    "uniqueItems": True,
                                    "items": {
                                        "type": "object",
                                        "required": ["kind"],
                                        "properties": {
                                            "kind": {"enum": ["inSource", "external"]},
                                            "status": {"enum": ["accepted", "underReview", "rejected"]},
                                            "justification": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the review fixtures to change, as the working directory."""
    dst = tmp_path / "repo"
    shutil.copytree(FIXTURES, dst)
    monkeypatch.chdir(dst)
    return dst


def _sarif(draguard: Callable[..., Run], *extra: str) -> dict[str, Any]:
    run = draguard(*ARGS, "-f", "sarif", *extra)
    assert run.code == 1, run.err
    doc: dict[str, Any] = json.loads(run.out)
    jsonschema.validate(doc, SARIF_SUBSET, format_checker=jsonschema.FormatChecker())
    return doc


# --------------------------------------------------------------------------- SARIF


def test_sarif_lists_every_rule_with_help_links_into_the_reference(
    draguard: Callable[..., Run], tree: Path
) -> None:
    doc = _sarif(draguard)
    run = doc["runs"][0]
    descriptors = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    # Every documented rule is there, fired or not (family ids only as they fired).
    for d in rules.catalog():
        if not d.family:
            assert d.id in descriptors, d.id
    assert "tier/gpu-tiers" in descriptors  # the family member the fixtures fire
    anchors = {rules.anchor(h) for h in (REPO / "docs/rules.md").read_text().split("\n### ")[1:]
               for h in [h.split("\n", 1)[0]]}
    for rid, r in descriptors.items():
        assert r["helpUri"].startswith(RULES_URL + "#"), rid
        assert r["helpUri"].split("#", 1)[1] in anchors, f"{rid}: {r['helpUri']} names no heading"
        assert r["shortDescription"]["text"] and r["fullDescription"]["text"]
        assert r["shortDescription"]["text"] != r["fullDescription"]["text"]
    assert descriptors["tier/gpu-tiers"]["helpUri"] == f"{RULES_URL}#tierpolicy"
    # Results point at descriptors by index.
    ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    for res in run["results"]:
        assert ids[res["ruleIndex"]] == res["ruleId"]


def test_sarif_rules_url_sets_the_help_link_base(draguard: Callable[..., Run], tree: Path) -> None:
    base = "https://git.example.com/platform/draguard/-/blob/v0.1.0/docs/rules.md"
    doc = _sarif(draguard, "--rules-url", base)
    uris = {r["id"]: r["helpUri"] for r in doc["runs"][0]["tool"]["driver"]["rules"]}
    assert uris["structure/interconnect"] == f"{base}#structureinterconnect"
    assert all(u.startswith(base + "#") for u in uris.values())


def test_excepted_findings_are_sarif_suppressions_with_the_reason(
    draguard: Callable[..., Run], tree: Path
) -> None:
    reason = "the pilot runs on A100s until the H100 pool arrives (PLAT-1234)"
    (tree / "policies" / "exceptions.yaml").write_text(
        "apiVersion: policy.draguard.io/v1alpha1\n"
        "kind: PolicyException\n"
        "metadata: {name: llm-pilot}\n"
        "spec:\n"
        "  expires: 2099-12-31\n"
        f"  reason: {json.dumps(reason)}\n"
        '  rules: ["tier/*"]\n'
        "  namespaces: [ml-workloads]\n"
    )
    run = draguard(*ARGS, "-f", "sarif")
    assert run.code == 1, run.err  # other enforce-mode findings remain
    doc = json.loads(run.out)
    jsonschema.validate(doc, SARIF_SUBSET)
    results = doc["runs"][0]["results"]
    tier = [r for r in results if r["ruleId"] == "tier/gpu-tiers"]
    assert len(tier) == 1
    assert tier[0]["suppressions"] == [
        {"kind": "external", "justification": reason, "properties": {"policyException": "llm-pilot"}}
    ]
    assert tier[0]["level"] == "note"
    # Nothing else was excepted, so nothing else is suppressed.
    assert [r for r in results if "suppressions" in r] == tier


def test_sarif_rules_url_holds_for_base_reviews_too(
    draguard: Callable[..., Run], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.review import test_base_diff as base

    repo = tmp_path / "gitops"
    (repo / "policies").mkdir(parents=True)
    (repo / "apps").mkdir()
    (repo / "apps" / "finetune.yaml").write_text(base.JOB)
    shutil.copy(FIXTURES / "inventory.yaml", repo / "inventory.yaml")
    base.git(repo, "init", "-q", "-b", "main")
    base.commit_tier(repo, "gpu.nvidia.com-a100, gpu.nvidia.com-h100", "training may use A100 and H100")
    base.commit_tier(repo, "gpu.nvidia.com-h100", "training: H100 only")
    monkeypatch.chdir(repo)
    url = "https://git.example.com/draguard/docs/rules.md"
    run = draguard(*base.ARGS, "--base", "HEAD~1", "-f", "sarif", "--rules-url", url)
    doc = json.loads(run.out)
    descriptors = {r["id"]: r for r in doc["runs"][0]["tool"]["driver"]["rules"]}
    assert [r["ruleId"] for r in doc["runs"][0]["results"]] == ["tier/gpu-tiers"]
    assert descriptors["tier/gpu-tiers"]["helpUri"] == f"{url}#tierpolicy"


def test_unexcepted_findings_have_no_suppressions(draguard: Callable[..., Run], tree: Path) -> None:
    results = _sarif(draguard)["runs"][0]["results"]
    assert results and not any("suppressions" in r for r in results)


# --------------------------------------------------------------------------- GitLab Code Quality


def _gitlab(draguard: Callable[..., Run]) -> list[dict[str, Any]]:
    run = draguard(*ARGS, "-f", "gitlab")
    assert run.code == 1, run.err
    issues: list[dict[str, Any]] = json.loads(run.out)
    return issues


def test_gitlab_code_quality_shape_and_severities(draguard: Callable[..., Run], tree: Path) -> None:
    issues = _gitlab(draguard)
    findings = json.loads(draguard(*ARGS, "-f", "json").out)["findings"]
    assert len(issues) == len(findings)
    for i in issues:
        assert isinstance(i["description"], str) and i["description"]
        assert isinstance(i["check_name"], str)
        assert isinstance(i["fingerprint"], str) and len(i["fingerprint"]) == 64
        assert i["severity"] in {"info", "minor", "major", "critical", "blocker"}
        assert isinstance(i["location"]["path"], str) and not i["location"]["path"].startswith("/")
        assert isinstance(i["location"]["lines"]["begin"], int) and i["location"]["lines"]["begin"] >= 1
    assert len({i["fingerprint"] for i in issues}) == len(issues)
    by_mode = {(f["rule"], f["mode"]) for f in findings}
    sev = {(i["check_name"], i["severity"]) for i in issues}
    # An enforce-mode error blocks, a warning is minor, an audit record is information.
    assert ("tier/gpu-tiers", "enforce") in by_mode and ("tier/gpu-tiers", "blocker") in sev
    assert ("structure/unsatisfiable", "minor") in sev
    assert ("migrate/legacy-gpu", "info") in sev
    paths = {i["location"]["path"] for i in issues}
    assert "manifests/team-ml/training-claim.yaml" in paths


def test_gitlab_fingerprints_survive_a_line_move_and_change_with_the_finding(
    draguard: Callable[..., Run], tree: Path
) -> None:
    before = {i["fingerprint"]: i for i in _gitlab(draguard)}
    claim = tree / "manifests/team-ml/training-claim.yaml"
    claim.write_text("# moved down by a comment\n\n" + claim.read_text())
    after = {i["fingerprint"]: i for i in _gitlab(draguard)}
    assert set(before) == set(after)
    moved = [f for f in after if after[f]["location"]["path"].endswith("training-claim.yaml")]
    assert moved and all(
        after[f]["location"]["lines"]["begin"] == before[f]["location"]["lines"]["begin"] + 2 for f in moved
    )
    # Renaming the object is a different finding: a different fingerprint.
    claim.write_text(claim.read_text().replace("name: training-gpu-claim", "name: training-gpu-claim-2", 1))
    renamed = {i["fingerprint"] for i in _gitlab(draguard)}
    assert renamed != set(after) and len(renamed) == len(after)


# --------------------------------------------------------------------------- kubectl plugin


def test_kubectl_runs_draguard_as_a_plugin(tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is part of the test environment"
    bindir = Path(sys.executable).parent
    assert (bindir / "kubectl-draguard").exists(), (
        f"{bindir}/kubectl-draguard is missing: reinstall the package (make venv) to create the entry point"
    )
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(tmp_path / "none")}
    out = subprocess.run(
        [kubectl, "draguard", "--version"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    from webhook import __version__

    assert out.stdout.strip() == f"draguard {__version__}"


# --------------------------------------------------------------------------- completion


def _complete(script: str, *words: str) -> list[str]:
    """What the bash completion offers for `words` (the last one is being typed)."""
    bash = shutil.which("bash")
    assert bash
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = (
        f"source /dev/stdin <<'__DRAGUARD_EOF__'\n{script}__DRAGUARD_EOF__\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; COMP_LINE=\"${{COMP_WORDS[*]}}\"\n"
        "_draguard; printf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    out = subprocess.run([bash, "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return [w for w in out.stdout.split("\n") if w]


@pytest.fixture
def bash_script(draguard: Callable[..., Run]) -> str:
    run = draguard("completion", "bash")
    assert run.code == 0, run.err
    return run.out


def test_bash_completion_completes_commands(bash_script: str) -> None:
    assert _complete(bash_script, "draguard", "rev") == ["review"]
    assert "completion" in _complete(bash_script, "draguard", "")
    assert _complete(bash_script, "draguard", "dev", "u") == ["up"]


def test_bash_completion_completes_options_and_their_choices(bash_script: str) -> None:
    assert _complete(bash_script, "draguard", "review", "--fail") == ["--fail-on"]
    assert _complete(bash_script, "draguard", "review", "deploy/", "--fail-on", "w") == ["warning"]
    assert _complete(bash_script, "draguard", "rules", "--format", "") == ["text", "json", "markdown"]
    # Options belong to their command: review's are not offered after `rules`.
    assert _complete(bash_script, "draguard", "rules", "--fail") == []


def test_zsh_completion_wraps_the_same_generator(draguard: Callable[..., Run], bash_script: str) -> None:
    run = draguard("completion", "zsh")
    assert run.code == 0, run.err
    assert run.out.startswith("#compdef draguard kubectl-draguard\n")
    assert "bashcompinit" in run.out
    # The zsh script carries the bash function: what completes in bash completes there.
    assert bash_script.split("\n", 1)[1] in run.out


def test_completion_rejects_other_shells(draguard: Callable[..., Run]) -> None:
    run = draguard("completion", "fish")
    assert run.code == 2
    assert "bash" in run.err and "zsh" in run.err


def test_gitlab_report_is_json_whatever_the_names(
    draguard: Callable[..., Run], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lone surrogate in an object name and a file name that is a workflow command: the report is
    # still one valid JSON array naming both as they are.
    claim = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "lone\ud800name", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]}},
    }
    (tmp_path / "::error::forged.json").write_text(json.dumps(claim), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    run = draguard("review", ".", "--root", ".", "-f", "gitlab")
    assert run.code in (0, 1), run.err
    issues = json.loads(run.out)
    assert issues and {i["location"]["path"] for i in issues} == {"::error::forged.json"}
    assert all("lone\ud800name" in i["description"] for i in issues)
