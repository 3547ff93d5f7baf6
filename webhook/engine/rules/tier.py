"""`tier/<policy>`: a workload of some class (llm, training, ...) asks for a DeviceClass it may not use."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from webhook.core.findings import Finding
from webhook.core.source import SourceObject
from webhook.dra.objects import as_list, as_str
from webhook.dra.workloads import command_line, pod_annotations, pod_labels, pod_spec_of
from webhook.engine.resolve import PodClaim, requested_classes
from webhook.engine.rules.base import FunctionRule, RuleContext, severity_for
from webhook.policy.model import GpuTierPolicy, WorkloadFacts


def workload_facts(obj: Mapping[str, Any]) -> WorkloadFacts | None:
    """Labels, annotations, images and command tokens of a workload's pods; None for non-workloads."""
    found = pod_spec_of(obj)
    if found is None:
        return None
    _pp, spec = found
    images: list[str] = []
    tokens: list[str] = []
    # initContainers then containers, as containers_of() orders them (without building pointers).
    for key in ("initContainers", "containers"):
        for c in as_list(spec.get(key)):
            if not isinstance(c, Mapping):
                continue
            img = as_str(c.get("image"))
            if img:
                images.append(img)
            for arg in command_line(c):
                # "python -m vllm.entrypoints..." and "bash -c 'torchrun ...'" both carry the tool as a word.
                tokens.extend(arg.split())
    return WorkloadFacts(pod_labels(obj), pod_annotations(obj), tuple(images), tuple(tokens))


def _claim_label(pc: PodClaim) -> str:
    if pc.kind == "template":
        return f"ResourceClaimTemplate {pc.target}"
    if pc.kind == "claim":
        return f"ResourceClaim {pc.target}"
    return "its inline claim"


def check_policy(
    item: SourceObject,
    rc: RuleContext,
    policy: GpuTierPolicy,
    claims: list[PodClaim],
    facts: WorkloadFacts,
) -> Iterator[Finding]:
    cls = policy.classify(facts)
    if cls is None:
        return
    tier = cls.tier
    allowed = ", ".join(tier.device_classes)
    rule = f"tier/{policy.name}"
    for pc in claims:
        if pc.spec is None:
            continue
        seen: set[str] = set()
        for dc, req_ptr, req in requested_classes(pc.spec):
            if dc in seen or tier.allows(dc):
                continue
            seen.add(dc)
            where = _claim_label(pc)
            if pc.source is not None and pc.source.file and pc.source.line_of(req_ptr) is not None:
                where += f" ({pc.source.file}:{pc.source.line_of(req_ptr)})"
            suggestion = next((c for c in tier.device_classes if "*" not in c and "?" not in c), None)
            fix = (
                f"request deviceClassName: {suggestion}"
                if suggestion
                else f"request a DeviceClass matching {allowed}"
            )
            fix += f" in request {req!r} of {_claim_label(pc)}" if req else f" in {_claim_label(pc)}"
            fix += (
                f"; if the workload is not {tier.name!r}, label its pods "
                f"draguard.io/workload-class=<class> (classified by {cls.reason})"
            )
            yield rc.finding(
                item,
                rule,
                severity_for(policy.mode),
                policy.mode,
                f"workload class {tier.name!r} (by {cls.reason}) may use only DeviceClasses [{allowed}], "
                f"but claim {pc.name!r} ({where}) requests {dc}",
                fix=fix,
                pointer=pc.pointer,
            )


def check(item: SourceObject, rc: RuleContext) -> Iterator[Finding]:
    if not rc.policies.tier:
        return
    # What the object is (its claims, its workload facts) is worked out once, not once per policy:
    # with hundreds of tier policies this loop is the request path's linear part.
    claims = [pc for pc in rc.pod_claims(item) if pc.spec is not None]
    if not claims:
        return
    facts = workload_facts(item.obj)
    if facts is None:
        return
    ns = rc.namespace(item) or rc.ctx.default_namespace
    labels = rc.namespace_labels(ns)
    for policy in rc.policies.tier:
        if policy.scope.applies(ns, labels):
            yield from check_policy(item, rc, policy, claims, facts)


RULES = (FunctionRule("tier/", check),)
