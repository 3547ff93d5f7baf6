"""Run every rule over an input set: objects + policies + inventory -> Report. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..core.findings import Finding, Mode, ObjectRef, Report, Severity
from ..core.source import SourceObject
from ..dra.inventory import Inventory
from ..dra.objects import DRA_KINDS, GROUP, dra_version, reading_once, split_api_version
from ..dra.workloads import (
    WORKLOAD_KINDS,
    is_workload_kind,
    pod_spec_of,
    pod_templates_of,
    using_crd_table,
)
from ..policy.model import API_VERSION, PolicyException, PolicySet
from .context import Context
from .rules import RuleModule, modules
from .rules.base import (
    CLAIM_KIND,
    DRA,
    DRA_CLAIM,
    DRA_GROUP,
    SCOPES,
    WORKLOAD,
    FunctionRule,
    Rule,
    RuleContext,
)

EXCEPTION_EXPIRED = "exception/expired"
TOO_DEEP = "structure/too-deep"
MAX_DEPTH = 100
"""Deepest nesting the rules are run on. Kubernetes objects of the kinds draguard reads nest about
a dozen levels; far deeper data only comes from free-form fields of hostile or broken input, and
some of it would exhaust Python's stack in code that walks it."""
KNOWN_KINDS: frozenset[str] = DRA_KINDS | WORKLOAD_KINDS


def evaluate(
    objects: Sequence[SourceObject],
    policies: PolicySet,
    inventory: Inventory,
    ctx: Context | None = None,
    *,
    rule_modules: tuple[str, ...] | None = None,
) -> Report:
    """Findings of every rule on every object, with PolicyExceptions applied.

    Never raises on bad objects: a rule that fails becomes an `internal/<module>` finding on the
    object it failed on. `rule_modules` restricts the run to some rule modules (tests, benches).
    """
    with using_crd_table(policies.crd_table), reading_once():
        return _evaluate(objects, policies, inventory, ctx, rule_modules)


def _evaluate(
    objects: Sequence[SourceObject],
    policies: PolicySet,
    inventory: Inventory,
    ctx: Context | None,
    rule_modules: tuple[str, ...] | None,
) -> Report:
    ctx = ctx if ctx is not None else Context()
    items = [
        o for o in objects
        if isinstance(o, SourceObject) and (type(o.obj) is dict or isinstance(o.obj, Mapping))
    ]
    report = Report(objects=len(objects))
    report.ignored = len(objects) - len(items)
    rc = RuleContext.build(items, policies, inventory, ctx)
    mods = modules(rule_modules)
    findings: list[Finding] = []
    for mod in mods:
        if mod.error is not None:
            findings.append(_broken_module(mod))
    for item in items:
        kind = item.obj.get("kind")
        known = isinstance(kind, str) and (kind in KNOWN_KINDS or is_workload_kind(kind))
        if not known:
            report.ignored += 1
        deep = too_deep(item.obj, MAX_DEPTH)
        if deep is not None:
            if known:
                findings.append(_too_deep(item, rc, deep))
            continue
        for mod_name, rule, check in _plan(mods, _scopes_of(item.obj)):
            try:
                findings.extend(check(item, rc))
            except Exception as e:  # one bad object or rule must not hide the others' verdicts
                findings.append(_internal(mod_name, rule.id_prefix, item, rc, e))
    report.findings = apply_exceptions(findings, policies.exceptions, ctx)
    return report


_ALL_SCOPES = (1 << len(SCOPES)) - 1
_SCOPE_BIT: dict[str, int] = {name: 1 << i for i, name in enumerate(SCOPES)}
_DRA_GROUP_BIT, _DRA_BIT = _SCOPE_BIT[DRA_GROUP], _SCOPE_BIT[DRA]
_CLAIM_KIND_BIT, _DRA_CLAIM_BIT = _SCOPE_BIT[CLAIM_KIND], _SCOPE_BIT[DRA_CLAIM]
_WORKLOAD_BIT = _SCOPE_BIT[WORKLOAD]
_CLAIM_KINDS = frozenset({"ResourceClaim", "ResourceClaimTemplate"})


