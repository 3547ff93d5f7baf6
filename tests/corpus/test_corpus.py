"""The corpus of real public manifests: review, migrate (and --write + re-review) and explain over
every file through the `draguard` command in-process, compared with the verdicts in expected.yaml.

expected.yaml says what the shipped policies should say, reasoned from Kubernetes and each project's
own documentation; known_gaps.yaml lists the files where today's draguard disagrees, with the cause.
Those run as strict xfails, so a fix that makes one agree fails the run until the gap is removed.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook import cli
from webhook.review import celtools, pipeline, rewrite

HERE = Path(__file__).parent
REPO = HERE.parent.parent
POLICIES = REPO / "policies"
INVENTORY = REPO / "examples" / "inventory.yaml"

VERDICTS = ("deny", "warn", "pass")
MIGRATE_OUTCOMES = ("rewrite", "refuse", "leave")
EXPLAIN_OUTCOMES = ("allocatable", "unallocatable")
# A file `draguard migrate --write` produced must not carry findings the rewrite could have avoided.
AVOIDABLE_AFTER_MIGRATE = ("migrate/", "structure/", "tier/")


def _load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((HERE / name).read_text(encoding="utf-8")) or {}
    assert isinstance(data, dict), f"{name}: expected a mapping"
    return data


EXPECTED: dict[str, dict[str, Any]] = _load("expected.yaml").get("files") or {}
SOURCES: dict[str, dict[str, Any]] = _load("sources.yaml").get("files") or {}
GAPS: dict[str, dict[str, Any]] = _load("known_gaps.yaml").get("files") or {}
CAUSES: dict[str, str] = _load("known_gaps.yaml").get("causes") or {}
CORPUS = sorted(str(p.relative_to(HERE)) for p in HERE.rglob("*.yaml") if p.parent != HERE)


@dataclass
class Call:
    code: int
    out: str
    err: str


def _draguard(*args: str) -> Call:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return Call(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def loaded_once() -> Iterator[None]:
    """Load the policy set, the inventory and the argument parser once for the whole corpus: every
    command would otherwise re-validate the policies against their schema (most of a call's time)."""
    policy_cache = functools.cache(pipeline.load_policy_set)
    inventory_cache = functools.cache(pipeline.load_inventory_file)
    parser_cache = functools.cache(cli.build_parser)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "load_policy_set", policy_cache)
        mp.setattr(rewrite, "load_policy_set", policy_cache)
        mp.setattr(pipeline, "load_inventory_file", inventory_cache)
        mp.setattr(celtools, "load_inventory_file", inventory_cache)
        mp.setattr(cli, "build_parser", parser_cache)
        yield


@dataclass
class Observed:
    verdict: str
    rules: list[str]
    migrate: str
    explain: str | None
    after_migrate: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _review(path: Path) -> tuple[str, list[str]]:
    run = _draguard("review", "-f", "json", "--policies", str(POLICIES), "--root", str(REPO), str(path))
    assert run.code in (0, 1), f"review {path}: exit {run.code}: {run.err.strip()}"
    findings = json.loads(run.out)["findings"]
    modes = {f["mode"] for f in findings}
    verdict = "deny" if "enforce" in modes else "warn" if "warn" in modes else "pass"
    assert (run.code == 1) == (verdict == "deny"), f"review {path}: exit {run.code} but verdict {verdict}"
    return verdict, sorted({f["rule"] for f in findings if f["mode"] in ("enforce", "warn")})


