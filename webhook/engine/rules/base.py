"""What every rule sees (RuleContext) and what a rule is (Rule)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...core.findings import Finding, JsonPatch, Mode, ObjectRef, Severity
from ...core.frozen import one_call_init
from ...core.source import SourceObject
from ...dra.inventory import Inventory
from ...dra.objects import as_map, as_str
from ...policy.model import PolicySet
from ..context import Context
from ..resolve import Index, PodClaim, namespace_of, pod_claims


class Rule(Protocol):
    """A check over one object. `id_prefix` is the rule id or its family (`tier/`, `cel/`)."""

    @property
    def id_prefix(self) -> str: ...

    def check(self, item: SourceObject, rc: RuleContext) -> Iterable[Finding]: ...


# What an object is, for dispatch: a rule that names some of these runs only on objects that are one
# of them (evaluate() works them out once per object). Each is a superset of where the rules that
# name it can report: skipping a rule elsewhere changes no result, it saves the call.
DRA_GROUP = "dra-group"  # apiVersion in resource.k8s.io, any version (retired ones included)
DRA = "dra"  # a served resource.k8s.io version (v1, v1beta2, v1beta1)
CLAIM_KIND = "claim-kind"  # kind ResourceClaim or ResourceClaimTemplate, any apiVersion
DRA_CLAIM = "dra-claim"  # both of the above: what claim_spec_of reads
WORKLOAD = "workload"  # has a pod template (built-in workload kinds, workload CRDs of the table)
SCOPES: tuple[str, ...] = (DRA_GROUP, DRA, CLAIM_KIND, DRA_CLAIM, WORKLOAD)


@dataclass(frozen=True, slots=True)
class FunctionRule:
    """A Rule made from a plain function. `scope`: the SCOPES it can report on (None: every object)."""

    id_prefix: str
    fn: Callable[[SourceObject, RuleContext], Iterable[Finding]]
    scope: frozenset[str] | None = None

    def check(self, item: SourceObject, rc: RuleContext) -> Iterable[Finding]:
        return self.fn(item, rc)


@one_call_init
@dataclass(frozen=True, slots=True)
class RuleContext:
    """Everything a rule may consult besides the object: pure data, built once per evaluation."""

    policies: PolicySet
    inventory: Inventory
    ctx: Context
    index: Index
    objects: Sequence[SourceObject] = ()
    _claims_cache: dict[int, list[PodClaim]] = field(default_factory=dict, compare=False, repr=False)
    # id(item) -> (item, namespace): rules ask an object's namespace several times per evaluation.
    _ns_cache: dict[int, tuple[SourceObject, str | None]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @staticmethod
    def build(
        objects: Sequence[SourceObject], policies: PolicySet, inventory: Inventory, ctx: Context
    ) -> RuleContext:
        known = [*objects, *(SourceObject(o) for o in ctx.related)] if ctx.related else objects
        return RuleContext(
            policies, inventory, ctx, Index.build(known, inventory, ctx.default_namespace), objects
        )

    # -- facts about objects -------------------------------------------------------------------

    def namespace(self, item: SourceObject) -> str | None:
        hit = self._ns_cache.get(id(item))
        if hit is not None and hit[0] is item:
            return hit[1]
        ns = namespace_of(item.obj, self.ctx.default_namespace)
        self._ns_cache[id(item)] = (item, ns)
        return ns

    def namespace_labels(self, namespace: str | None) -> Mapping[str, str] | None:
        """Labels of a namespace, or None when admission/review does not know them."""
        if namespace is None:
            return None
        labels = self.ctx.namespace_labels.get(namespace)
        return labels if labels is not None else None

    def ref(self, item: SourceObject) -> ObjectRef:
        obj = item.obj
        meta = as_map(obj.get("metadata"))
        name = as_str(meta.get("name")) or as_str(meta.get("generateName")) or "<unnamed>"
        return ObjectRef(
            api_version=as_str(obj.get("apiVersion")) or "",
            kind=as_str(obj.get("kind")) or "",
            namespace=self.namespace(item),
            name=name,
        )

    def pod_claims(self, item: SourceObject) -> list[PodClaim]:
        """The workload's resourceClaims resolved (cached per object)."""
        key = id(item)
        hit = self._claims_cache.get(key)
        if hit is None:
            hit = pod_claims(item.obj, self.index, self.namespace(item) or self.ctx.default_namespace)
            self._claims_cache[key] = hit
        return hit

    # -- building findings ---------------------------------------------------------------------

    def finding(
        self,
        item: SourceObject,
        rule: str,
        severity: Severity,
        mode: Mode,
        message: str,
        *,
        fix: str = "",
        pointer: str = "",
        patch: JsonPatch | None = None,
        generated: tuple[dict[str, Any], ...] = (),
    ) -> Finding:
        """A Finding on `item` with file and line filled from `pointer`."""
        return Finding(
            rule=rule,
            severity=severity,
            mode=mode,
            object=self.ref(item),
            message=message,
            fix=fix,
            file=item.file,
            line=item.line_of(pointer) if pointer else item.line,
            patch=patch,
            generated=generated,
        )


def severity_for(mode: Mode) -> Severity:
    """The usual severity of a finding in a mode: deny -> error, warn -> warning, audit -> info."""
    return {Mode.ENFORCE: Severity.ERROR, Mode.WARN: Severity.WARNING, Mode.AUDIT: Severity.INFO}[mode]