def _scopes_of(obj: Mapping[str, Any]) -> int:
    """The SCOPES `obj` is in, as bits. Every rule is run when they cannot be worked out, as before
    dispatch (a reader that fails inside a rule is that rule's `internal/` finding)."""
    try:
        api_version = obj.get("apiVersion")
        group, _version = split_api_version(api_version)
        bits = 0
        if group == GROUP:
            bits = _DRA_GROUP_BIT | (_DRA_BIT if dra_version(api_version) is not None else 0)
        if obj.get("kind") in _CLAIM_KINDS:
            bits |= _CLAIM_KIND_BIT | (_DRA_CLAIM_BIT if bits & _DRA_BIT else 0)
        if pod_templates_of(obj) or pod_spec_of(obj) is not None:
            bits |= _WORKLOAD_BIT
        return bits
    except Exception:
        return _ALL_SCOPES


Planned = tuple[str, Rule, Callable[[SourceObject, RuleContext], Iterable[Finding]]]

# (id of a module tuple, scope bits) -> (that tuple, its plan): the tuple is held so that its id is
# not reused; keyed by id because hashing the tuple would hash every rule in it.
_PLANS: dict[tuple[int, int], tuple[tuple[RuleModule, ...], tuple[Planned, ...]]] = {}


def _plan(mods: tuple[RuleModule, ...], scopes: int) -> tuple[Planned, ...]:
    """(module name, rule, its check) to run, in registry order, on an object in `scopes`: a
    FunctionRule's check is its function, called without the method in between. Memoized per module
    tuple (the registry, or a caller's restriction of it) and scope bits: both come from draguard's
    own code, never from a request, so the memo holds few plans (and is bounded)."""
    key = (id(mods), scopes)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is mods:
        return hit[1]
    out: list[Planned] = []
    for mod in mods:
        for rule in mod.rules:
            scope: frozenset[str] | None = getattr(rule, "scope", None)
            if scope is None or any(scopes & _SCOPE_BIT[n] for n in scope):
                check = rule.fn if type(rule) is FunctionRule else rule.check
                out.append((mod.name, rule, check))
    plan = tuple(out)
    if len(_PLANS) >= 256:
        _PLANS.clear()
    _PLANS[key] = (mods, plan)
    return plan


_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None)})
_TREE: frozenset[type] = frozenset({dict, list})


def too_deep(value: Any, limit: int) -> str | None:
    """JSON pointer of a value nested more than `limit` levels deep in `value`, or None.

    Iterative (no stack to exhaust) and alias-aware: a container reached again is walked again
    only when reached deeper than before, so shared subtrees (YAML aliases) cost little.
    """
    within = _tree_within_depth(value, limit)
    if within is None:  # more containers than a tree of this size has: maybe shared subtrees
        within = _within_depth(value, limit)
    if within:
        return None  # the usual case, decided without building pointers (admission hot path)
    return _deep_pointer(value, limit)


TREE_NODES = 50_000
"""Containers the level-by-level walk visits before handing over to the alias-aware one (an alias
bomb's levels grow exponentially; parsed JSON, the admission case, is a tree)."""


def _tree_within_depth(value: Any, limit: int) -> bool | None:
    """`_within_depth` for plain dicts and lists, one level at a time; None past TREE_NODES
    containers, or on other container types (the alias-aware walk decides those)."""
    level: list[Any] = [value] if type(value) in _TREE else []
    if not level and type(value) not in _SCALARS:
        return None
    depth, seen = 0, 0
    scalars = _SCALARS
    while level:
        if depth > limit:
            return False
        seen += len(level)
        if seen > TREE_NODES:
            return None
        below: list[Any] = []
        push = below.append
        for node in level:
            for child in node.values() if type(node) is dict else node:
                t = type(child)
                if t in scalars:  # most values: one test each
                    continue
                if t is dict or t is list:
                    push(child)
                else:
                    return None
        level = below
        depth += 1
    return True


def _within_depth(value: Any, limit: int) -> bool:
    """True when no container in `value` sits more than `limit` levels deep (same walk as
    `_deep_pointer`, without the pointers; scalars are never pushed)."""
    best: dict[int, int] = {}
    stack: list[tuple[Any, int]] = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        t = type(node)
        children: Iterable[Any]
        if t is dict:
            children = node.values()
        elif t is list:
            children = node
        elif isinstance(node, Mapping):
            children = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        if depth > limit:
            return False
        key = id(node)
        if best.get(key, -1) >= depth:
            continue
        best[key] = depth
        depth += 1
        for child in children:
            if type(child) not in _SCALARS:
                push((child, depth))
    return True


