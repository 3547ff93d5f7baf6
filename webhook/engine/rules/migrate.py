"""`migrate/legacy-gpu`: workloads still asking for device-plugin GPUs (`nvidia.com/gpu`, MIG).

Per namespace the MigrationPolicy picks a mode (the namespace label `draguard.io/migration-mode`
overrides it): observe records, warn warns, migrate warns and patches the object into DRA claims,
enforce denies with the rewrite in the message. Strategy `extended-resource` (KEP-5004) keeps the
limit and instead requires a DeviceClass that serves the resource name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.findings import Finding, Mode, Severity
from ...core.source import SourceObject
from ...dra.objects import as_list, as_map, esc
from ...dra.workloads import pod_templates_of
from ...policy.model import MigrationMode, MigrationPolicy, MigrationStrategy, PolicySet
from ..migration import (
    LegacyUse,
    MigrationPlan,
    find_legacy,
    hosted_forms,
    plan_pod_spec,
    use_label,
    with_forms,
)
from .base import WORKLOAD, FunctionRule, RuleContext

RULE_ID = "migrate/legacy-gpu"
_VERSION_ORDER = ("v1", "v1beta2", "v1beta1")


def _severity(mode: MigrationMode) -> Severity:
    return {
        MigrationMode.OBSERVE: Severity.INFO,
        MigrationMode.WARN: Severity.WARNING,
        MigrationMode.MIGRATE: Severity.WARNING,
        MigrationMode.ENFORCE: Severity.ERROR,
    }[mode]


def _policy_for(rc: RuleContext, namespace: str, labels: Mapping[str, str] | None) -> MigrationPolicy | None:
    """The first MigrationPolicy whose scope covers the namespace."""
    for p in rc.policies.migration:
        if p.scope.applies(namespace, labels):
            return p
    return None


@dataclass(frozen=True, slots=True)
class _Scope:
    """Where an object is judged: its namespace and labels, the MigrationPolicy and mode there."""

    namespace: str
    labels: Mapping[str, str] | None
    policy: MigrationPolicy
    mode: MigrationMode


def _scope(item: SourceObject, rc: RuleContext) -> _Scope | None:
    """The object's migration scope; None when no MigrationPolicy covers its namespace."""
    namespace = rc.namespace(item) or rc.ctx.default_namespace
    labels = rc.namespace_labels(namespace)
    policy = _policy_for(rc, namespace, labels)
    if policy is None:
        return None
    return _Scope(namespace, labels, policy, policy.mode_for(namespace, labels))


def _served(rc: RuleContext) -> set[str]:
    """Resources a DeviceClass names as its extendedResourceName: DRA requests already (KEP-5004,
    the scheduler makes the claim), neither legacy nor rewritten."""
    return {c.extended_resource_name for c in rc.index.classes.values() if c.extended_resource_name}


def _link_attribute(rc: RuleContext) -> Callable[[int], str]:
    """The attribute joining NVLink-connected GPUs in the driver this evaluation judges by, for a
    claim of `count` GPUs: the one structure/interconnect asks for, so the rewrite satisfies it."""
    from .opaque import driver_schema
    from .structure import _preferred_interconnect

    schema = driver_schema(rc).schema
    return lambda count: _preferred_interconnect(schema, count)


def tier_allowed(
    policies: PolicySet, obj: Mapping[str, Any], namespace: str, labels: Mapping[str, str] | None
) -> Callable[[str], bool] | None:
    """Which DeviceClasses the tier policies let this workload use (None: no restriction), so the
    rewrite picks a class that /validate then allows instead of one the tier rule denies."""
    if not policies.tier:
        return None
    from .tier import workload_facts

    facts = workload_facts(obj)
    if facts is None:
        return None
    tiers = []
    for pol in policies.tier_candidates(facts):
        if pol.scope.applies(namespace, labels):
            cls = pol.classify(facts)
            if cls is not None:
                tiers.append(cls.tier)
    if not tiers:
        return None
    return lambda device_class: all(t.allows(device_class) for t in tiers)


def claim_api_version(policy: MigrationPolicy, served: frozenset[str]) -> str:
    """The policy's claim version if the cluster serves it, else the newest served one."""
    group, _, version = policy.claim_api_version.rpartition("/")
    if version in served:
        return policy.claim_api_version
    for v in _VERSION_ORDER:
        if v in served:
            return f"{group or 'resource.k8s.io'}/{v}"
    return policy.claim_api_version


def _part(use: LegacyUse) -> str:
    return "limits" if use.in_limits else "requests"


def _use_pointer(use: LegacyUse) -> str:
    return f"{use.pointer}/resources/{_part(use)}/{esc(use.resource)}"


def _what(use: LegacyUse) -> str:
    shown = use.bad_count if use.bad_count is not None else use.count
    return f"{use_label(use)} asks for {use.resource}: {shown} (device-plugin resource)"


