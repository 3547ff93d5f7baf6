"""`cel/*` findings from selectors in classes, claims, templates and subrequests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from webhook.core.findings import Finding, Mode, Severity
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.model import CelCheckSetting, CelLintPolicy, NamespaceScope, PolicySet
from webhook.review.inputs import parse_yaml_documents

GUARD = "device.driver == 'gpu.nvidia.com' && "


def _run(
    objs: list[SourceObject], pols: PolicySet | None = None, inventory: Inventory | None = None, **ctx: Any
) -> list[Finding]:
    r = evaluate(
        objs,
        pols or PolicySet.empty(),
        inventory or Inventory.empty(),
        Context(**ctx),
        rule_modules=("cel_lint",),
    )
    assert not [f for f in r.findings if f.rule.startswith("internal/")], r.findings
    return r.findings


def _class(expr: str, name: str = "c") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expr}}]},
    }


def _template(requests: list[dict[str, Any]], ns: str = "ml") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": ns},
        "spec": {"spec": {"devices": {"requests": requests}}},
    }


def test_seed_mig_class_gets_unknown_attribute_with_suggestion(
    sources: Callable[[Path], list[SourceObject]], seed_dir: Path
) -> None:
    findings = _run(sources(seed_dir / "deviceclasses.yaml"))
    unknown = [f for f in findings if f.rule == "cel/unknown-attribute"]
    assert len(unknown) == 1
    f = unknown[0]
    assert f.object.name == "gpu.nvidia.com-a100-mig-3g20gb"
    assert "migProfile" in f.message and "did you mean `profile`" in f.fix
    assert f.message.startswith("spec.selectors[0].cel.expression: ")
    assert f.mode is Mode.WARN  # no CelLintPolicy: every check in warn mode
    assert f.file is not None and f.file.endswith("deviceclasses.yaml") and f.line == 47
    # The two product classes are clean.
    assert {x.object.name for x in findings} == {"gpu.nvidia.com-a100-mig-3g20gb"}


def test_no_match_against_inventory(
    inventory: Inventory, seed_dir: Path, sources: Callable[[Path], list[SourceObject]]
) -> None:
    findings = _run(sources(seed_dir / "deviceclasses.yaml"), inventory=inventory)
    no_match = [f for f in findings if f.rule == "cel/no-match"]
    # The H100 class matches node-h; the A100 class matches node-a; the MIG class matches nothing.
    assert [f.object.name for f in no_match] == ["gpu.nvidia.com-a100-mig-3g20gb"]


def test_policy_decides_checks_mode_and_severity() -> None:
    obj = SourceObject(_class("device.attributes['gpu.nvidia.com'].migProfile == '3g.20gb'"))
    pol = CelLintPolicy(
        name="lint",
        mode=Mode.AUDIT,
        checks={
            "cel/unknown-attribute": CelCheckSetting(mode=Mode.ENFORCE),
            "cel/driver-guard": CelCheckSetting(enabled=False),
        },
    )
    findings = _run([obj], PolicySet(cel_lint=(pol,)))
    assert [f.rule for f in findings] == ["cel/unknown-attribute"]
    assert findings[0].mode is Mode.ENFORCE and findings[0].severity is Severity.ERROR
    pol2 = CelLintPolicy(
        name="lint",
        mode=Mode.WARN,
        checks={"cel/driver-guard": CelCheckSetting(severity="info", mode=Mode.AUDIT)},
    )
    guard = [f for f in _run([obj], PolicySet(cel_lint=(pol2,))) if f.rule == "cel/driver-guard"]
    assert guard and guard[0].severity is Severity.INFO and guard[0].mode is Mode.AUDIT


def test_request_and_subrequest_selectors_are_linted() -> None:
    t = _template(
        [
            {
                "name": "a",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "selectors": [
                        {
                            "cel": {
                                "expression": GUARD + "device.attributes['gpu.nvidia.com'].productName == 1"
                            }
                        }
                    ],
                },
            },
            {
                "name": "b",
                "firstAvailable": [
                    {
                        "name": "x",
                        "deviceClassName": "gpu.nvidia.com",
                        "selectors": [
                            {
                                "cel": {
                                    "expression": GUARD + "device.attributes['gpu.nvidia.com'].productName =="
                                }
                            }
                        ],
                    },
                    {
                        "name": "y",
                        "deviceClassName": "gpu.nvidia.com",
                        "selectors": [
                            {
                                "cel": {
                                    "expression": GUARD + "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                                }
                            }
                        ],
                    },
                ],
            },
        ]
    )
    findings = _run([SourceObject(t)])
    by_rule = {f.rule: f for f in findings}
    assert set(by_rule) == {"cel/unknown-attribute", "cel/syntax"}
    assert by_rule["cel/unknown-attribute"].message.startswith(
        "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression:"
    )
    assert by_rule["cel/syntax"].message.startswith(
        "spec.spec.devices.requests[1].firstAvailable[0].selectors[0].cel.expression:"
    )


def test_v1beta1_claim_selectors() -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "g",
                        "deviceClassName": "x",
                        "selectors": [
                            {
                                "cel": {
                                    "expression": GUARD
                                    + "device.attributes['gpu.nvidia.com'].migProfile == 'a'"
                                }
                            }
                        ],
                    }
                ]
            }
        },
    }
    findings = _run([SourceObject(claim)])
    assert [f.rule for f in findings] == ["cel/unknown-attribute"]
    assert "spec.devices.requests[0].selectors[0]" in findings[0].message


def test_literal_block_line_offset() -> None:
    text = (
        "apiVersion: resource.k8s.io/v1\n"  # 1
        "kind: DeviceClass\n"  # 2
        "metadata:\n"  # 3
        "  name: c\n"  # 4
        "spec:\n"  # 5
        "  selectors:\n"  # 6
        "  - cel:\n"  # 7
        "      expression: |\n"  # 8
        "        device.driver == 'gpu.nvidia.com' &&\n"  # 9
        "        device.attributes['gpu.nvidia.com'].migProfile == 'x'\n"  # 10
    )
    doc = parse_yaml_documents(text, "c.yaml")[0]
    findings = _run([SourceObject(doc.data, file="c.yaml", line=doc.line, lines=doc.lines)])
    assert [(f.rule, f.line) for f in findings] == [("cel/unknown-attribute", 10)]


def test_scoped_policy_applies_only_in_its_namespaces() -> None:
    t = SourceObject(
        _template(
            [
                {
                    "name": "a",
                    "exactly": {
                        "deviceClassName": "c",
                        "selectors": [
                            {
                                "cel": {
                                    "expression": GUARD
                                    + "device.attributes['gpu.nvidia.com'].migProfile == 'x'"
                                }
                            }
                        ],
                    },
                }
            ],
            ns="prod",
        )
    )
    strict = CelLintPolicy(name="strict", mode=Mode.ENFORCE, scope=NamespaceScope(namespaces=("prod",)))
    assert _run([t], PolicySet(cel_lint=(strict,)))[0].mode is Mode.ENFORCE
    other = CelLintPolicy(name="strict", mode=Mode.ENFORCE, scope=NamespaceScope(namespaces=("dev",)))
    assert _run([t], PolicySet(cel_lint=(other,)))[0].mode is Mode.WARN


def test_clean_and_non_dra_objects() -> None:
    ok = SourceObject(_class(GUARD + "device.attributes['gpu.nvidia.com'].type == 'gpu'"))
    assert _run([ok]) == []
    assert _run([SourceObject({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})]) == []
    # Malformed selector shapes are skipped by the reader, never raised on.
    bad = _class("x")
    bad["spec"]["selectors"] = [{"cel": {"expression": 42}}, "nope", {"cel": None}]
    assert _run([SourceObject(bad)]) == []


def test_admission_never_reports_what_the_api_server_already_validated() -> None:
    # Enforced compile/type/cost checks deny in review (a pull request), but at admission the API
    # server has validated the selector before the webhook runs: no finding, no denial.
    enforce = PolicySet(cel_lint=(CelLintPolicy(name="strict", mode=Mode.ENFORCE),))
    selectors = {
        "cel/syntax": "device.driver ==",
        "cel/type": "device.attributes['gpu.nvidia.com'].productName.foo(1)",
        "cel/limits": "device.attributes['gpu.nvidia.com'].productName != '" + "x" * 10300 + "'",
    }
    for check, expr in selectors.items():
        objs = [SourceObject(_class(GUARD + expr))]
        review = [f for f in _run(objs, enforce) if f.rule == check]
        assert review and review[0].mode is Mode.ENFORCE, (check, review)
        admitted = _run(objs, enforce, admission=True)
        assert not [f for f in admitted if f.rule in selectors], (check, admitted)
        assert not [f for f in admitted if f.mode is Mode.ENFORCE and f.rule.startswith("cel/")], admitted


def _claim_req(cls: str, expr: str) -> dict[str, Any]:
    return {"name": "g", "exactly": {"deviceClassName": cls, "selectors": [{"cel": {"expression": expr}}]}}


def test_driver_guard_belongs_to_the_class() -> None:
    # The scheduler runs a request's selectors only on devices its class selected: a class that pins
    # device.driver guards every claim naming it, so the claim's own selector is not warned about.
    guarded = _class("device.driver == 'gpu.nvidia.com'", "nvidia")
    open_class = _class("device.attributes['gpu.nvidia.com'].productName != ''", "loose")
    sel = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100'"
    second = {**_template([_claim_req("loose", sel)]), "metadata": {"name": "t2", "namespace": "ml"}}
    objs = [SourceObject(o) for o in (guarded, open_class, _template([_claim_req("nvidia", sel)]), second)]
    guards = [(f.object.kind, f.object.name) for f in _run(objs) if f.rule == "cel/driver-guard"]
    # The unguarded class itself, and the claim whose class does not guard the driver; not the other.
    assert sorted(guards) == [("DeviceClass", "loose"), ("ResourceClaimTemplate", "t2")]


def test_unknown_class_is_not_linted_selector_by_selector() -> None:
    known = _class("device.driver == 'gpu.nvidia.com'", "nvidia")
    sel = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100'"
    tmpl = _template([_claim_req("no-such-class", sel), {**_claim_req("no-such-class", sel), "name": "h"}])
    rules = [f.rule for f in _run([SourceObject(known), SourceObject(tmpl)])]
    assert "cel/driver-guard" not in rules and "cel/no-match" not in rules
