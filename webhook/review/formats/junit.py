"""JUnit XML: one test suite per file, one test case per object × rule; enforce findings fail."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict

from webhook.core.findings import Finding, Mode
from webhook.review.formats import ReviewedObject, ReviewResult, rule_help


def _key(file: str | None, kind: str, name: str) -> tuple[str, str, str]:
    return (file or "<input>", kind, name)


def render(result: ReviewResult) -> str:
    findings = result.sorted_findings()
    # Every rule that fired in this run is a test for every object: an object it did not fire
    # on passes it.
    rules = sorted({f.rule for f in findings})
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

    root = ET.Element("testsuites", name=result.title)
    total = failures = 0
    for file in sorted(files):
        suite = ET.SubElement(root, "testsuite", name=file)
        s_tests = s_fail = 0
        for o in files[file]:
            mine = by_object.get(_key(o.file, o.ref.kind, o.ref.name), [])
            for rule in rules or ["draguard"]:
                case = ET.SubElement(suite, "testcase", name=f"{o.ref} {rule}", classname=file)
                s_tests += 1
                hits = [f for f in mine if f.rule == rule]
                enforced = [f for f in hits if f.mode is Mode.ENFORCE]
                if enforced:
                    s_fail += 1
                    first = enforced[0]
                    fail = ET.SubElement(case, "failure", message=first.message, type=rule)
                    fail.text = (
                        "\n".join(
                            f"{f.file}:{f.line}: {f.message}" + (f"\nfix: {f.fix}" if f.fix else "")
                            for f in enforced
                        )
                        + f"\n({rule_help(rule)})"
                    )
                others = [f for f in hits if f.mode is not Mode.ENFORCE]
                if others:
                    out = ET.SubElement(case, "system-out")
                    out.text = "\n".join(
                        f"{f.mode.value}: {f.file}:{f.line}: {f.message}"
                        + (f" (fix: {f.fix})" if f.fix else "")
                        for f in others
                    )
        suite.set("tests", str(s_tests))
        suite.set("failures", str(s_fail))
        suite.set("errors", "0")
        suite.set("skipped", "0")
        total += s_tests
        failures += s_fail
    root.set("tests", str(total))
    root.set("failures", str(failures))
    root.set("errors", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