def _check(item: SourceObject, rc: RuleContext) -> Iterable[Finding]:
    # Every pod template: a workload CRD (PyTorchJob, JobSet, ...) may have several. A one-container
    # form inside a pod spec (KServe's `predictor.model`, `predictor.pytorch`, ...) is judged, and
    # rewritten, with that pod spec: one pod, one list of claims.
    templates = pod_templates_of(item.obj)
    forms = hosted_forms(item.obj, templates)
    hosted = {ptr for found in forms.values() for ptr, _c in found}
    for tmpl in templates:
        if not tmpl.container:
            yield from _check_template(item, rc, tmpl.pointer, tmpl.spec, forms.get(tmpl.pointer, ()))
        elif tmpl.pointer not in hosted:
            yield from _check_container_form(item, rc, tmpl.pointer, tmpl.spec)


def _check_container_form(
    item: SourceObject, rc: RuleContext, pointer: str, podspec: Mapping[str, Any]
) -> Iterable[Finding]:
    """A template that is one container with no pod spec around it (TrainJob's trainer): its pod's
    claims live elsewhere (the training runtime), so draguard reports its device-plugin GPUs and
    leaves the rewrite to the user."""
    served = _served(rc)
    uses = [u for u in find_legacy(podspec, "") if u.resource not in served]
    if not uses:
        return
    scope = _scope(item, rc)
    if scope is None:
        return
    namespace, policy, mmode = scope.namespace, scope.policy, scope.mode
    field = pointer.rsplit("/", 1)[-1]
    where = "resourcesPerNode" if "resourcesPerNode" in as_map(as_list(podspec.get("containers"))[0]) else (
        "resources")
    if item.obj.get("kind") == "TrainJob":
        how = ("request the GPUs through resourceClaims in the pod template of its (Cluster)TrainingRuntime "
               "and drop them from spec.trainer.resourcesPerNode")
    else:
        how = (f"move the GPUs to spec.{'.'.join(pointer.split('/')[2:-1]) or 'predictor'}.resourceClaims "
               f"(a ResourceClaimTemplate) and reference them from {field}.resources.claims")
    for use in uses:
        yield rc.finding(
            item, RULE_ID, _severity(mmode), mmode.finding_mode,
            f"{field} asks for {use.resource}: {use.bad_count or use.count} (device-plugin resource) in "
            f"namespace {namespace} (migration mode {mmode.value}, MigrationPolicy {policy.name}); no "
            f"automatic rewrite: {field} is one container whose pod's claims are declared elsewhere",
            fix=how, pointer=f"{pointer}/{where}/{_part(use)}/{esc(use.resource)}",
        )


