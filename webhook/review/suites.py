"""`draguard test`: policy test suites, in the format documented in policies/tests/README.md.

A suite is a `suite.yaml` in its own directory:

    name: tier                    # default: the directory name
    policies: [../..]             # files or directories, relative to this file (default ../..)
    inventory: inventory.yaml     # optional (cases may override it)
    context: {servedVersions: [v1], namespaceLabels: {ns: {k: v}}, today: 2026-11-30, admission: false}
    only: ["tier/*"]              # compare only findings of these rules (cases may override)
    cases:
    - name: llm on a100 is denied
      inputs: [llm-on-a100.yaml]  # files or directories (kustomizations are built)
      input: |                    # and/or inline manifests
        ...
      expect:                     # `none`, or findings: rule (required), mode, object, line
      - {rule: tier/gpu-tiers, mode: enforce, object: Deployment/ml/llm, line: 17}

A case passes when the findings (after `only`) are exactly the expected ones: each expectation
matches one finding of its own, and no finding is left over.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..core.findings import Finding, Report
from ..dra import yamlload
from ..engine.context import ALL_RESOURCE_VERSIONS, Context
from .inputs import InputError, Inputs, objects_of, parse_text, read_paths
from .pipeline import ReviewError, load_inventory_file, load_policy_set

SUITE_NAMES = ("suite.yaml", "suite.yml")
EXPECT_KEYS = frozenset({"rule", "mode", "object", "line"})


class SuiteError(Exception):
    """A suite file that cannot be used; one line naming the file and the field."""


@dataclass(slots=True)
class Case:
    suite: str
    name: str
    path: Path
    line: int | None
    inputs: list[str]
    inline: str | None
    expect: list[Mapping[str, Any]]
    only: list[str]
    inventory: str | None


@dataclass(slots=True)
class CaseResult:
    case: Case
    passed: bool
    problems: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(slots=True)
class Outcome:
    results: list[CaseResult] = field(default_factory=list)

    @property
    def failed(self) -> list[CaseResult]:
        return [r for r in self.results if not r.passed]


# --------------------------------------------------------------------------- reading suites


def suite_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise SuiteError(f"{root}: no such directory (fix: pass the directory holding suite.yaml files)")
    files = sorted(p for p in root.rglob("*") if p.name in SUITE_NAMES and p.is_file())
    if not files:
        raise SuiteError(f"{root}: no suite.yaml found below it")
    return files


def _case_lines(text: str) -> list[int]:
    node = next(iter(yamlload.compose_all(text)), None)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if getattr(k, "value", None) == "cases" and isinstance(v, yaml.SequenceNode):
                return [item.start_mark.line + 1 for item in v.value]
    return []


def _globs(raw: Any, where: str) -> list[str] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and all(isinstance(g, str) for g in raw):
        return list(raw)
    raise SuiteError(f'{where}: only must be a list of rule globs, e.g. only: ["tier/*"]')


def _expectations(raw: Any, where: str) -> list[Mapping[str, Any]]:
    if raw is None or raw == "none":
        return []
    if not isinstance(raw, list):
        raise SuiteError(
            f"{where}: expect must be a list of {{rule, mode?, object?, line?}} or the word none"
        )
    for i, e in enumerate(raw):
        if not isinstance(e, Mapping) or not isinstance(e.get("rule"), str):
            raise SuiteError(f"{where}: expect[{i}] needs a rule (e.g. rule: tier/gpu-tiers)")
        unknown = set(e) - EXPECT_KEYS
        if unknown:
            raise SuiteError(
                f"{where}: expect[{i}] has unknown key(s) {sorted(unknown)}; use rule, mode, object, line"
            )
        if "mode" in e and e["mode"] not in ("enforce", "warn", "audit"):
            raise SuiteError(f"{where}: expect[{i}].mode {e['mode']!r} is not enforce, warn or audit")
    return list(raw)


def read_suite(path: Path) -> tuple[dict[str, Any], list[Case]]:
    try:
        text = path.read_text(encoding="utf-8")
        data = yamlload.load(text)
        lines = _case_lines(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"{path}: cannot read: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise SuiteError(f"{where}: invalid YAML: {exc.problem}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("cases"), list):
        raise SuiteError(f"{path}: a suite needs `cases:` (a list of {{name, inputs, expect}})")
    name = str(data.get("name") or path.parent.name)
    suite_only = _globs(data.get("only"), str(path)) or ["*"]
    cases: list[Case] = []
    for i, c in enumerate(data["cases"]):
        line = lines[i] if i < len(lines) else None
        where = f"{path}:{line}" if line else f"{path}: cases[{i}]"
        if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
            raise SuiteError(f"{where}: each case needs a name")
        inputs = c.get("inputs") or []
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
            raise SuiteError(f"{where}: case {c['name']!r}: inputs must be a list of files")
        inline = c.get("input")
        if inline is not None and not isinstance(inline, str):
            raise SuiteError(f"{where}: case {c['name']!r}: input must be a YAML text (use `input: |`)")
        if not inputs and not inline:
            raise SuiteError(f"{where}: case {c['name']!r} needs inputs: [files] or input: |")
        if "expect" not in c:
            raise SuiteError(f"{where}: case {c['name']!r} needs expect: [...] or expect: none")
        inv = c.get("inventory", data.get("inventory"))
        cases.append(
            Case(
                suite=name,
                name=c["name"],
                path=path,
                line=line,
                inputs=[str(path.parent / x) for x in inputs],
                inline=inline,
                expect=_expectations(c.get("expect"), where),
                only=_globs(c.get("only"), where) or suite_only,
                inventory=str(path.parent / inv) if isinstance(inv, str) else None,
            )
        )
    return dict(data), cases


def suite_context(raw: Any, where: str) -> Context:
    if raw is None:
        return Context()
    if not isinstance(raw, Mapping):
        raise SuiteError(f"{where}: context must be a mapping")
    try:
        today = raw.get("today")
        return Context(
            namespace_labels={str(k): dict(v or {}) for k, v in (raw.get("namespaceLabels") or {}).items()},
            served_versions=frozenset(raw.get("servedVersions") or ALL_RESOURCE_VERSIONS),
            today=today
            if isinstance(today, dt.date)
            else dt.date.fromisoformat(str(today))
            if today
            else dt.date.today(),
            admission=bool(raw.get("admission", False)),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise SuiteError(f"{where}: context: {exc}") from None


# --------------------------------------------------------------------------- running


def matches(exp: Mapping[str, Any], f: Finding) -> bool:
    if exp["rule"] != f.rule:
        return False
    if "mode" in exp and exp["mode"] != f.mode.value:
        return False
    if "object" in exp and exp["object"] != str(f.object):
        return False
    return not ("line" in exp and exp["line"] != f.line)


def check(case: Case, findings: Sequence[Finding]) -> list[str]:
    """Problems with one case (empty when it passes): a one-to-one match after `only`."""
    left = [f for f in findings if any(fnmatch.fnmatchcase(f.rule, g) for g in case.only)]
    problems: list[str] = []
    for exp in case.expect:
        hit = next((f for f in left if matches(exp, f)), None)
        if hit is None:
            shown = ", ".join(f"{k}: {v}" for k, v in exp.items())
            problems.append(f"expected {{{shown}}}, not found")
        else:
            left.remove(hit)
    for f in left:
        where = f"{f.file}:{f.line}" if f.line else (f.file or "")
        problems.append(f"unexpected {f.rule} ({f.mode.value}) on {f.object} at {where}: {f.message}")
    return problems


def _policy_paths(data: Mapping[str, Any], suite: Path, override: str | None) -> list[str]:
    if override:
        return [override]
    raw = data.get("policies")
    if raw is None:
        raw = ["../.."]
    if isinstance(raw, str):
        raw = [raw]
    return [str(suite.parent / p) for p in raw]


def run_suites(root: Path, *, policies: str | None = None, case_filter: str | None = None) -> Outcome:
    from ..engine.evaluate import evaluate
    from ..policy.model import PolicySet

    outcome = Outcome()
    inventories: dict[str | None, Any] = {}
    for suite_path in suite_files(root):
        data, cases = read_suite(suite_path)
        policy_set = PolicySet.empty()
        try:
            for p in _policy_paths(data, suite_path, policies):
                policy_set = policy_set.merged(load_policy_set(p, required=True))
        except ReviewError as exc:
            raise SuiteError(f"{suite_path}: {exc}") from None
        ctx = suite_context(data.get("context"), str(suite_path))
        for case in cases:
            if case_filter and case_filter not in case.name:
                continue
            t0 = time.monotonic()
            try:
                if case.inventory not in inventories:
                    inventories[case.inventory] = load_inventory_file(case.inventory)
                inputs = read_paths(case.inputs) if case.inputs else Inputs()
                if case.inline:
                    label = f"{suite_path}[{case.name}]"
                    objs, _ = objects_of(parse_text(case.inline, label), label)
                    inputs.objects.extend(objs)
                report: Report = evaluate(inputs.objects, policy_set, inventories[case.inventory], ctx)
            except (InputError, ReviewError) as exc:
                outcome.results.append(
                    CaseResult(case, False, [f"input error: {exc}"], seconds=time.monotonic() - t0)
                )
                continue
            findings = list(report.findings)
            problems = check(case, findings)
            outcome.results.append(CaseResult(case, not problems, problems, findings, time.monotonic() - t0))
    return outcome


# --------------------------------------------------------------------------- output


def render_text(outcome: Outcome, *, color: bool = False, verbose: bool = False) -> str:
    green, red, reset = ("\033[32m", "\033[31m", "\033[0m") if color else ("", "", "")
    out: list[str] = []
    for r in outcome.results:
        mark = f"{green}PASS{reset}" if r.passed else f"{red}FAIL{reset}"
        where = f"{r.case.path}:{r.case.line}" if r.case.line else str(r.case.path)
        out.append(f"{mark}  {r.case.suite}: {r.case.name}  ({where})")
        for p in r.problems:
            out.append(f"      {p}")
        if verbose:
            for f in r.findings:
                out.append(f"      finding: {f.rule} ({f.mode.value}) on {f.object}")
    n, failed = len(outcome.results), len(outcome.failed)
    out.append(f"{n - failed} passed, {failed} failed ({n} cases)")
    return "\n".join(out) + "\n"


def render_junit(outcome: Outcome) -> str:
    root = ET.Element("testsuites", name="draguard test")
    by_suite: dict[str, list[CaseResult]] = {}
    for r in outcome.results:
        by_suite.setdefault(r.case.suite, []).append(r)
    for suite, results in by_suite.items():
        el = ET.SubElement(
            root,
            "testsuite",
            name=str(suite),
            tests=str(len(results)),
            failures=str(sum(1 for r in results if not r.passed)),
            errors="0",
            time=f"{sum(r.seconds for r in results):.3f}",
        )
        for r in results:
            case = ET.SubElement(
                el, "testcase", name=r.case.name, classname=str(suite), time=f"{r.seconds:.3f}"
            )
            if not r.passed:
                fail = ET.SubElement(case, "failure", message=r.problems[0] if r.problems else "failed")
                fail.text = "\n".join(r.problems)
    root.set("tests", str(len(outcome.results)))
    root.set("failures", str(len(outcome.failed)))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
