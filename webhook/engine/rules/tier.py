"""`tier/<policy>`: a workload of some class (llm, training, ...) asks for a DeviceClass it may not use."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.findings import Finding, Mode, Severity
from ...core.frozen import one_call_init
from ...core.source import SourceObject
from ...dra.inventory import Inventory
from ...dra.objects import as_list, as_map, as_str, claim_spec_of, read_once
from ...dra.workloads import (
    command_line,
    pod_labels_and_annotations,
    pod_spec_of,
    pod_templates_of,
)
from ...policy.model import (
    WORKLOAD_CLASS_LABEL,
    Classification,
    GpuTierPolicy,
    TierClass,
    WorkloadFacts,
)
from ...policy.tier_index import TierIndex
from ..resolve import (
    IMPLICIT_CLASS_PREFIX,
    POD_CLAIM_NAME_ANNOTATION,
    PodClaim,
    extended_requests,
    find_pod,
    owner_pod,
    owner_pod_group,
    pods_in_group,
    pods_naming_claim,
    requested_classes,
)
from .base import CLAIM_KIND, WORKLOAD, FunctionRule, RuleContext, severity_for


def workload_facts(obj: Mapping[str, Any]) -> WorkloadFacts | None:
    """Labels, annotations, images and command tokens of a workload's pods; None for non-workloads."""
    facts: WorkloadFacts | None = read_once("workload_facts", obj, _workload_facts)
    return facts


