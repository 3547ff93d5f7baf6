"""JUnit XML: one test suite per file, one test case per object and rule that fired on it (one
passing case for an object nothing fired on). Enforce findings fail; warnings are `skipped` with
their message, which GitLab and GitHub's JUnit reporters show (GitLab drops `system-out` of passing
cases); audit findings are `system-out` of a passing case."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import defaultdict

from ...core.findings import Finding, Mode
from . import ReviewedObject, ReviewResult, rule_help

# Characters XML 1.0 does not allow at all (not even as references): C0 controls but tab, LF and
# CR, lone surrogates, U+FFFE and U+FFFF. ElementTree writes them as they are, which makes the
# whole report unreadable to every JUnit parser.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """`text` with every character XML 1.0 forbids written out as `\\xNN` / `\\uNNNN`."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", text)  # fmt: skip


def _sanitise(root: ET.Element) -> None:
    for element in root.iter():
        for name, value in element.attrib.items():
            element.set(name, xml_safe(value))
        if element.text:
            element.text = xml_safe(element.text)


def _key(file: str | None, kind: str, name: str) -> tuple[str, str, str]:
    return (file or "<input>", kind, name)


def _line(f: Finding, where: str) -> str:
    return f"{where}:{f.line}: {f.message}" + (f"\nfix: {f.fix}" if f.fix else "")


def render(result: ReviewResult) -> str:
    findings = result.sorted_findings()
    by_object: dict[tuple[str, str, str], list[Finding]] = defaultdict(list)
    for f in findings:
        by_object[_key(f.file, f.object.kind, f.object.name)].append(f)

    objects: list[ReviewedObject] = list(result.objects)
    known = {_key(o.file, o.ref.kind, o.ref.name) for o in objects}
    for f in findings:  # findings on objects the reader did not list (generated, inventory)
        k = _key(f.file, f.object.kind, f.object.name)
        if k not in known:
            known.add(k)
            objects.append(ReviewedObject(f.object, f.file, f.line))

    files: dict[str, list[ReviewedObject]] = defaultdict(list)
    for o in objects:
        files[o.file or "<input>"].append(o)

    n_cases = sum(max(len({f.rule for f in by_object.get(_key(o.file, o.ref.kind, o.ref.name), [])}), 1)
                  for o in objects)  # fmt: skip
    per_case = result.elapsed / n_cases if n_cases else 0.0
    root = ET.Element("testsuites", name=result.title)
    total = failures = skipped = 0
    for file in sorted(files):
        shown = result.repo_path(file) or file
        suite = ET.SubElement(root, "testsuite", name=shown, file=shown)
        s_tests = s_fail = s_skip = 0
        for o in files[file]:
            mine = by_object.get(_key(o.file, o.ref.kind, o.ref.name), [])
            rules: list[str | None] = [*dict.fromkeys(f.rule for f in mine)] or [None]
            for rule in rules:
                hits = [f for f in mine if f.rule == rule]
                line = next((f.line for f in hits if f.line), o.line)
                case = ET.SubElement(
                    suite, "testcase", name=f"{o.ref} {rule}" if rule else str(o.ref), classname=shown,
                    file=shown, time=f"{per_case:.6f}",
                )  # fmt: skip
                if line:
                    case.set("line", str(line))
                s_tests += 1
                enforced = [f for f in hits if f.mode is Mode.ENFORCE]
                warned = [f for f in hits if f.mode is Mode.WARN]
                rest = [f for f in hits if f not in enforced and f not in (warned if not enforced else ())]
                if enforced:
                    s_fail += 1
                    fail = ET.SubElement(case, "failure", message=enforced[0].message, type=str(rule))
                    fail.text = "\n".join(_line(f, shown) for f in enforced) + f"\n({rule_help(str(rule))})"
                elif warned:
                    s_skip += 1
                    skip = ET.SubElement(case, "skipped", message=f"warning: {warned[0].message}")
                    skip.text = "\n".join(_line(f, shown) for f in warned) + f"\n({rule_help(str(rule))})"
                if rest:
                    out = ET.SubElement(case, "system-out")
                    out.text = "\n".join(f"{f.mode.value}: {_line(f, shown)}" for f in rest)
        suite.set("tests", str(s_tests))
        suite.set("failures", str(s_fail))
        suite.set("errors", "0")
        suite.set("skipped", str(s_skip))
        suite.set("time", f"{per_case * s_tests:.6f}")
        total += s_tests
        failures += s_fail
        skipped += s_skip
    root.set("tests", str(total))
    root.set("failures", str(failures))
    root.set("errors", "0")
    root.set("skipped", str(skipped))
    root.set("time", f"{result.elapsed:.6f}")
    _sanitise(root)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
