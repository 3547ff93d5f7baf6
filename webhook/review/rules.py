"""`draguard rules`: every rule id the engine can emit, what it means and how to fix it.

The ids come from the engine's rule registry (`webhook/engine/rules/`), the CEL checks and the
engine's own ids (expired exceptions, too-deep objects, internal failures); the prose lives here.
docs/rules.md is generated from the same data (`draguard rules --format markdown`), and SARIF
help links point at its anchors.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from typing import Any

from ..core.findings import Mode, Severity

RULES_DOC = "docs/rules.md"
REGENERATE = f"draguard rules --format markdown > {RULES_DOC}"


@dataclass(frozen=True, slots=True)
class RuleDoc:
    """One rule id (or a family: `tier/<policy>`) as users read it."""

    id: str
    summary: str
    severity: Severity
    mode: Mode
    # Where the mode comes from when a policy sets it ("" = fixed by the rule).
    mode_from: str
    fix: str
    # Families report under `<prefix>/<name of the policy or module>`.
    family: bool = False

    @property
    def anchor(self) -> str:
        return anchor(self.id)

    @property
    def prefix(self) -> str:
        """What a finding's id starts with to belong here (families), or the id itself."""
        return self.id.split("<", 1)[0] if self.family else self.id

    def matches(self, rule: str) -> bool:
        if self.family:
            return rule.startswith(self.prefix) and len(rule) > len(self.prefix)
        return rule == self.id

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "family": self.family,
            "summary": self.summary,
            "severity": self.severity.value,
            "mode": self.mode.value,
            "modeFrom": self.mode_from or None,
            "fix": self.fix,
            "anchor": self.anchor,
        }


