"""`draguard test`: policy test suites.

A suite is a `suite.yaml` (any directory below DIR):

    policies: ../..            # optional: policy dir/file, relative to this file
    inventory: inventory.yaml  # optional: default inventory of every case
    namespace: default         # optional: namespace of objects that set none
    cases:
    - name: llm on an A100 is denied
      inputs: [llm-a100.yaml]            # files or directories, relative to this file
      inventory: other-inventory.yaml    # optional, overrides the suite's
      expect:
      - rule: tier/gpu-tiers
        object: Deployment/ml/llm        # optional: Kind/name or Kind/namespace/name
        mode: enforce                    # optional: enforce | warn | audit
    - name: clean pod passes
      inputs: [ok.yaml]
      expect: none

Expectations are exhaustive for enforce and warn findings: a case passes when every expectation
matches a finding and every enforce/warn finding is matched by an expectation. Audit findings are
checked only when an expectation names them. `expect: none` means no enforce or warn finding.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from webhook.engine.findings import Finding, Mode
from webhook.review.inputs import InputError, read_paths
from webhook.review.pipeline import ReviewError, evaluate_inputs, load_inventory_file, load_policy_set

SUITE_NAMES = ("suite.yaml", "suite.yml")


class SuiteError(Exception):
    """A suite file that cannot be used; one line naming the file and the field."""


@dataclass(frozen=True, slots=True)
class Expectation:
    rule: str
    object: str | None = None
    mode: Mode | None = None

    def matches(self, f: Finding) -> bool:
        if f.rule != self.rule:
            return False
        if self.mode is not None and f.mode is not self.mode:
            return False
        if self.object is not None:
            ref = f.object
            candidates = {str(ref), f"{ref.kind}/{ref.name}"}
            if ref.namespace:
                candidates.add(f"{ref.kind}/{ref.namespace}/{ref.name}")
            if self.object not in candidates:
                return False
        return True

    def __str__(self) -> str:
        parts = [self.rule]
        if self.object:
            parts.append(f"on {self.object}")
        if self.mode:
            parts.append(f"({self.mode.value})")
        return " ".join(parts)


@dataclass(slots=True)
class Case:
    name: str
    suite: Path
    inputs: list[str]
    expect: list[Expectation]
    inventory: str | None
    line: int | None = None


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


def _suite_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise SuiteError(f"{root}: no such directory (fix: pass the directory holding suite.yaml files)")
    files = sorted(p for p in root.rglob("*") if p.name in SUITE_NAMES and p.is_file())
    if not files:
        raise SuiteError(f"{root}: no suite.yaml found below it")
    return files


def _expectations(raw: Any, where: str) -> list[Expectation]:
    if raw == "none" or raw is None or raw == []:
        return []
    if not isinstance(raw, list):
        raise SuiteError(f"{where}: expect must be a list of {{rule, object?, mode?}} or the word none")
    out: list[Expectation] = []
    for i, e in enumerate(raw):
        if not isinstance(e, Mapping) or not isinstance(e.get("rule"), str):
            raise SuiteError(f"{where}: expect[{i}] needs a rule (e.g. rule: tier/gpu-tiers)")
        mode = e.get("mode")
        if mode is not None and mode not in Mode._value2member_map_:
            raise SuiteError(f"{where}: expect[{i}].mode {mode!r} is not enforce, warn or audit")
        obj = e.get("object")
        out.append(
            Expectation(e["rule"], str(obj) if obj is not None else None, Mode(mode) if mode else None)
        )
    return out


def read_suite(path: Path) -> tuple[dict[str, Any], list[Case]]:
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"{path}: cannot read: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise SuiteError(f"{where}: invalid YAML: {exc.problem}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("cases"), list):
        raise SuiteError(f"{path}: a suite needs `cases:` (a list of {{name, inputs, expect}})")
    case_lines: list[int | None] = []
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if k.value == "cases" and isinstance(v, yaml.SequenceNode):
                case_lines = [item.start_mark.line + 1 for item in v.value]
    cases: list[Case] = []
    for i, c in enumerate(data["cases"]):
        line = case_lines[i] if i < len(case_lines) else None
        where = f"{path}:{line}" if line else f"{path}: cases[{i}]"
        if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
            raise SuiteError(f"{where}: each case needs a name")
        inputs = c.get("inputs")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(x, str) for x in inputs):
            raise SuiteError(f"{where}: case {c['name']!r} needs inputs: [files]")
        if "expect" not in c:
            raise SuiteError(f"{where}: case {c['name']!r} needs expect: [...] or expect: none")
        inv = c.get("inventory", data.get("inventory"))
        cases.append(
            Case(
                name=c["name"],
                suite=path,
                inputs=[str(path.parent / x) for x in inputs],
                expect=_expectations(c.get("expect"), where),
                inventory=str(path.parent / inv) if isinstance(inv, str) else None,
                line=line,
            )
        )
    return dict(data), cases


# --------------------------------------------------------------------------- running


def check(case: Case, findings: Sequence[Finding]) -> list[str]:
    problems: list[str] = []
    for e in case.expect:
        if not any(e.matches(f) for f in findings):
            problems.append(f"expected {e}, not found")
    for f in findings:
        if f.mode is Mode.AUDIT:
            continue
        if not any(e.matches(f) for e in case.expect):
            where = f"{f.file}:{f.line}" if f.line else (f.file or "")
            problems.append(f"unexpected {f.rule} ({f.mode.value}) on {f.object} at {where}: {f.message}")
    return problems


def _default_policies(root: Path) -> Path:
    # policies/tests/ tests the policies one level up.
    return root.parent if root.name == "tests" else Path("policies")


def run_suites(root: Path, *, policies: str | None = None, case_filter: str | None = None) -> Outcome:
    outcome = Outcome()
    policy_cache: dict[str, Any] = {}
    inventory_cache: dict[str | None, Any] = {}
    for suite_path in _suite_files(root):
        data, cases = read_suite(suite_path)
        if isinstance(data.get("policies"), str):
            pol = str(suite_path.parent / data["policies"])
        elif policies:
            pol = policies
        else:
            pol = str(_default_policies(root if root.is_dir() else root.parent))
        try:
            if pol not in policy_cache:
                policy_cache[pol] = load_policy_set(pol, required=True)
        except ReviewError as exc:
            raise SuiteError(f"{suite_path}: {exc}") from None
        namespace = str(data.get("namespace") or "default")
        for case in cases:
            if case_filter and case_filter not in case.name:
                continue
            t0 = time.monotonic()
            try:
                if case.inventory not in inventory_cache:
                    inventory_cache[case.inventory] = load_inventory_file(case.inventory)
                inputs = read_paths(case.inputs)
                result = evaluate_inputs(
                    inputs, policy_cache[pol], inventory_cache[case.inventory], namespace=namespace
                )
            except (InputError, ReviewError) as exc:
                outcome.results.append(
                    CaseResult(case, False, [f"input error: {exc}"], seconds=time.monotonic() - t0)
                )
                continue
            findings = list(result.report.findings)
            problems = check(case, findings)
            outcome.results.append(CaseResult(case, not problems, problems, findings, time.monotonic() - t0))
    return outcome


# --------------------------------------------------------------------------- output


def render_text(outcome: Outcome, *, color: bool = False, verbose: bool = False) -> str:
    green, red, reset = ("\033[32m", "\033[31m", "\033[0m") if color else ("", "", "")
    out: list[str] = []
    for r in outcome.results:
        mark = f"{green}PASS{reset}" if r.passed else f"{red}FAIL{reset}"
        where = f"{r.case.suite}:{r.case.line}" if r.case.line else str(r.case.suite)
        out.append(f"{mark}  {r.case.name}  ({where})")
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
    by_suite: dict[Path, list[CaseResult]] = {}
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
