"""Lint one DRA selector expression: what the API server rejects, and what would never match.

Checks (rule ids): `cel/syntax`, `cel/type`, `cel/limits` (the API server refuses these);
`cel/unknown-attribute` (a name the driver does not publish, an attribute/capacity mix-up, or a
comparison against the wrong value type); `cel/no-match` and evaluation errors against a given
inventory; `cel/driver-guard` (no `device.driver == ...` conjunct). Selectors the API server
accepts but that can select no device whatever the inventory (`webhook/cel/never.py`) are
warnings: `cel/no-match`, or `cel/unknown-attribute` when a value is read that the driver's
schema says is never there or has another type.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence

from .._driver import schema
from ..core.findings import Severity
from ..dra.device import Device, Version
from ..dra.drivers import DriverSchema
from ..dra.drivers import draguard as _bundled
from ..dra.semver import coerce_semver
from . import never, versions
from .analysis import COMPARISON_SYMBOLS, Access, Comparison
from .env import CompiledSelector, compile_or_issue
from .issues import CHECKS, CelIssue
from .match import MatchError, match_compiled

__all__ = ["CHECKS", "CelIssue", "lint_selector"]

# Names people reach for that the driver spells differently.
_ALIASES: dict[str, str] = {
    "migprofile": "profile",
    "mig": "profile",
    "migdevice": "profile",
    "gpuuuid": "uuid",
    "product": "productName",
    "model": "productName",
    "name": "productName",
    "arch": "architecture",
    "computecapability": "cudaComputeCapability",
    "cudaversion": "cudaDriverVersion",
    "driverversion": "driverVersion",
    "nvlink": "nvlinkDomain",
    "nvlinkdomainid": "nvlinkDomain",
    "parentuuid": "parentUUID",
    "pcibusid": "pciBusID",
    "mem": "memory",
    "memorysize": "memory",
    "gpumemory": "memory",
    "sms": "multiprocessors",
}


TypeName = str


def _kind_word(kind: str) -> str:
    return "attribute" if kind == "attributes" else "capacity"


def _access_text(kind: str, domain: str, name: str) -> str:
    return f"device.{kind}['{domain}'].{name}"


class _Linter:
    def __init__(
        self, compiled: CompiledSelector, devices: Sequence[Device] | None, driver: str | None,
        known: DriverSchema | None = None,
    ) -> None:
        self.c = compiled
        self.text = compiled.expression
        self.devices = devices
        # The schema of the driver serving the cluster (webhook/dra/drivers): its names are known.
        self.schema = known or _bundled.SCHEMA
        self.driver = driver or self.schema.driver_name
        # Domains whose names and types the schema describes (the bundled driver's name is configurable).
        self.schema_domains = {d: d for d in self.schema.domains} | {self.driver: self.schema.driver_name}
        # What the inventory publishes, found only for the keys the expression reads (inventories are big).
        self.published: dict[tuple[str, str, str], TypeName] = {}
        for access in compiled.analysis.accesses:
            key = (access.kind, access.domain, access.name)
            if key not in self.published:
                typ = _published_type(devices or (), *key)
                if typ is not None:
                    self.published[key] = typ
        self.issues: list[CelIssue] = []
        self.reported_names: set[str] = set()
        self.never: CelIssue | None = None

    # -- helpers -----------------------------------------------------------------------------------

    def location(self, access: Access) -> tuple[int | None, int | None]:
        line, column = self.c.ast.location(access.node_id)
        if line is not None and column is not None and not access.indexed:
            column += 1  # point at the name after the dot
        return line, column

    def add(self, check: str, severity: Severity, message: str, fix: str, access: Access | None = None,
            node_id: int | None = None) -> None:
        line: int | None = None
        column: int | None = None
        if access is not None:
            line, column = self.location(access)
        elif node_id is not None:
            line, column = self.c.ast.location(node_id)
        self.issues.append(CelIssue(check, severity, message, fix, line, column))

    def type_of(self, kind: str, domain: str, name: str) -> TypeName | None:
        published = self.published.get((kind, domain, name))
        if published is not None:
            return published
        sdomain = self.schema_domains.get(domain)
        if sdomain is None:
            return None
        spec = self.schema.lookup(sdomain, name, "attribute" if kind == "attributes" else "capacity")
        return spec.type if spec is not None else None

    def rewrite_name(self, access: Access, new_name: str) -> str | None:
        """The expression with this one access renamed, or None when the source is not where expected."""
        offset = self.c.ast.positions.get(access.node_id)
        if offset is None:
            return None
        text = self.text
        if access.indexed:
            for quote in ("'", '"'):
                needle = f"{quote}{access.name}{quote}"
                at = text.find(needle, offset)
                if at != -1:
                    return text[:at + 1] + new_name + text[at + 1 + len(access.name):]
            return None
        at = offset + 1
        while at < len(text) and text[at].isspace():
            at += 1
        if text.startswith(access.name, at):
            return text[:at] + new_name + text[at + len(access.name):]
        return None

    # -- checks ------------------------------------------------------------------------------------

    def check_names(self) -> None:
        seen: set[tuple[str, str, str]] = set()
        for access in self.c.analysis.accesses:
            key = (access.kind, access.domain, access.name)
            if key in seen or key in self.published:
                continue
            seen.add(key)
            sdomain = self.schema_domains.get(access.domain)
            if sdomain is None:
                self.check_foreign_domain(access)
                continue
            wanted: schema.Kind = "attribute" if access.kind == "attributes" else "capacity"
            if self.schema.lookup(sdomain, access.name, wanted) is not None:
                continue
            self.report_unknown(access, sdomain, wanted)

    def check_foreign_domain(self, access: Access) -> None:
        if self.devices is None or not self.devices or access.presence:
            return
        if _publishes_domain(self.devices, access.kind, access.domain):
            self.report_unpublished(access)
            return
        self.reported_names.add(access.name)
        self.add(
            "cel/unknown-attribute", Severity.WARNING,
            f"no device publishes {_kind_word(access.kind)}s in domain '{access.domain}': "
            f"device.{access.kind}['{access.domain}'] is an empty map there, so `.{access.name}` fails "
            "to evaluate on every device",
            "check the domain (attribute names without a domain belong to the driver's own domain)",
            access,
        )

    def report_unpublished(self, access: Access) -> None:
        names = sorted({
            n for device in self.devices or ()
            for n in (device.attributes if access.kind == "attributes" else device.capacity).get(
                access.domain, {}
            )
        })
        close = difflib.get_close_matches(access.name, names, n=1, cutoff=0.6)
        self.reported_names.add(access.name)
        fix = f"did you mean `{close[0]}`?" if close else f"published names: {', '.join(names[:12])}"
        self.add(
            "cel/unknown-attribute", Severity.WARNING if access.presence else Severity.ERROR,
            f"no device publishes {_kind_word(access.kind)} '{access.name}' in domain '{access.domain}'",
            fix, access,
        )

    def report_unknown(self, access: Access, sdomain: str, wanted: schema.Kind) -> None:
        name = access.name
        word = _kind_word(access.kind)
        self.reported_names.add(name)
        severity = Severity.WARNING if access.presence else Severity.ERROR
        lookup_suffix = " (always false)" if access.presence else " (evaluation fails with 'no such key')"
        other: schema.Kind = "capacity" if wanted == "attribute" else "attribute"
        other_spec = self.schema.lookup(sdomain, name, other)
        if other_spec is not None:
            other_kind = "capacity" if other == "capacity" else "attributes"
            if other == "capacity":
                fix = (f"use {_access_text('capacity', access.domain, name)}, a Quantity: e.g. "
                       f"{_access_text('capacity', access.domain, name)}.compareTo(quantity('40Gi')) >= 0")
            else:
                fix = f"use {_access_text(other_kind, access.domain, name)}"
            self.add("cel/unknown-attribute", severity,
                     f"'{name}' is a {other} of {sdomain}, not an {wanted}{lookup_suffix}", fix, access)
            return
        for other_domain in self.schema.domains:
            if other_domain != sdomain and self.schema.lookup(other_domain, name, wanted) is not None:
                real = self.driver if other_domain == self.schema.driver_name else other_domain
                self.add("cel/unknown-attribute", severity,
                         f"'{name}' is published in domain '{real}', not '{access.domain}'{lookup_suffix}",
                         f"use {_access_text(access.kind, real, name)}", access)
                return
        suggestion = self.suggest(name, sdomain, wanted)
        if suggestion is None:
            names = sorted(self.known_names(sdomain, wanted))
            self.add("cel/unknown-attribute", severity,
                     f"{access.domain} does not publish {word} '{name}'{lookup_suffix}",
                     f"published {word} names: {', '.join(names)}", access)
            return
        rewritten = self.rewrite_name(access, suggestion)
        fix = f"did you mean `{suggestion}`? use {_access_text(access.kind, access.domain, suggestion)}"
        if rewritten is not None:
            fix += f": {rewritten}"
        self.add("cel/unknown-attribute", severity,
                 f"{access.domain} does not publish {word} '{name}'{lookup_suffix}; "
                 f"did you mean '{suggestion}'?",
                 fix, access)

    def known_names(self, sdomain: str, wanted: schema.Kind) -> list[str]:
        """Names to offer: the schema's, narrowed to what the inventory's devices publish in that
        domain when it publishes any (a name no device has would make the selector match nothing)."""
        names = [s.name for s in self.schema.attributes if s.domain == sdomain and s.kind == wanted]
        if self.devices:
            domain = self.driver if sdomain == self.schema.driver_name else sdomain
            kind = "attributes" if wanted == "attribute" else "capacity"
            published = {n for d in self.devices for n in (d.attributes if kind == "attributes"
                                                            else d.capacity).get(domain, {})}
            if published:
                return sorted(published)
        return names

    def suggest(self, name: str, sdomain: str, wanted: schema.Kind) -> str | None:
        names = [n for n in self.known_names(sdomain, wanted) if "<N>" not in n]
        folded = name.lower().replace("_", "").replace("-", "")
        alias = _ALIASES.get(folded)
        if alias in names:
            return alias
        for candidate in names:
            if candidate.lower() == folded:
                return candidate
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        return close[0] if close else None

    def check_comparisons(self) -> None:
        for comparison in self.c.analysis.comparisons:
            self.check_comparison(comparison)
        for conversion in self.c.analysis.conversions:
            access = conversion.access
            typ = self.type_of(access.kind, access.domain, access.name)
            wanted = "version" if conversion.function == "semver" else "quantity"
            if typ == wanted:
                what = "Semver" if wanted == "version" else "Quantity"
                self.add(
                    "cel/unknown-attribute", Severity.ERROR,
                    f"'{access.name}' is already a {what}; {conversion.function}() takes a string "
                    "(evaluation fails with 'no such overload')",
                    f"drop {conversion.function}(...) and use "
                    f"{_access_text(access.kind, access.domain, access.name)} directly", access,
                )

    def check_comparison(self, comparison: Comparison) -> None:
        access = comparison.access
        typ = self.type_of(access.kind, access.domain, access.name)
        if typ is None:
            return
        constant = comparison.constant
        op = COMPARISON_SYMBOLS[comparison.op]
        target = _access_text(access.kind, access.domain, access.name)
        if typ == "version" and isinstance(constant, str):
            try:
                literal = coerce_semver(constant)
            except ValueError:
                literal = constant
            if op in ("==", "!="):
                fix = f"{target} {op} semver('{literal}')"
                effect = "never equal" if op == "==" else "always unequal"
            else:
                fix = f"{target}.compareTo(semver('{literal}')) {op} 0"
                effect = "an evaluation error ('no such overload')"
            self.add("cel/unknown-attribute", Severity.ERROR,
                     f"'{access.name}' is a version (Semver), compared with the string '{constant}': "
                     f"{effect}",
                     f"compare Semver values: {fix}", access)
        elif typ in ("string", "int", "bool"):
            actual = _value_type(constant) if isinstance(constant, str | int | bool) else None
            if actual is not None and actual != typ and not (typ == "int" and isinstance(constant, float)):
                hint = f"'{constant}'" if typ == "string" else ("true/false" if typ == "bool" else "a number")
                self.add("cel/unknown-attribute", Severity.ERROR,
                         f"'{access.name}' is a {typ} attribute, compared with the {actual} {constant!r}: "
                         f"{'never equal' if op != '!=' else 'always unequal'}"
                         + ("" if op in ("==", "!=") else " (or an evaluation error)"),
                         f"compare with {hint}, e.g. {target} {op} "
                         + (repr(str(constant)) if typ == "string" else str(constant)), access)

    # -- selectors that can never select a device ----------------------------------------------------

    def schema_view(self) -> never.SchemaView:
        schema_ = self.schema
        reported = {(i.line, i.column) for i in self.issues if i.check == "cel/unknown-attribute"}

        def spec(kind: str, domain: str, name: str) -> tuple[str, frozenset[str]] | None:
            sdomain = self.schema_domains.get(domain)
            if sdomain is None:
                return None
            found = schema_.lookup(sdomain, name, "attribute" if kind == "attributes" else "capacity")
            return None if found is None else (found.type, found.device_types)

        def driver_domains(driver: str, kind: str) -> frozenset[str] | None:
            own = schema_.driver_name if driver == self.driver else driver
            if own not in schema_.drivers:
                return None
            types = schema_.device_types.get(own, frozenset())
            wanted = "attribute" if kind == "attributes" else "capacity"
            return frozenset(
                self.driver if s.domain == schema_.driver_name else s.domain
                for s in schema_.attributes if s.kind == wanted and s.device_types & types
            )

        def type_values(domain: str) -> frozenset[str] | None:
            sdomain = self.schema_domains.get(domain)
            found = None if sdomain is None else schema_.lookup(sdomain, "type", "attribute")
            # The `type` attribute's values are the device types of the devices that publish it.
            return None if found is None or found.type != "string" else found.device_types

        return never.SchemaView(
            spec=spec,
            schema_domain=lambda domain: domain in self.schema_domains,
            driver_domains=driver_domains,
            type_values=type_values,
            reported=lambda access: self.location(access) in reported,
            evaluate=never.runtime_error,
        )

    def check_never(self) -> None:
        """Say why a selector the API server accepts can select no device (a warning: it is valid)."""
        reason = never.find(self.c.ast, self.c.analysis.accesses, self.schema_view())
        if reason is None or reason.known:
            return
        line: int | None = None
        column: int | None = None
        if reason.access is not None:
            line, column = self.location(reason.access)
        elif reason.node_id is not None:
            line, column = self.c.ast.location(reason.node_id)
        if any(i.check == reason.check and (i.line, i.column) == (line, column) for i in self.issues):
            return
        basis = "" if reason.basis == "always" else " (as the driver publishes its devices)"
        self.never = CelIssue(
            reason.check, Severity.WARNING,
            f"the API server accepts this selector, but it never selects a device{basis}: {reason.message}",
            reason.fix, line, column,
        )

    def report_never(self, inventory_no_match: bool) -> None:
        """With an inventory, its verdict wins: a selector that selects some device is not reported
        (the devices are not what the schema describes), one that selects none gets the reason."""
        found = self.never
        if found is None:
            return
        if self.devices:
            if not inventory_no_match:
                return
            if found.check == "cel/no-match":
                at = next(i for i, issue in enumerate(self.issues) if issue.check == "cel/no-match")
                old = self.issues[at]
                why = found.message.split(": ", 1)[1]
                self.issues[at] = CelIssue(old.check, old.severity,
                                           f"{old.message}; whatever the inventory: {why}",
                                           found.fix, found.line, found.column)
                return
        self.issues.append(found)

    def check_driver_guard(self) -> None:
        guards = self.c.analysis.driver_guards
        if guards:
            return
        domains = [a.domain for a in self.c.analysis.accesses if a.domain != schema.K8S_DOMAIN]
        driver = domains[0] if domains else self.driver
        self.add(
            "cel/driver-guard", Severity.WARNING,
            "selector does not check device.driver: devices of other drivers are evaluated too, "
            "and attribute lookups fail or match on them",
            f"start the expression with `device.driver == '{driver}' && `",
        )

    def check_inventory(self) -> None:
        devices = self.devices
        if not devices:
            return
        result = match_compiled([self.c], devices)
        # One issue per distinct failure, summed over the profiles that hit it.
        failures: dict[str, list[MatchError]] = {}
        for error in result.errors:
            failures.setdefault(error.message, []).append(error)
        static_types = any(
            i.check == "cel/unknown-attribute" and ("compared with" in i.message or "already a" in i.message)
            for i in self.issues
        )
        for message, errors in failures.items():
            first = errors[0]
            if first.limit:
                # draguard's runtime's own limit, not the API server's: the expression passed the
                # static cost estimate the API server applies, so it is valid there and must never be
                # denied for this. Like other selectors the runtime cannot run: cel/unsupported.
                self.add(
                    "cel/unsupported", Severity.WARNING,
                    f"{message}; draguard cannot check this selector against the inventory (its CEL "
                    "runtime's iteration budget ran out; the verdict for these devices is unknown); it "
                    "is within the API server's cost limit, which checks it",
                    "nothing to change if the scheduler's evaluation time is acceptable; nested "
                    "comprehensions (all/exists/map/filter) over literal or large lists are what costs",
                )
                continue
            if first.missing_key is not None and first.missing_key in self.reported_names:
                continue
            if first.type_error and static_types:
                continue
            count = sum(e.devices for e in errors)
            where = f"{first.device.node or first.device.pool}/{first.device.name}"
            access: Access | None = None
            if first.missing_key is not None:
                access = next((a for a in self.c.analysis.accesses if a.name == first.missing_key), None)
                path = (_access_text(access.kind, access.domain, access.name) if access is not None
                        else f"...{first.missing_key}")
                fix = (f"guard the lookup with has({path}) && ..., or test the device type first "
                       "(e.g. device.attributes['gpu.nvidia.com'].type == 'mig' && ...)")
                check = "cel/unknown-attribute"
            else:
                fix = "make the expression well-typed for every device the class can see"
                check = "cel/type"
            self.add(
                check, Severity.ERROR,
                f"evaluation fails on {count} of {len(devices)} devices (e.g. {where}): {message}; "
                "the scheduler fails allocation when a selector errors",
                fix, access,
            )
        if not result.matched and not result.undecided:
            self.add(
                "cel/no-match", Severity.ERROR,
                f"selects none of the {len(devices)} devices in the inventory; "
                f"published: {_products(devices)}",
                "compare against the products listed (`draguard driver inventory` prints the attributes)",
            )


def _published_type(devices: Sequence[Device], kind: str, domain: str, name: str) -> TypeName | None:
    """The type of the first published value of device.<kind>[domain][name], None when none has it."""
    for device in devices:
        values = (device.attributes if kind == "attributes" else device.capacity).get(domain)
        if values is not None and name in values:
            return "quantity" if kind == "capacity" else _value_type(values[name])
    return None


def _publishes_domain(devices: Sequence[Device] | None, kind: str, domain: str) -> bool:
    return any(domain in (d.attributes if kind == "attributes" else d.capacity) for d in devices or ())


def _value_type(value: object) -> TypeName:
    if isinstance(value, Version):
        return "version"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    return "string"


def _products(devices: Sequence[Device], limit: int = 8) -> str:
    counts: Counter[str] = Counter()
    for device in devices:
        attrs = device.attributes.get(device.driver, {})
        product = str(attrs.get("productName", "?"))
        dtype = str(attrs.get("type", "device"))
        profile = attrs.get("profile")
        label = f"{device.driver}: {product} ({dtype}{' ' + str(profile) if profile else ''})"
        counts[label] += 1
    parts = [f"{label} x{n}" for label, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]]
    if len(counts) > limit:
        parts.append(f"... {len(counts) - limit} more")
    return "; ".join(parts)


def lint_selector(
    expression: str,
    *,
    devices: Sequence[Device] | None = None,
    driver: str | None = None,
    kubernetes_version: str | None = None,
    known: DriverSchema | None = None,
) -> list[CelIssue]:
    """All issues with one selector expression; never raises for bad input.

    `devices`: the inventory to match against (enables `cel/no-match` and evaluation checks).
    `driver`: the bundled driver's configured name, whose attributes follow `driver/schema.py`.
    `known`: the schema of the driver serving the cluster (`webhook.dra.drivers`); default the bundled one.
    `kubernetes_version`: the target release (`1.34`...); functions and fields its API server
    does not accept yet are `cel/version` errors. None: the newest release draguard follows.
    """
    if not isinstance(expression, str):
        return [CelIssue("cel/syntax", Severity.ERROR,
                         f"expression must be a string, not {type(expression).__name__}",
                         "quote the expression in YAML")]
    if not expression.strip():
        return [CelIssue("cel/syntax", Severity.ERROR, "expression is empty",
                         "write a boolean expression, e.g. device.driver == 'gpu.nvidia.com'")]
    compiled = compile_or_issue(expression)
    if isinstance(compiled, CelIssue):
        return [compiled]
    linter = _Linter(compiled, devices, driver, known)
    if kubernetes_version is not None:
        linter.issues.extend(versions.version_issues(compiled.ast, kubernetes_version))
    linter.check_names()
    linter.check_comparisons()
    linter.check_never()
    linter.check_driver_guard()
    linter.check_inventory()
    linter.report_never(any(i.check == "cel/no-match" for i in linter.issues))
    return linter.issues