def anchor(heading: str) -> str:
    """The anchor a Markdown renderer gives a `### heading` (GitHub's rule: lower case, drop
    punctuation but `-` and `_`, spaces become `-`): `structure/invalid` -> `structureinvalid`."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


_E, _W = Severity.ERROR, Severity.WARNING
_CEL_SHIPPED = (
    "as the shipped policies/cel-lint.yaml sets it; a CelLintPolicy's `mode` or `checks` entry changes it"
)

# The prose for every id. Families end in `<...>`; `rule_ids()` checks this table against the
# registry, so a rule added to the engine without a line here fails the rules-reference test.
_DOCS: tuple[RuleDoc, ...] = (
    RuleDoc(
        "tier/<policy>", "The workload asks for a GPU class its GpuTierPolicy does not allow (an LLM "
        "server on a class below H100, a class, count or selector outside what the namespace or team may "
        "request).", _E, Mode.ENFORCE, "the GpuTierPolicy's `mode`",
        "Request one of the DeviceClasses the message names (claims, extended resources and pod-level "
        "claims all count), or add a PolicyException with a reason and an expiry date.", family=True,
    ),
    RuleDoc(
        "quota/<policy>", "The claim or workload would take a namespace or team over its GpuQuotaPolicy "
        "budget (devices per DeviceClass, GPU-equivalents or ResourceClaims).", _E, Mode.ENFORCE,
        "the GpuQuotaPolicy's `mode`",
        "Lower the replicas or device count, free claims the team no longer uses, or raise the budget in "
        "the GpuQuotaPolicy.", family=True,
    ),
    RuleDoc(
        "migrate/legacy-gpu", "A workload still requests `nvidia.com/gpu` or `nvidia.com/mig-*` as a "
        "device-plugin extended resource.", _W, Mode.WARN,
        "the MigrationPolicy per namespace or the namespace label `draguard.io/migration-mode` "
        "(observe: audit, warn, migrate: warn and patched, enforce)",
        "Run `draguard migrate <file>` to rewrite the limits into ResourceClaimTemplates, or serve "
        "`nvidia.com/gpu` from a DeviceClass's `extendedResourceName`.",
    ),
    RuleDoc(
        "structure/invalid", "The API server would reject this claim or template: the other version's "
        "request shape, no `deviceClassName`, a negative count or a count with `All`, invalid or "
        "duplicate request names, constraints naming unknown requests.", _E, Mode.ENFORCE, "",
        "Correct the field the message names to the shape of the object's apiVersion.",
    ),
    RuleDoc(
        "structure/schema", "The object does not fit the Kubernetes API schema, so the API server refuses "
        "it. Checked by offline review only, against the OpenAPI schema the pinned kube-apiserver serves "
        "for the `--kubernetes-version` release: a field of the wrong type (`replicas: \"three\"`, `limits` "
        "as a list), an integer out of range, an invalid quantity, a value outside a field's enum, a "
        "missing required field, or an unknown field (refused under strict field validation, kubectl "
        "apply's default, and always by server-side apply). Reported before any rule runs; the rules still "
        "judge what they can read. Kinds without a shipped schema (CRDs) are not checked; admission never "
        "reports it, as the API server decodes the object before any webhook sees it.",
        _E, Mode.ENFORCE, "",
        "Correct the field the message names to the type it states (quote strings, unquote numbers, "
        "indent maps under their key); remove or rename an unknown field.",
    ),
    RuleDoc(
        "structure/inline-source", "The pod uses the inline `resourceClaims[].source` field, removed in "
        "Kubernetes 1.31.", _E, Mode.ENFORCE, "",
        "Move `source.resourceClaimName` / `source.resourceClaimTemplateName` up one level "
        "(`resourceClaimName` / `resourceClaimTemplateName`).",
    ),
    RuleDoc(
        "structure/undeclared-claim", "A container names a claim missing from the pod's "
        "`spec.resourceClaims`, or a request its claim does not have.", _E, Mode.ENFORCE,
        "enforce for a missing claim, warn for an unknown request",
        "Declare the claim under `spec.resourceClaims`, or correct the name in "
        "`containers[].resources.claims`.",
    ),
    RuleDoc(
        "structure/deprecated-version", "The object uses a `resource.k8s.io` version the target cluster "
        "no longer serves (enforce) or deprecates (warn).", _E, Mode.ENFORCE,
        "enforce when the version is not served, warn when it is served but deprecated",
        "Change `apiVersion` to `resource.k8s.io/v1` and adapt the request shape (`exactly:`).",
    ),
    RuleDoc(
        "structure/dropped-field", "A DRA field the target Kubernetes release drops on create, because "
        "its feature gate is off by default there.", _W, Mode.WARN, "",
        "Remove the field, enable its feature gate on the cluster, or review for a later "
        "`--kubernetes-version`.",
    ),
    RuleDoc(
        "structure/unsatisfiable", "No node of the inventory can satisfy the claim (class, count, "
        "selectors, constraints, counters, capacity): it would stay pending.", _W, Mode.WARN, "",
        "Run `draguard explain` on the object to see which request fails on which node, then relax the "
        "count or selector or pick another class.",
    ),
    RuleDoc(
        "structure/interconnect", "A multi-GPU request has no constraint keeping its GPUs on one NVLink "
        "domain, or the constraint names an attribute the driver does not publish.", _W, Mode.WARN,
        "enforce for a constraint the API server or driver cannot honour, warn for a missing one",
        "Add `constraints: [{requests: [...], matchAttribute: <driver domain>/<interconnect attribute>}]`.",
    ),
    RuleDoc(
        "structure/admin-access", "A request sets `adminAccess: true` in a namespace without the label "
        '`resource.kubernetes.io/admin-access: "true"`.', _E, Mode.ENFORCE,
        "enforce where the namespace is known to lack the label, warn where its labels are unknown",
        'Label the namespace `resource.kubernetes.io/admin-access="true"` (cluster admins only), or drop '
        "`adminAccess`.",
    ),
    RuleDoc(
        "structure/too-deep", "The object nests deeper than draguard reviews (100 levels); no rule ran "
        "on it.", _E, Mode.ENFORCE, "",
        "Flatten the field the message names: Kubernetes objects nest about a dozen levels.",
    ),
    RuleDoc(
        "cel/syntax", "A CEL selector does not parse; the API server rejects the object.", _E, Mode.ENFORCE,
        _CEL_SHIPPED,
        "Correct the expression at the line and column the message names.",
    ),
    RuleDoc(
        "cel/type", "A CEL selector does not type-check (a quantity compared with a string, an unknown "
        "function); the API server rejects it.", _E, Mode.ENFORCE,
        _CEL_SHIPPED,
        "Compare like with like: `quantity(\"40Gi\")` for capacities, `semver(\"1.2.3\")` for versions.",
    ),
    RuleDoc(
        "cel/unknown-attribute", "A selector reads an attribute or capacity the driver never publishes, "
        "so it never matches.", _W, Mode.WARN,
        _CEL_SHIPPED,
        "Use the attribute the message suggests (\"did you mean `profile`\"); "
        "`draguard explain` lists what the inventory publishes.",
    ),
    RuleDoc(
        "cel/no-match", "A CEL selector selects no device, so the claim would stay pending. Either none "
        "of the inventory's devices matches, or none ever can (contradictory conditions, a constant that "
        "always fails, a value the driver's schema never publishes).", _W, Mode.WARN, _CEL_SHIPPED,
        "Check the values against the inventory (`draguard driver inventory` lists what the driver "
        "publishes), or review with the cluster's current inventory.",
    ),
    RuleDoc(
        "cel/limits", "A CEL selector exceeds the API server's cost or length limits.", _E, Mode.ENFORCE,
        _CEL_SHIPPED,
        "Shorten the expression or split it into several selectors (they are ANDed).",
    ),
    RuleDoc(
        "cel/driver-guard", "A selector reads a driver's attributes without first checking "
        "`device.driver`.", _W, Mode.WARN, _CEL_SHIPPED,
        "Start the expression with `device.driver == \"<driver>\" && ...`.",
    ),
    RuleDoc(
        "cel/unsupported", "A selector uses CEL the API server accepts but draguard cannot evaluate, so "
        "its other checks could not run.", _W, Mode.WARN,
        "the CelLintPolicy's setting for it; never enforce unless `checks` names it",
        "Nothing is wrong with the object; simplify the expression if you want it checked.",
    ),
    RuleDoc(
        "cel/version", "A selector uses a CEL function or device field the target Kubernetes release "
        "does not accept yet.", _E, Mode.ENFORCE,
        _CEL_SHIPPED,
        "Rewrite without it, or review with the cluster's release (`--kubernetes-version`).",
    ),
    RuleDoc(
        "config/opaque", "The opaque driver configuration does not validate as the driver serving the "
        "cluster validates it (fields, values, device types, request names, size, API version).", _E,
        Mode.ENFORCE, "enforce for an invalid config, warn for a config kind that fits none of the devices",
        "Correct the `parameters` field the message names; the driver's schema is in docs/drivers.md.",
    ),
    RuleDoc(
        "exception/expired", "A PolicyException is past its `spec.expires` date and no longer excepts "
        "anything.", _W, Mode.AUDIT, "",
        "Renew it with a new `spec.expires` date, or delete it.",
    ),
    RuleDoc(
        "internal/<module>", "A rule module (or the engine as a whole: `internal/engine`) failed on this "
        "object, so its verdict is unknown; the object is denied rather than let through unjudged.", _E,
        Mode.ENFORCE, "", "Check the object for malformed fields; if it is valid Kubernetes, report it as "
        "a draguard bug with the message.", family=True,
    ),
)


class CatalogError(Exception):
    """The prose table and the engine's registry disagree (a developer error, caught by tests)."""