def _specs(obj: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """Every pod spec of a workload: one for the built-in kinds, each pod template (and container
    form, such as KServe's `predictor.model`) of a workload CRD. None for non-workloads."""
    templates = pod_templates_of(obj)
    return [t.spec for t in templates] if templates else None


def _workload_facts(obj: Mapping[str, Any]) -> WorkloadFacts | None:
    specs = _specs(obj)
    if specs is None:
        return None
    images: list[str] = []
    tokens: list[str] = []
    modules: list[str] = []
    # The workload is one class: a Ray head running plain Ray and workers running vLLM, or a
    # LeaderWorkerSet whose workers alone name the server, are all that server's workload.
    for spec in specs:
        # initContainers then containers, as containers_of() orders them (without building pointers).
        for key in ("initContainers", "containers"):
            for c in as_list(spec.get(key)):
                if type(c) is not dict and not isinstance(c, Mapping):
                    continue
                img = as_str(c.get("image"))
                if img:
                    images.append(img)
                # "bash -c 'torchrun ...'" carries the tool as a word of one argument.
                words = [w for arg in command_line(c) for w in arg.split()]
                tokens.extend(words)
                modules.extend(python_modules(words))
    api = as_str(obj.get("apiVersion")) or ""
    if api.startswith("ray.io/"):
        _ray_app(as_map(obj.get("spec")), tokens, modules)
    elif api.startswith("serving.kserve.io/") and obj.get("kind") == "LLMInferenceService" and (
            _kserve_preset_main(specs)):
        # The model server is KServe's preset (kserve-config-llm-template: container `main`, llm-d's
        # vLLM image), merged by container name: a template without `main`, or whose `main` has no
        # image of its own, runs vLLM whatever image a sidecar beside it names.
        tokens.append("vllm")
    elif api.startswith("serving.kserve.io/") and _kserve_hf_generates(as_map(obj.get("spec"))):
        tokens.append("vllm")
    labels, annotations = pod_labels_and_annotations(obj)
    return WorkloadFacts(labels, annotations, tuple(images), tuple(tokens), tuple(modules))


def _kserve_preset_main(specs: Sequence[Mapping[str, Any]]) -> bool:
    """No pod template of an LLMInferenceService gives its `main` container an image."""
    for spec in specs:
        for c in as_list(spec.get("containers")):
            if isinstance(c, Mapping) and c.get("name") == "main" and as_str(c.get("image")):
                return False
    return True


# What a KubeRay object runs beyond its pods' containers (ray-operator/apis/ray/v1): RayService's
# `serveConfigV2` (Serve's config: `import_path: module:attr`, `runtime_env.pip`), RayJob's
# `entrypoint` (a shell command) and `runtimeEnvYAML`. Read as text with bounded patterns: a
# tenant's string is never parsed as YAML here.
_IMPORT_PATH = re.compile(r"import_path:[ \t]*['\"]?([A-Za-z0-9_.\-]{1,200})")
_KEY = re.compile(r"[ \t]*(?:-[ \t]+)?([A-Za-z0-9_]{1,100}):(.*)")
_REQUIREMENT = re.compile(r"[ \t]*['\"]?([A-Za-z0-9_.\-]{1,100})")
_MAX_APP_TEXT = 64 * 1024


def _ray_app(spec: Mapping[str, Any], tokens: list[str], modules: list[str]) -> None:
    entry = as_str(spec.get("entrypoint"))
    if entry:
        words = entry[:_MAX_APP_TEXT].split()
        tokens.extend(words)
        modules.extend(python_modules(words))
    for key in ("serveConfigV2", "runtimeEnvYAML"):
        text = (as_str(spec.get(key)) or "")[:_MAX_APP_TEXT]
        if text:
            modules.extend(m.group(1).lower() for m in _IMPORT_PATH.finditer(text))
            modules.extend(_pip_packages(text))


def _pip_packages(text: str) -> list[str]:
    """The packages of `pip:` lists (flow `[a, b]` or block `- a` lines), as module names: a
    requirement such as `vllm==0.5.4` is a package the application imports. One pass over the lines."""
    out: list[str] = []
    in_pip = False
    for line in text.splitlines():
        item = line.lstrip(" \t")
        keyed = _KEY.match(line)
        if keyed is not None and not item.startswith(("- '", '- "')):
            in_pip = keyed.group(1) == "pip"
            rest = keyed.group(2).strip()
            if in_pip and rest.startswith("["):
                out.extend(_requirement(r) for r in rest.strip("[]").split(","))
                in_pip = False
            continue
        if in_pip and item.startswith("-"):
            out.append(_requirement(item[1:]))
        elif item and not item.startswith("#"):
            in_pip = False
    return [m for m in out if m]


def _requirement(text: str) -> str:
    m = _REQUIREMENT.match(text)
    return m.group(1).lower().replace("-", "_") if m else ""


# KServe's Hugging Face runtime (python/huggingfaceserver) serves generative tasks with vLLM unless
# told `--backend=huggingface`; these tasks are not text generation.
_HF_NOT_GENERATIVE = ("text_embedding", "fill_mask", "sequence_classification", "token_classification")


def _kserve_hf_generates(spec: Mapping[str, Any]) -> bool:
    """An InferenceService predictor on KServe's Hugging Face runtime, with no image of its own,
    serving a generative model: the runtime runs vLLM."""
    pred = as_map(spec.get("predictor"))
    form = as_map(pred.get("huggingface"))
    model = as_map(pred.get("model"))
    if not form and as_str(as_map(model.get("modelFormat")).get("name")) == "huggingface":
        form = model
    if not form or as_str(form.get("image")):
        return False
    args = " ".join(a for a in as_list(form.get("args")) if isinstance(a, str)).replace("=", " ").split()
    opts = dict(itertools.pairwise(args))
    if opts.get("--backend") == "huggingface" or "--disable_vllm" in args:
        return False
    return opts.get("--task") not in _HF_NOT_GENERATIVE


def _is_python(word: str) -> bool:
    base = word.rsplit("/", 1)[-1]
    return base.startswith(("python", "pypy"))


def python_modules(words: list[str]) -> list[str]:
    """Modules run by `python -m MOD` / `python3 -u -mMOD` anywhere in a container's command words.

    Only after a Python interpreter: `-m` means something else to other tools (`llama-server -m
    model.gguf`).
    """
    out: list[str] = []
    python = False
    it = iter(words)
    for w in it:
        if _is_python(w):
            python = True
            continue
        if not python:
            continue
        if w == "-m":
            mod = next(it, None)
            if mod:
                out.append(mod.strip("'\"").rstrip(";"))
            python = False
        elif w.startswith("-m") and len(w) > 2 and w[2] != "-":
            out.append(w[2:].strip("'\"").rstrip(";"))
            python = False
        elif w in ("-c", "&&", ";", "|") or w.endswith((".py", ";")):
            # A script or code string: no module for this interpreter.
            python = False
    return out


def _claim_label(pc: PodClaim) -> str:
    if pc.kind == "template":
        return f"ResourceClaimTemplate {pc.target}"
    if pc.kind == "claim":
        return f"ResourceClaim {pc.target}"
    return "its inline claim"


@one_call_init
@dataclass(frozen=True, slots=True)
class GpuUse:
    """One way a workload gets devices of a DeviceClass, worded for the finding."""

    device_class: str
    what: str  # "claim 'gpu' (ResourceClaimTemplate a100 (f.yaml:16))"
    fix_where: str  # "in request 'gpu' of ResourceClaimTemplate a100"
    pointer: str
    key: str  # one finding per (key, device class)


def claim_uses(claims: list[PodClaim]) -> list[GpuUse]:
    out: list[GpuUse] = []
    for pc in claims:
        if pc.spec is None:
            continue
        for dc, req_ptr, req in requested_classes(pc.spec):
            where = _claim_label(pc)
            if pc.source is not None and pc.source.file and pc.source.line_of(req_ptr) is not None:
                where += f" ({pc.source.file}:{pc.source.line_of(req_ptr)})"
            fix_where = f"in request {req!r} of {_claim_label(pc)}" if req else f"in {_claim_label(pc)}"
            out.append(GpuUse(dc, f"claim {pc.name!r} ({where})", fix_where, pc.pointer, f"claim:{pc.name}"))
    return out


def extended_uses(obj: Mapping[str, Any], rc: RuleContext) -> list[GpuUse]:
    """Extended resources a DeviceClass serves (KEP-5004), in every pod template of the workload."""
    out: list[GpuUse] = []
    templates = pod_templates_of(obj)
    for t in templates:
        # extended_requests reads one pod spec; each template is read as the pod it makes.
        for r in extended_requests({"kind": "Pod", "spec": t.spec}, rc.index.classes):
            tail = r.pointer.removeprefix("/spec")
            if t.container:
                # The template is one container: its resources sit at the template's own pointer
                # (TrainJob's under `resourcesPerNode`).
                tail = tail.removeprefix("/containers/0")
                if "resourcesPerNode" in as_map(as_list(t.spec.get("containers"))[0]):
                    tail = tail.replace("/resources/", "/resourcesPerNode/", 1)
            what = f"extended resource {r.resource} of container {r.container!r}"
            if not r.resource.startswith(IMPLICIT_CLASS_PREFIX):
                what += f" (served by DeviceClass {r.device_class})"
            key = f"ext:{r.container}:{r.resource}" if len(templates) == 1 else (
                f"ext:{t.pointer}:{r.container}:{r.resource}")
            out.append(GpuUse(r.device_class, what, f"for container {r.container!r}", t.pointer + tail, key))
    return out


def _fix(
    tier: TierClass, use: GpuUse, cls: Classification, declared: Classification | None, policy: str
) -> str:
    allowed = ", ".join(tier.device_classes)
    suggestion = next((c for c in tier.device_classes if "*" not in c and "?" not in c), None)
    if use.key.startswith("ext:"):
        fix = (
            f"request {IMPLICIT_CLASS_PREFIX}{suggestion} instead"
            if suggestion
            else f"request an extended resource of a DeviceClass matching {allowed}"
        )
    else:
        fix = (
            f"request deviceClassName: {suggestion}"
            if suggestion
            else f"request a DeviceClass matching {allowed}"
        )
    fix += f" {use.fix_where}"
    if declared is not None and declared.tier.name != tier.name:
        fix += (
            f"; its {declared.reason} does not widen what its {cls.reason} allows: "
            f"add {declared.tier.name!r} to relabelTo of class {tier.name!r} in GpuTierPolicy {policy}, "
            "or ask for a PolicyException"
        )
    elif declared is not None:
        fix += (
            f"; if the workload is not {tier.name!r}, label its pods "
            f"{WORKLOAD_CLASS_LABEL}=<class> (classified by {cls.reason})"
        )
    elif tier.relabel_to:
        fix += (
            f"; if the workload is not {tier.name!r} (classified by {cls.reason}), label its pods "
            f"{WORKLOAD_CLASS_LABEL}=<{'|'.join(tier.relabel_to)}>"
        )
    else:
        fix += (
            f"; if the workload is not {tier.name!r} (classified by {cls.reason}), ask for a "
            f"PolicyException: a label cannot widen what class {tier.name!r} allows unless its relabelTo "
            "names the class"
        )
    return fix


def check_policy(
    item: SourceObject,
    rc: RuleContext,
    policy: GpuTierPolicy,
    uses: list[GpuUse],
    facts: WorkloadFacts,
    subject: str = "workload",
) -> Iterator[Finding]:
    found = policy.classifications(facts)
    if not found:
        return
    declared = policy.declared(facts)
    rule = f"tier/{policy.name}"
    seen: set[tuple[str, str]] = set()
    for cls in found:
        tier = cls.tier
        allowed = ", ".join(tier.device_classes)
        for use in uses:
            if (use.key, use.device_class) in seen or tier.allows(use.device_class):
                continue
            seen.add((use.key, use.device_class))
            yield rc.finding(
                item,
                rule,
                severity_for(policy.mode),
                policy.mode,
                f"{subject} class {tier.name!r} (by {cls.reason}) may use only DeviceClasses [{allowed}], "
                f"but {use.what} requests {use.device_class}",
                fix=_fix(tier, use, cls, declared, policy.name),
                pointer=use.pointer,
            )


def _policies_for(rc: RuleContext, ns: str) -> list[GpuTierPolicy]:
    labels = rc.namespace_labels(ns)
    return [p for p in rc.policies.tier if p.scope.applies(ns, labels)]


def _classifying(rc: RuleContext, ns: str, facts: WorkloadFacts) -> list[GpuTierPolicy]:
    """The policies in force in `ns` that could classify `facts` (the others find nothing)."""
    found = rc.policies.tier_candidates(facts)
    if not found:
        return found
    labels = rc.namespace_labels(ns)
    return [p for p in found if p.scope.applies(ns, labels)]


def _check_named_claim(item: SourceObject, rc: RuleContext) -> Iterator[Finding]:
    """A user's claim keeps to the class of every pod already waiting for it by name.

    Such a pod was judged against whatever held the name when it was admitted; a claim deleted and
    re-created under that name before the pod is scheduled must not bring other devices.
    """
    if not rc.ctx.admission:
        return  # in review the pods in the input are judged against the claim themselves
    obj = item.obj
    name = as_str(as_map(obj.get("metadata")).get("name"))
    read = claim_spec_of(obj)
    if not name or read is None:
        return
    ns = rc.namespace(item) or rc.ctx.default_namespace
    known = (*(i.obj for i in rc.objects), *rc.ctx.related)
    spec, ptr = read
    for pod in pods_naming_claim(known, ns, name, rc.ctx.default_namespace):
        facts = workload_facts(pod)
        if facts is None:
            continue
        pod_name = as_str(as_map(pod.get("metadata")).get("name")) or "<unnamed>"
        uses = [
            GpuUse(dc, f"this claim, which pod {pod_name} waits for,", f"in request {req!r}", req_ptr or ptr,
                   f"named:{pod_name}:{req}")
            for dc, req_ptr, req in requested_classes(spec)
        ]  # fmt: skip
        for policy in _classifying(rc, ns, facts):
            yield from check_policy(item, rc, policy, uses, facts, subject=f"pod {pod_name}'s workload")
    if rc.ctx.looked_up.get(("PendingPods", ns, name)) == "unreadable":
        for policy in _policies_for(rc, ns):
            yield rc.finding(
                item,
                f"tier/{policy.name}",
                Severity.WARNING,
                Mode.WARN,
                f"could not check every pending pod in namespace {ns} that may wait for claim {name!r}",
                fix="create claims before the pods that name them",
            )


def _check_owned_claim(item: SourceObject, rc: RuleContext) -> Iterator[Finding]:
    """A claim the control plane made for a pod keeps to that pod's class, whatever came first."""
    obj = item.obj
    owner = owner_pod(obj)
    if owner is None:
        group = owner_pod_group(obj)
        if group is not None:
            yield from _check_group_claim(item, rc, group)
        else:
            yield from _check_named_claim(item, rc)
        return
    ns = rc.namespace(item) or rc.ctx.default_namespace
    pod = find_pod((*(i.obj for i in rc.objects), *rc.ctx.related), ns, owner, rc.ctx.default_namespace)
    if pod is None:
        if rc.ctx.looked_up.get(("Pod", ns, owner.name)) == "unreadable":
            for policy in _policies_for(rc, ns):
                yield rc.finding(
                    item,
                    f"tier/{policy.name}",
                    severity_for(policy.mode),
                    policy.mode,
                    f"the pod {owner.name!r} this claim belongs to could not be read, so its workload class "
                    "is unknown",
                    fix="retry: the controller that creates this claim retries on its own",
                    pointer="/metadata/ownerReferences",
                )
        return
    facts = workload_facts(pod)
    read = claim_spec_of(obj)
    if facts is None or read is None:
        return
    spec, ptr = read
    made_for = as_str(as_map(as_map(obj.get("metadata")).get("annotations")).get(POD_CLAIM_NAME_ANNOTATION))
    if made_for:
        label, where, key = f"claim {made_for!r} of pod {owner.name}", "of the claim's template", "owned:"
    else:
        # The scheduler's claim for the pod's extended resources: the fix is in the pod's limits.
        label, where, key = f"the claim made for pod {owner.name}", "", "ext:"
    uses = [
        GpuUse(
            dc,
            label,
            f"in request {req!r} {where}" if where else "in the pod's container resources",
            req_ptr or ptr,
            f"{key}{req}",
        )
        for dc, req_ptr, req in requested_classes(spec)
    ]
    for policy in _classifying(rc, ns, facts):
        yield from check_policy(item, rc, policy, uses, facts, subject=f"pod {owner.name}'s workload")


def _check_group_claim(item: SourceObject, rc: RuleContext, group: str) -> Iterator[Finding]:
    """A claim the control plane made for a PodGroup keeps to the class of every pod of the group.

    The group's pods name the claim's template and were judged against whatever held that name when
    they were admitted; a template replaced before the group's claim is made must not bring other
    devices (the same order trick as a pod's own claim, one level up)."""
    read = claim_spec_of(item.obj)
    if read is None:
        return
    spec, ptr = read
    ns = rc.namespace(item) or rc.ctx.default_namespace
    known = (*(i.obj for i in rc.objects), *rc.ctx.related)
    said: set[tuple[str, str]] = set()  # a gang's pods are alike: say each verdict once
    for pod in pods_in_group(known, ns, group, rc.ctx.default_namespace):
        facts = workload_facts(pod)
        if facts is None:
            continue
        pod_name = as_str(as_map(pod.get("metadata")).get("name")) or "<unnamed>"
        uses = [
            GpuUse(dc, f"the claim made for pod group {group}", f"in request {req!r} of the claim's template",
                   req_ptr or ptr, f"group:{req}")
            for dc, req_ptr, req in requested_classes(spec)
        ]  # fmt: skip
        for policy in _classifying(rc, ns, facts):
            for f in check_policy(item, rc, policy, uses, facts, subject=f"pod {pod_name}'s workload"):
                key = (f.rule, f.message.replace(f"pod {pod_name}'s", "pod's"))
                if key not in said:
                    said.add(key)
                    yield f
    if rc.ctx.looked_up.get(("GroupPods", ns, group)) == "unreadable":
        for policy in _policies_for(rc, ns):
            yield rc.finding(
                item,
                f"tier/{policy.name}",
                severity_for(policy.mode),
                policy.mode,
                f"the pods of pod group {group!r} this claim is made for could not all be read, so their "
                "workload classes are unknown",
                fix="retry: the controller that creates this claim retries on its own",
                pointer="/metadata/ownerReferences",
            )


def _missing_claims(item: SourceObject, rc: RuleContext, claims: list[PodClaim]) -> list[str]:
    """ResourceClaims a Pod names that the API server says do not exist (admission only)."""
    if not rc.ctx.admission or item.obj.get("kind") != "Pod":
        return []
    ns = rc.namespace(item) or rc.ctx.default_namespace
    return [
        pc.target
        for pc in claims
        if pc.kind == "claim" and pc.spec is None and pc.target
        and rc.ctx.looked_up.get(("ResourceClaim", ns, pc.target)) in ("absent", "unreadable")
    ]  # fmt: skip


def check(item: SourceObject, rc: RuleContext) -> Iterator[Finding]:
    if not rc.policies.tier:
        return
    obj = item.obj
    if obj.get("kind") == "ResourceClaim":
        yield from _check_owned_claim(item, rc)
        return
    # What the object is (its claims, its workload facts) is worked out once, not once per policy:
    # with hundreds of tier policies this loop is the request path's linear part.
    all_claims = rc.pod_claims(item)
    claims = [pc for pc in all_claims if pc.spec is not None]
    uses = claim_uses(claims)
    uses += extended_uses(obj, rc)
    missing = _missing_claims(item, rc, all_claims)
    if not uses and not missing:
        return
    facts = workload_facts(obj)
    if facts is None:
        return
    ns = rc.namespace(item) or rc.ctx.default_namespace
    for policy in _classifying(rc, ns, facts):
        yield from check_policy(item, rc, policy, uses, facts)
        if missing and policy.classifications(facts):
            cls = policy.classifications(facts)[0]
            for name in missing:
                yield rc.finding(
                    item,
                    f"tier/{policy.name}",
                    severity_for(policy.mode),
                    policy.mode,
                    f"workload class {cls.tier.name!r} (by {cls.reason}): "
                    f"ResourceClaim {name!r} does not exist yet, so its devices cannot be checked",
                    fix=f"create ResourceClaim {name} first, then the pod",
                    pointer="/spec/resourceClaims",
                )


RULES = (FunctionRule("tier/", check, frozenset({CLAIM_KIND, WORKLOAD})),)


# -- what admission must read when its caches lack it ---------------------------------------------

MAX_LOOKUPS = 8


def _could_deny(policies: list[GpuTierPolicy], device_classes: list[str]) -> bool:
    return any(not c.allows(dc) for p in policies for c in p.classes for dc in device_classes)


def lookups_needed(
    obj: Mapping[str, Any],
    policies: Sequence[GpuTierPolicy],
    inventory: Inventory,
    namespace: str,
    labels: Mapping[str, str] | None,
    index: TierIndex | None = None,
) -> list[tuple[str, str, str]]:
    """(kind, namespace, name) of objects the tier verdict on `obj` depends on that `inventory` lacks.

    A claim made for a pod needs the pod, a user's claim the unscheduled pods that name it (neither
    when every class of every policy allows what it asks for); a classified workload needs the
    templates and claims it names. Admission reads these from
    the API server so every replica judges from the same facts, whatever its watch has seen yet.
    """
    if obj.get("kind") == "ResourceClaim":
        scoped = [p for p in policies if p.scope.applies(namespace, labels)]
        if not scoped:
            return []
        owner = owner_pod(obj)
        read = claim_spec_of(obj)
        name = as_str(as_map(obj.get("metadata")).get("name"))
        if read is None or not _could_deny(scoped, [dc for dc, _p, _r in requested_classes(read[0])]):
            return []
        if owner is not None:
            return [("Pod", namespace, owner.name)]
        group = owner_pod_group(obj)
        if group is not None:
            return [("GroupPods", namespace, group)]
        # A user's claim: the unscheduled pods of the namespace that name it.
        return [("PendingPods", namespace, name)] if name else []
    if pod_spec_of(obj) is None:
        return []
    out: list[tuple[str, str, str]] = []
    # Every pod template: a workload CRD's workers may name claims its head does not.
    specs = [t.spec for t in pod_templates_of(obj) if not t.container]
    entries = [raw for spec in specs for raw in as_list(spec.get("resourceClaims"))]
    for raw in entries:
        entry = as_map(raw)
        tmpl = as_str(entry.get("resourceClaimTemplateName"))
        claim = as_str(entry.get("resourceClaimName"))
        if tmpl and (namespace, tmpl) not in inventory.templates:
            out.append(("ResourceClaimTemplate", namespace, tmpl))
        elif claim and not tmpl and (namespace, claim) not in inventory.claims:
            out.append(("ResourceClaim", namespace, claim))
    if not out:
        # Nothing the caches lack (every admitted workload once the watch has its templates): the
        # workload's facts and classes, most of this function's cost, cannot add a lookup.
        return []
    facts = workload_facts(obj)
    if facts is None:
        return []
    if index is not None:
        policies = index.candidates(facts)
    scoped = [p for p in policies if p.scope.applies(namespace, labels)]
    if not scoped or not any(p.classifications(facts) for p in scoped):
        return []
    return list(dict.fromkeys(out))[:MAX_LOOKUPS]