def _deep_pointer(value: Any, limit: int) -> str | None:
    best: dict[int, int] = {}
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        node, depth, pointer = stack.pop()
        if isinstance(node, Mapping):
            children: Iterable[tuple[str, Any]] = ((str(k), v) for k, v in node.items())
        elif isinstance(node, list | tuple):
            children = ((str(i), v) for i, v in enumerate(node))
        else:
            continue
        if depth > limit:
            return pointer
        if best.get(id(node), -1) >= depth:
            continue
        best[id(node)] = depth
        for key, child in children:
            if isinstance(child, Mapping | list | tuple):
                stack.append((child, depth + 1, f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}"))
    return None


def _too_deep(item: SourceObject, rc: RuleContext, pointer: str) -> Finding:
    try:
        ref = rc.ref(item)
    except Exception:
        ref = ObjectRef("", "", None, "<unreadable>")
    shown = "/".join(pointer.split("/")[:6]) + ("/..." if pointer.count("/") > 5 else "")
    return Finding(
        rule=TOO_DEEP,
        severity=Severity.ERROR,
        mode=Mode.ENFORCE,
        object=ref,
        message=f"object nests more than {MAX_DEPTH} levels deep (at {shown}); draguard reviews objects "
        "up to that depth and did not check this one",
        fix="flatten that field: Kubernetes objects nest about a dozen levels "
        "(annotations, for one, are plain string values)",
        file=item.file,
        line=item.line_of(shown.removesuffix("/...")) or item.line,
    )


def _broken_module(mod: RuleModule) -> Finding:
    return Finding(
        rule=f"internal/{mod.name}",
        severity=Severity.ERROR,
        mode=Mode.ENFORCE,
        object=ObjectRef("draguard", "RuleModule", None, mod.name),
        message=f"rule module {mod.name!r} could not be loaded ({mod.error}); its checks did not run",
        fix="this is a draguard bug: report it with the message above",
    )


def _internal(module: str, rule_id: str, item: SourceObject, rc: RuleContext, e: Exception) -> Finding:
    try:
        ref = rc.ref(item)
    except Exception:
        ref = ObjectRef("", "", None, "<unreadable>")
    return Finding(
        rule=f"internal/{module}",
        severity=Severity.ERROR,
        mode=Mode.ENFORCE,
        object=ref,
        message=f"rule {rule_id!r} failed on this object ({type(e).__name__}: {e}); its verdict is unknown",
        fix="check the object for malformed fields; if it is valid Kubernetes, this is a draguard bug",
        file=item.file,
        line=item.line,
    )


def apply_exceptions(
    findings: Sequence[Finding], exceptions: Sequence[PolicyException], ctx: Context
) -> list[Finding]:
    """Findings covered by a live exception become audit records; expired exceptions are reported.

    In review (not admission) every expired exception is reported; in admission only those that
    would have covered a finding of this request, so one stale exception does not flood each reply.
    """
    if not exceptions:  # the usual case: nothing to apply or report
        return list(findings)
    live = [e for e in exceptions if not e.expired(ctx.today)]
    expired = [e for e in exceptions if e.expired(ctx.today)]
    out: list[Finding] = []
    expired_hit: set[str] = set()
    for f in findings:
        if f.rule.startswith("internal/"):
            out.append(f)
            continue
        for e in expired:
            if e.covers(f):
                expired_hit.add(e.name)
        exc = next((e for e in live if e.covers(f)), None)
        if exc is None:
            out.append(f)
            continue
        until = exc.expires.isoformat()
        out.append(
            dataclasses.replace(
                f,
                mode=Mode.AUDIT,
                severity=Severity.INFO,
                message=f"{f.message} [excepted by PolicyException {exc.name} until {until}]",
                patch=None,
                generated=(),
                excepted_by=exc.name,
                exception_reason=exc.reason,
            )
        )
    for e in expired:
        if ctx.admission and e.name not in expired_hit:
            continue
        out.append(
            Finding(
                rule=EXCEPTION_EXPIRED,
                severity=Severity.WARNING,
                mode=Mode.AUDIT,
                object=ObjectRef(API_VERSION, "PolicyException", None, e.name),
                message=(
                    f"PolicyException {e.name} expired on {e.expires.isoformat()} and no longer applies"
                    + (" (it would have covered findings here)" if e.name in expired_hit else "")
                ),
                fix=f"renew it with a new spec.expires date or delete it from {e.source or 'the policies'}",
                file=e.source,
                line=e.line,
            )
        )
    return out
