"""ValidatingAdmissionPolicies generated from the policy documents: enforcement that outlives the webhook.

A validating webhook is the only enforcement it gives: with every replica down, fail-closed blocks GPU
work cluster-wide and fail-open enforces nothing. The checks that need no object but the one admitted
and its namespace are compiled here into a ValidatingAdmissionPolicy, which the API server evaluates in
process, so they hold while the webhook is down.

Expressed (the same verdict as the webhook's `migrate/legacy-gpu` at enforce):
- legacy device-plugin GPUs (`nvidia.com/gpu`, `nvidia.com/mig-*`) in Pods (CREATE) and in the pod
  templates of Deployments, ReplicaSets, StatefulSets, DaemonSets, Jobs, CronJobs and
  ReplicationControllers (CREATE, UPDATE), in namespaces whose migration mode resolves to `enforce`:
  the mode is resolved in CEL exactly as `MigrationPolicy.mode_for` does (the namespace label, then
  labelled modes, then namespace globs, then the default; the first policy whose scope covers the
  namespace), from `namespaceObject`;
- PolicyExceptions covering `migrate/legacy-gpu` (namespace, kind and name globs) exempt as in the webhook;
- resource names a DeviceClass serves through `extendedResourceName` (KEP-5004) are DRA, never legacy.

Not expressed, and why (the webhook alone enforces them):
- tier rules (they need the DeviceClass behind each claim, the image and the workload class of
  the pod that uses a claim: other objects than the one admitted);
- quotas (they count every claim of a team);
- CEL lint and opaque configuration (they need the inventory and the driver's schema);
- an exception's expiry: CEL in admission has no clock, so an exception exempts until the policy
  is regenerated without it (the policy never denies more than the webhook, at worst less);
- `extended-resource` strategy policies (their verdict depends on the DeviceClasses in the cluster).

The generator is pure: policies in, Kubernetes objects out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from .model import (
    MIGRATION_MODE_LABEL,
    MigrationMode,
    MigrationPolicy,
    MigrationStrategy,
    NamespaceScope,
    PolicyException,
    PolicySet,
)

POLICY_NAME = "draguard-legacy-gpu-enforce"
RULE_ID = "migrate/legacy-gpu"
LEGACY_GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
LABELS = {"app.kubernetes.io/name": "draguard", "app.kubernetes.io/component": "admission-policy"}

# Where each kind's pod spec is, as a CEL path from `object`.
_TEMPLATE_KINDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("apps", "v1", ("deployments", "replicasets", "statefulsets", "daemonsets")),
    ("batch", "v1", ("jobs",)),
    ("", "v1", ("replicationcontrollers",)),
)


def cel_string(value: str) -> str:
    """A CEL string literal (JSON's escapes are a subset of CEL's)."""
    return json.dumps(value)


def glob_to_re2(pattern: str) -> str:
    """A shell glob (`*`, `?`, `[..]`, `[!..]`), as fnmatch reads it, as an anchored RE2 pattern."""
    out, i, n = ["^"], 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i
            if j < n and pattern[j] in "!^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: fnmatch reads `[` literally
                out.append(re.escape("["))
                continue
            body = pattern[i:j]
            i = j + 1
            neg = body[:1] in ("!", "^")
            body = body[1:] if neg else body
            body = body.replace("\\", "\\\\").replace("]", "\\]")
            out.append(f"[{'^' if neg else ''}{body}]")
        else:
            out.append(re.escape(c))
    out.append("$")
    return "".join(out)


def _glob_cel(var: str, pattern: str) -> str:
    if not any(ch in pattern for ch in "*?["):
        return f"{var} == {cel_string(pattern)}"
    return f"{var}.matches({cel_string(glob_to_re2(pattern))})"


def _any_glob(var: str, patterns: Iterable[str]) -> str:
    parts = [_glob_cel(var, p) for p in patterns]
    return "(" + " || ".join(parts) + ")" if parts else "false"


def _label_is(key: str, value: str) -> str:
    k = cel_string(key)
    return f"({k} in variables.labels && variables.labels[{k}] == {cel_string(value)})"


def _scope_cel(scope: NamespaceScope) -> str:
    parts = []
    if scope.exclude:
        parts.append(f"!{_any_glob('variables.ns', scope.exclude)}")
    if scope.namespaces:
        parts.append(_any_glob("variables.ns", scope.namespaces))
    for k, v in sorted(scope.match_labels.items()):
        parts.append(_label_is(k, v))
    return " && ".join(parts) if parts else "true"


def _mode_cel(policy: MigrationPolicy) -> str:
    """`MigrationPolicy.mode_for` in CEL: label override, labelled modes, namespace globs, default."""
    expr = cel_string(policy.default_mode.value)
    for pattern, mode in reversed(list(policy.namespaces.items())):
        expr = f"({_glob_cel('variables.ns', pattern)} ? {cel_string(mode.value)} : {expr})"
    for sel, mode in reversed(list(policy.label_modes.items())):
        k, _, v = sel.partition("=")
        expr = f"({_label_is(k, v)} ? {cel_string(mode.value)} : {expr})"
    key = cel_string(MIGRATION_MODE_LABEL)
    valid = "[" + ", ".join(cel_string(m.value) for m in MigrationMode) + "]"
    return (
        f"({key} in variables.labels && variables.labels[{key}] in {valid} "
        f"? variables.labels[{key}] : {expr})"
    )


def _modes_cel(policies: Sequence[MigrationPolicy]) -> str:
    """The first policy whose scope covers the namespace decides; none: no mode."""
    expr = cel_string("none")
    for p in reversed(policies):
        # An extended-resource policy still decides its namespaces, but nothing here can enforce it.
        mode = _mode_cel(p) if p.strategy is MigrationStrategy.CLAIM_TEMPLATE else cel_string("none")
        expr = f"({_scope_cel(p.scope)} ? {mode} : {expr})"
    return expr


def _exempt_cel(exceptions: Sequence[PolicyException]) -> str:
    from .model import any_glob

    parts = []
    for e in exceptions:
        if e.rules and not any_glob(e.rules, RULE_ID):
            continue
        conds = []
        if e.namespaces:
            conds.append(_any_glob("variables.ns", e.namespaces))
        if e.objects:
            objs = []
            for o in e.objects:
                c = [_glob_cel("object.kind", o.kind), _glob_cel("object.metadata.name", o.name)]
                c.append(_glob_cel("variables.ns", o.namespace))
                objs.append("(" + " && ".join(c) + ")")
            conds.append("(" + " || ".join(objs) + ")")
        parts.append("(" + " && ".join(conds) + ")" if conds else "true")
    return " || ".join(parts) if parts else "false"


def _legacy_key_cel(served: frozenset[str]) -> str:
    mig = f"(k.startsWith({cel_string(MIG_PREFIX)}) && size(k) > {len(MIG_PREFIX)})"
    base = f"(k == {cel_string(LEGACY_GPU)} || {mig})"
    if not served:
        return base
    names = "[" + ", ".join(cel_string(s) for s in sorted(served)) + "]"
    return f"({base} && !(k in {names}))"


def served_extended_resources(deviceclasses: Iterable[Any]) -> frozenset[str]:
    """The resource names DeviceClasses serve through `spec.extendedResourceName` (KEP-5004)."""
    out = set()
    for obj in deviceclasses:
        if isinstance(obj, dict) and obj.get("kind") == "DeviceClass":
            name = (obj.get("spec") or {}).get("extendedResourceName")
            if isinstance(name, str) and name:
                out.add(name)
    return frozenset(out)


def legacy_gpu_policy(
    policies: PolicySet, served: frozenset[str] = frozenset()
) -> list[dict[str, Any]] | None:
    """The ValidatingAdmissionPolicy and its binding; None when no MigrationPolicy can reach enforce."""
    migration = list(policies.migration)
    if not migration:
        return None
    key = _legacy_key_cel(served)
    # A count of zero asks for no device (the webhook skips it too).
    uses = (
        "c, has(c.resources) && ("
        f"(has(c.resources.limits) && c.resources.limits.exists(k, {key} "
        "&& string(c.resources.limits[k]) != '0'))"
        f" || (has(c.resources.requests) && c.resources.requests.exists(k, {key} "
        "&& string(c.resources.requests[k]) != '0')))"
    )
    names = (
        "(has(c.resources.limits) ? c.resources.limits.filter(k, " + key + ") : [])"
        " + (has(c.resources.requests) ? c.resources.requests.filter(k, " + key + ") : [])"
    )
    rules = [
        {
            "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
            "operations": ["CREATE"], "scope": "Namespaced",
        },
        *(
            {
                "apiGroups": [g], "apiVersions": [v], "resources": list(rs),
                "operations": ["CREATE", "UPDATE"], "scope": "Namespaced",
            }
            for g, v, rs in _TEMPLATE_KINDS
        ),
        {
            "apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["cronjobs"],
            "operations": ["CREATE", "UPDATE"], "scope": "Namespaced",
        },
    ]  # fmt: skip
    vap: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": dict(LABELS)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules},
            "variables": [
                {"name": "ns", "expression": "namespaceObject.metadata.name"},
                {
                    "name": "labels",
                    "expression": "has(namespaceObject.metadata.labels) ? namespaceObject.metadata.labels"
                    " : {'': ''}",
                },
                {
                    "name": "spec",
                    "expression": "object.kind == 'Pod' ? object.spec : object.kind == 'CronJob' ? "
                    "object.spec.jobTemplate.spec.template.spec : object.spec.template.spec",
                },
                {
                    "name": "containers",
                    "expression": "(has(variables.spec.initContainers) ? variables.spec.initContainers : [])"
                    " + (has(variables.spec.containers) ? variables.spec.containers : [])",
                },
                {"name": "mode", "expression": _modes_cel(migration)},
                {"name": "exempt", "expression": _exempt_cel(policies.exceptions)},
                {"name": "legacy", "expression": f"variables.containers.filter({uses})"},
            ],
            "validations": [
                {
                    "expression": "variables.mode != 'enforce' || variables.exempt "
                    "|| size(variables.legacy) == 0",
                    "messageExpression": (
                        "object.kind + ' ' + object.metadata.name + ': container(s) ' + "
                        f"variables.legacy.map(c, c.name + ' (' + ({names}).join(', ') + ')').join(', ') + "
                        "' ask for device-plugin GPUs in namespace ' + variables.ns + "
                        f"', whose migration mode is enforce ({RULE_ID}); request the GPU through a "
                        "ResourceClaimTemplate (draguard migrate FILE --write shows the rewrite)'"
                    ),
                    "reason": "Forbidden",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": dict(LABELS)},
        "spec": {"policyName": POLICY_NAME, "validationActions": ["Deny"]},
    }
    return [vap, binding]


def generate(policies: PolicySet, served: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Every ValidatingAdmissionPolicy (and binding) the policies compile to."""
    return legacy_gpu_policy(policies, served) or []