def emitted_ids() -> tuple[str, ...]:
    """Every rule id, or family (`tier/<policy>`), the engine can emit, read from the engine."""
    from ..cel.issues import CHECKS
    from ..engine.evaluate import EXCEPTION_EXPIRED, TOO_DEEP
    from ..engine.rules import INTERNAL_RULES, registry
    from .openapi import RULE as SCHEMA_RULE  # emitted by review, before the engine

    ids: list[str] = []
    for module in registry():
        if module.error is not None:
            raise CatalogError(f"rule module {module.name} does not load: {module.error}")
        for rule in module.rules:
            prefix = rule.id_prefix
            if prefix == "cel/":
                ids.extend(CHECKS)
            elif prefix.endswith("/"):
                ids.append(f"{prefix}<policy>")
            else:
                ids.append(prefix)
    ids.extend((SCHEMA_RULE, TOO_DEEP, EXCEPTION_EXPIRED))
    if INTERNAL_RULES:
        ids.append("internal/<module>")
    return tuple(dict.fromkeys(ids))


def catalog() -> tuple[RuleDoc, ...]:
    """The documented rules, in the engine's order; raises CatalogError when an id the engine
    emits has no prose, or prose names an id the engine no longer emits."""
    docs = {d.id: d for d in _DOCS}
    ids = emitted_ids()
    missing = [i for i in ids if i not in docs]
    stale = [i for i in docs if i not in ids]
    if missing or stale:
        raise CatalogError(
            "webhook/review/rules.py is out of step with the engine: "
            + "; ".join(
                part
                for part in (
                    f"no entry for {', '.join(missing)}" if missing else "",
                    f"entries for ids the engine no longer emits: {', '.join(stale)}" if stale else "",
                )
                if part
            )
        )
    return tuple(docs[i] for i in ids)


