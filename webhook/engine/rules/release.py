"""`structure/dropped-field`: DRA fields the target Kubernetes release drops on create.

Offline review only (`Context.kubernetes_version`, from `review --kubernetes-version`): a field
behind a feature gate that is off by default in that release is removed by the API server without
an error, so the stored claim or class is not the one in the pull request (tolerations gone, a
capacity request gone). At admission the API server has already dropped them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ...core.findings import Finding, Mode, Severity
from ...core.source import SourceObject
from ...dra import releases
from ...dra.objects import dra_version
from .base import DRA, FunctionRule, RuleContext
from .opaque import dotted

RULE_ID = "structure/dropped-field"


Found = tuple[str, str, releases.Gate]
"""(JSON pointer, field name, its gate)."""


def _fields(node: object, pointer: str, table: Mapping[str, releases.Gate]) -> Iterable[Found]:
    if isinstance(node, Mapping):
        for name, gate in table.items():
            if name in node:
                yield f"{pointer}/{name}", name, gate


def _list(node: object) -> list[Any]:
    return node if isinstance(node, list) else []


def _claim_fields(spec: object, base: str) -> Iterable[Found]:
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    if not isinstance(devices, Mapping):
        return
    for i, request in enumerate(_list(devices.get("requests"))):
        at = f"{base}/devices/requests/{i}"
        # resource.k8s.io/v1 nests a request under `exactly`; v1beta1 keeps it flat.
        yield from _fields(request, at, releases.REQUEST_FIELDS)
        if isinstance(request, Mapping):
            yield from _fields(request.get("exactly"), f"{at}/exactly", releases.REQUEST_FIELDS)
            for j, sub in enumerate(_list(request.get("firstAvailable"))):
                yield from _fields(sub, f"{at}/firstAvailable/{j}", releases.REQUEST_FIELDS)
    for k, constraint in enumerate(_list(devices.get("constraints"))):
        yield from _fields(constraint, f"{base}/devices/constraints/{k}", releases.CONSTRAINT_FIELDS)


def _check(item: SourceObject, rc: RuleContext) -> Iterable[Finding]:
    release = rc.ctx.kubernetes_version
    obj = item.obj
    if release is None or rc.ctx.admission or dra_version(obj.get("apiVersion")) is None:
        return
    kind = obj.get("kind")
    spec = obj.get("spec")
    found: Iterable[Found]
    if kind == "DeviceClass":
        found = _fields(spec, "/spec", releases.CLASS_FIELDS)
    elif kind == "ResourceClaim":
        found = _claim_fields(spec, "/spec")
    elif kind == "ResourceClaimTemplate":
        found = _claim_fields(spec.get("spec") if isinstance(spec, Mapping) else None, "/spec/spec")
    else:
        return
    for pointer, name, gate in found:
        if gate.enabled(release):
            continue
        since = f"on by default from {gate.on_from}" if gate.on_from else "on by default in no release yet"
        yield rc.finding(
            item, RULE_ID, Severity.WARNING, Mode.WARN,
            f"{dotted(pointer)}: Kubernetes {release} drops `{name}` on create, without an error: it needs "
            f"the {gate.name} feature gate ({gate.history}; {since})",
            fix=f"enable {gate.name} on the cluster's API server, or leave `{name}` out for {release}",
            pointer=pointer,
        )


RULES = (FunctionRule(RULE_ID, _check, frozenset({DRA})),)
