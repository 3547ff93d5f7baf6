"""Inputs of the engine besides policies and inventory: the objects and what admission knows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ALL_RESOURCE_VERSIONS: frozenset[str] = frozenset({"v1", "v1beta2", "v1beta1"})


@dataclass(frozen=True, slots=True)
class SourceObject:
    """One Kubernetes object and where it came from (a file in review, a request in admission)."""

    obj: Mapping[str, Any]
    file: str | None = None
    line: int | None = None  # line of the document's first key, 1-based
    doc_index: int = 0
    # JSON pointer ("/spec/devices/requests/0") -> line, where the reader knows it.
    lines: Mapping[str, int] = field(default_factory=dict)

    def line_of(self, pointer: str) -> int | None:
        """Best known line for a JSON pointer: the pointer itself or its nearest parent."""
        p = pointer
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p.rsplit("/", 1)[0]
        return self.line


@dataclass(frozen=True, slots=True)
class QuotaUsage:
    """Live device usage from cached ResourceClaims: (scope, device class) -> devices, and GPU-equivalents.

    `scope` is a namespace name, or `team:<value>` for a team label spanning namespaces.
    """

    devices: Mapping[tuple[str, str], int] = field(default_factory=dict)
    gpu_equivalents: Mapping[str, float] = field(default_factory=dict)
    # scope -> number of ResourceClaim objects (for `count/resourceclaims.resource.k8s.io`-style budgets).
    claims: Mapping[str, int] = field(default_factory=dict)


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