def observe(rel: str, tmp: Path) -> Observed:
    path = HERE / rel
    verdict, rules = _review(path)

    run = _draguard("migrate", "--policies", str(POLICIES), str(path))
    assert run.code in (0, 1), f"migrate {rel}: exit {run.code}: {run.err.strip()}"
    notes = [line for line in run.err.splitlines() if line.strip()]
    migrate = "rewrite" if run.code == 1 else "refuse" if notes else "leave"

    after: list[str] = []
    if migrate == "rewrite":
        copy = tmp / path.name
        shutil.copyfile(path, copy)
        written = _draguard("migrate", "--write", "--policies", str(POLICIES), str(copy))
        assert written.code == 0, f"migrate --write {rel}: exit {written.code}: {written.err.strip()}"
        # What was written must be YAML Kubernetes can read, and review must not find what the
        # rewrite itself could have avoided.
        assert all(isinstance(d, Mapping) for d in yaml.safe_load_all(copy.read_text()) if d is not None)
        _, after_rules = _review(copy)
        # Findings the original already had (a beta API version elsewhere in the file) are not the
        # rewrite's doing; a legacy finding left behind always is.
        after = [
            r
            for r in after_rules
            if r.startswith(AVOIDABLE_AFTER_MIGRATE) and (r.startswith("migrate/") or r not in rules)
        ]

    run = _draguard("explain", "-f", "json", "--inventory", str(INVENTORY), str(path))
    assert run.code in (0, 1), f"explain {rel}: exit {run.code}: {run.err.strip()}"
    explanations = json.loads(run.out)
    explain = None
    if explanations:
        sat = [e.get("satisfiable") for e in explanations]
        explain = "unallocatable" if False in sat else "allocatable"
        if explain == "allocatable" and not all(s is True for s in sat):
            explain = "unknown"
    return Observed(verdict, rules, migrate, explain, after, notes)


def _covers(expected_rule: str, rules: list[str]) -> bool:
    return any(r == expected_rule or r.startswith(expected_rule + "/") for r in rules)


def differences(rel: str, seen: Observed) -> list[str]:
    """What draguard says today that expected.yaml does not, in words (empty: they agree)."""
    want = EXPECTED[rel]
    diff: list[str] = []
    found = ", ".join(seen.rules) or "none"
    if seen.verdict != want["verdict"]:
        diff.append(f"verdict {seen.verdict} (expected {want['verdict']}; findings: {found})")
    missing = [r for r in want.get("rules") or [] if not _covers(r, seen.rules)]
    if missing:
        diff.append(f"no {', '.join(missing)} finding (findings: {found})")
    if seen.migrate != want["migrate"]:
        diff.append(f"migrate would {seen.migrate} (expected {want['migrate']})")
    if seen.after_migrate:
        diff.append(f"the migrated file still gets {', '.join(seen.after_migrate)}")
    if "explain" in want and seen.explain != want["explain"]:
        diff.append(f"explain says {seen.explain or 'nothing'} (expected {want['explain']})")
    return diff


@pytest.fixture(scope="module")
def corpus_run() -> Iterator[None]:
    with loaded_once():
        yield


def _cases() -> list[Any]:
    cases = []
    for rel in CORPUS:
        gap = GAPS.get(rel)
        reason = f"{gap['cause']}: {CAUSES.get(gap['cause'], '')}" if gap else ""
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if gap else []
        cases.append(pytest.param(rel, id=rel, marks=marks))
    return cases


@pytest.mark.parametrize("rel", _cases())
def test_corpus_file(rel: str, corpus_run: None, tmp_path: Path) -> None:
    assert rel in EXPECTED, f"{rel}: no entry in tests/corpus/expected.yaml"
    diff = differences(rel, observe(rel, tmp_path))
    assert not diff, f"{rel}: " + "; ".join(diff)


def test_corpus_is_large_and_sourced() -> None:
    projects = {rel.split("/", 1)[0] for rel in CORPUS}
    assert len(CORPUS) >= 150, len(CORPUS)
    assert len(projects) >= 10, sorted(projects)
    assert sorted(SOURCES) == CORPUS, "sources.yaml must list exactly the corpus files"
    for rel, src in SOURCES.items():
        assert set(src) >= {"repo", "path", "commit", "licence"}, rel
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", src["repo"]), rel
        assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]), rel
        assert Path(src["path"]).suffix in (".yaml", ".yml"), rel


def test_expected_and_gaps_are_well_formed() -> None:
    assert sorted(EXPECTED) == CORPUS, "expected.yaml must judge exactly the corpus files"
    for rel, want in EXPECTED.items():
        assert want["verdict"] in VERDICTS, rel
        assert want["migrate"] in MIGRATE_OUTCOMES, rel
        assert want.get("explain", "allocatable") in EXPLAIN_OUTCOMES, rel
        assert isinstance(want.get("rules"), list), rel
        assert isinstance(want.get("why"), str) and want["why"].strip(), rel
    for rel, gap in GAPS.items():
        assert rel in EXPECTED, f"known_gaps.yaml: {rel} is not a corpus file"
        assert gap.get("cause") in CAUSES, f"known_gaps.yaml: {rel}: cause {gap.get('cause')!r} is not listed"
