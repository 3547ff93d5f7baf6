"""Inputs of the engine besides policies and inventory: what admission knows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.frozen import one_call_init

ALL_RESOURCE_VERSIONS: frozenset[str] = frozenset({"v1", "v1beta2", "v1beta1"})


@one_call_init
@dataclass(frozen=True, slots=True)
class QuotaUsage:
    """Live device usage from cached ResourceClaims: (scope, device class) -> devices, and GPU-equivalents.

    `scope` is a namespace name, or `team:<value>` for a team label spanning namespaces.
    """

    devices: Mapping[tuple[str, str], int] = field(default_factory=dict)
    gpu_equivalents: Mapping[str, float] = field(default_factory=dict)
    # scope -> number of ResourceClaim objects (for `count/resourceclaims.resource.k8s.io`-style budgets).
    claims: Mapping[str, int] = field(default_factory=dict)


@one_call_init
@dataclass(frozen=True, slots=True)
class Context:
    """What the engine knows beyond the objects. Offline review uses the defaults."""

    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    usage: QuotaUsage | None = None
    served_versions: frozenset[str] = ALL_RESOURCE_VERSIONS
    default_namespace: str = "default"
    today: dt.date = field(default_factory=dt.date.today)
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"] | None = None
    # True in admission: the object is one request, not a whole input set.
    admission: bool = False
    # Objects admission read from the API server for this request because its caches lacked them
    # (a claim's owner pod, a template or claim a pod names): consulted, never evaluated.
    related: tuple[Mapping[str, Any], ...] = ()
    # (kind, namespace, name) admission looked up for this request: "absent" (the API server has no
    # such object) or "unreadable" (the lookup failed or timed out).
    looked_up: Mapping[tuple[str, str, str], Literal["absent", "unreadable"]] = field(default_factory=dict)
    # The Kubernetes release offline review judges selectors for (`review --kubernetes-version`):
    # CEL functions and device fields its API server does not accept yet are `cel/version`. None:
    # the newest release draguard follows (webhook.cel.versions.DEFAULT).
    kubernetes_version: str | None = None
    # Which driver implementation serves `gpu.nvidia.com` (webhook.dra.drivers: "draguard" or
    # "nvidia"); None: detected from the inventory and DeviceClasses.
    driver_schema: str | None = None