def _check_template(
    item: SourceObject, rc: RuleContext, pointer: str, podspec: Mapping[str, Any],
    forms: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> Iterable[Finding]:
    view, at = with_forms(podspec, forms)
    uses = find_legacy(view, pointer, at)
    if not uses:
        return
    scope = _scope(item, rc)
    if scope is None:
        return
    namespace, policy, mmode = scope.namespace, scope.policy, scope.mode
    if policy.strategy is MigrationStrategy.EXTENDED_RESOURCE:
        yield from _extended_resource(item, rc, uses, policy, mmode)
        return
    served = _served(rc)
    uses = [u for u in uses if u.resource not in served]
    if not uses:
        return
    plan = plan_pod_spec(
        item.obj, pointer, podspec, policy, namespace=namespace,
        api_version=claim_api_version(policy, rc.ctx.served_versions), rewrite=False, uses=uses,
        allowed=tier_allowed(rc.policies, item.obj, namespace, scope.labels),
        # Only a migrating namespace gets the patch and the templates; the others get the text.
        build=mmode is MigrationMode.MIGRATE, classes=rc.index.classes, inventory=rc.inventory,
        link_attribute=_link_attribute(rc), forms=forms,
        # The webhook bounds the templates it creates by their requests' exact counts (no node has
        # more devices); a preference list would hide the count from that bound.
        prefer_interconnect=not rc.ctx.admission,
    )
    yield from _claim_template(item, rc, plan, policy, mmode, namespace)


def _claim_template(
    item: SourceObject, rc: RuleContext, plan: MigrationPlan, policy: MigrationPolicy,
    mmode: MigrationMode, namespace: str,
) -> Iterable[Finding]:
    mode, severity = mmode.finding_mode, _severity(mmode)
    where = f"namespace {namespace} (migration mode {mmode.value}, MigrationPolicy {policy.name})"
    for use, why in plan.refused:
        yield rc.finding(
            item, RULE_ID, severity, mode,
            f"{_what(use)} in {where}; no automatic rewrite: {why}",
            fix=f"leave {use.resource} as it is until the above is done, or migrate this workload by hand",
            pointer=_use_pointer(use),
        )
    for use in plan.unmapped:
        if use.bad_count is not None:
            why = f"the count {use.bad_count!r} is not a positive whole number"
            fix = f"set {use.resource} to a whole number of devices, then migrate to a DRA claim"
        else:
            why = f"MigrationPolicy {policy.name} has no mapping for {use.resource} on this pod's nodes"
            fix = (
                f"add a mapping for {use.resource} (spec.mappings[].resource / deviceClass) to "
                f"MigrationPolicy {policy.name}, or request the device through a ResourceClaimTemplate"
            )
        yield rc.finding(
            item, RULE_ID, severity, mode, f"{_what(use)} in {where}; no automatic rewrite: {why}",
            fix=fix, pointer=_use_pointer(use),
        )
    if not plan.edits:
        return
    first = plan.edits[0].use
    uses_text = "; ".join(_what(e.use) for e in plan.edits)
    rewrite_text = plan.describe()
    templates = ", ".join(plan.template_names)
    fix = (
        "run `draguard migrate <file>` to rewrite the manifest and write the ResourceClaimTemplates "
        f"({templates}), or label the namespace draguard.io/migration-mode=migrate to have admission do it"
    )
    whole = sorted({(e.use.resource, e.device_class) for e in plan.edits})
    if len(whole) == 1 and len({r for r, _c in whole}) == 1:
        # KEP-5004: the same devices through DRA with the pod left as it is.
        resource, device_class = whole[0]
        fix += (
            f"; or keep the pod as it is and have DRA serve {resource}: set spec.extendedResourceName: "
            f"{resource} on DeviceClass {device_class} (`draguard migrate --strategy extended-resource`)"
        )
    if mmode is MigrationMode.MIGRATE:
        # Pods cannot change claims or extended resources after creation: only mutate on CREATE
        # or when the object is a controller whose template may change.
        if item.obj.get("kind") == "Pod" and rc.ctx.operation == "UPDATE":
            yield rc.finding(
                item, RULE_ID, severity, mode,
                f"{uses_text} in {where}; a running Pod cannot be rewritten in place: {rewrite_text}",
                fix=fix, pointer=_use_pointer(first),
            )
            return
        yield rc.finding(
            item, RULE_ID, severity, Mode.WARN,
            f"{uses_text} in {where}; draguard rewrites it to DRA: {rewrite_text}; "
            f"ResourceClaimTemplate(s) created: {templates}",
            fix="commit the rewritten manifest (`draguard migrate <file>`) so the source matches the cluster",
            pointer=_use_pointer(first), patch=plan.patch, generated=tuple(plan.templates),
        )
        return
    verb = "denied" if mmode is MigrationMode.ENFORCE else "use DRA instead"
    yield rc.finding(
        item, RULE_ID, severity, mode, f"{uses_text} in {where}; {verb}: rewrite: {rewrite_text}",
        fix=fix, pointer=_use_pointer(first),
    )


def _extended_resource(
    item: SourceObject, rc: RuleContext, uses: list[LegacyUse], policy: MigrationPolicy, mmode: MigrationMode,
) -> Iterable[Finding]:
    """KEP-5004: the legacy limit stays; a DeviceClass must declare `extendedResourceName`."""
    mode, severity = mmode.finding_mode, _severity(mmode)
    serving: dict[str, list[str]] = {}
    for cls in rc.index.classes.values():
        if cls.extended_resource_name:
            serving.setdefault(cls.extended_resource_name, []).append(cls.name)
    reported: set[str] = set()
    for use in uses:
        classes = sorted(serving.get(use.resource, ()))
        if len(classes) > 1 and use.resource not in reported:
            reported.add(use.resource)
            # Not a reason to deny: the scheduler picks one (the newest), but the choice is implicit.
            lesser = Mode.AUDIT if mode is Mode.AUDIT else Mode.WARN
            yield rc.finding(
                item, RULE_ID, Severity.WARNING, lesser,
                f"{_what(use)}: DeviceClasses {', '.join(classes)} all declare extendedResourceName "
                f"{use.resource}; the scheduler uses the most recently created one",
                fix=f"keep extendedResourceName: {use.resource} on exactly one DeviceClass",
                pointer=_use_pointer(use),
            )
        if classes:
            continue
        mapping = policy.mapping_for(use.resource, {})
        example = mapping.device_class if mapping else "<device-class>"
        yield rc.finding(
            item, RULE_ID, severity, mode,
            f"{_what(use)} in namespace {rc.namespace(item)} (migration mode {mmode.value}, strategy "
            f"extended-resource, MigrationPolicy {policy.name}); no DeviceClass in the inventory or input "
            f"declares extendedResourceName: {use.resource}, so DRA cannot serve it",
            fix=(
                f"set spec.extendedResourceName: {use.resource} on DeviceClass {example} (needs the "
                "DRAExtendedResource feature gate, beta from Kubernetes 1.36), or use strategy claim-template"
            ),
            pointer=_use_pointer(use),
        )


RULES = (FunctionRule(RULE_ID, _check, frozenset({WORKLOAD})),)