def documented() -> tuple[RuleDoc, ...]:
    """Every entry of the reference, without consulting the engine: report formats use this, so a
    rule module that fails to import (reported as `internal/<module>`) cannot break a report."""
    return _DOCS


def lookup(rule: str) -> RuleDoc | None:
    """The entry a finding's rule id belongs to (`tier/llm-h100` -> `tier/<policy>`)."""
    for doc in _DOCS:
        if doc.matches(rule):
            return doc
    return None


# --------------------------------------------------------------------------- rendering


def render_text(docs: tuple[RuleDoc, ...]) -> str:
    lines: list[str] = []
    for d in docs:
        lines.append(f"{d.id}  [{d.mode.value}, {d.severity.value}]")
        lines.append(f"  {d.summary}")
        if d.mode_from:
            lines.append(f"  Mode: {d.mode_from}.")
        lines.append(f"  Fix: {d.fix}")
        lines.append("")
    return "\n".join(lines)


def render_json(docs: tuple[RuleDoc, ...]) -> str:
    return json.dumps({"rules": [d.to_json() for d in docs]}, indent=2) + "\n"


def render_markdown(docs: tuple[RuleDoc, ...]) -> str:
    out = [
        "# Rule reference",
        "",
        f"<!-- Generated by `{REGENERATE}`; do not edit by hand. -->",
        "",
        "Every rule id draguard reports, with its default mode and severity and how to fix a finding. "
        "Ids in `<angle brackets>` are families: the finding's id names the policy or module "
        "(`tier/llm-h100`). A PolicyException can except findings by id glob; SARIF output links each "
        "result here.",
        "",
        "| Rule | Default mode | Severity |",
        "|---|---|---|",
        *(f"| [`{d.id}`](#{d.anchor}) | {d.mode.value} | {d.severity.value} |" for d in docs),
        "",
    ]
    for d in docs:
        out += [f"### {d.id}", "", d.summary, ""]
        mode = f"**Default mode:** {d.mode.value}" + (f" ({d.mode_from})" if d.mode_from else "")
        out += [f"{mode}. **Severity:** {d.severity.value}.", "", f"**Fix:** {d.fix}", ""]
    return "\n".join(out)


RENDERERS = {"text": render_text, "json": render_json, "markdown": render_markdown}


def cmd_rules(args: argparse.Namespace) -> int:
    try:
        docs = catalog()
    except CatalogError as exc:
        print(f"draguard rules: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(RENDERERS[args.format](docs))
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    from ..cli import build_parser
    from . import completion

    sys.stdout.write(completion.script(build_parser(), args.shell))
    return 0


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "rules",
        help="list every rule id with its meaning, default mode and fix",
        description="Every rule id draguard can report, with a summary, the default mode and severity, "
        f"and how to fix a finding. docs/rules.md is this command's markdown output ({REGENERATE}).",
    )
    p.add_argument("--format", "-f", choices=tuple(RENDERERS), default="text")
    p.set_defaults(func=cmd_rules)
    c: argparse.ArgumentParser = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script built from draguard's own options.\n\n"
        "    bash: source <(draguard completion bash)\n"
        "    zsh:  source <(draguard completion zsh)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("shell", choices=("bash", "zsh"))
    c.set_defaults(func=cmd_completion)
