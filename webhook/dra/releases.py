"""Kubernetes releases draguard judges objects for, and the DRA fields each accepts by default.

A DRA field behind a feature gate that is off is dropped by the API server on create, without an
error: the object is stored without it. Gate defaults are those of Kubernetes v1.37.2's
`pkg/features/kube_features.go`; field names those of `k8s.io/api/resource/v1` (`+featureGate`).
"""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED = ("1.34", "1.35", "1.36", "1.37")
"""Kubernetes releases `review --kubernetes-version` knows (the differential CEL test runs 1.37)."""
DEFAULT = SUPPORTED[-1]
"""The newest release the project tests; what review assumes unless told."""


def parse_version(text: str) -> str:
    """`1.34`, `v1.34` or `1.34.2` -> `1.34`; a release newer than draguard knows -> the newest it
    knows (see `newer_than_known`); ValueError naming the supported releases otherwise."""
    minor = _minor(text)
    if minor in SUPPORTED:
        return minor
    if minor is not None and release_key(minor) > release_key(DEFAULT):
        # A cluster upgraded before draguard must not break every pipeline that names its release:
        # newer releases keep the fields and functions of the newest release draguard knows.
        return DEFAULT
    raise ValueError(f"unsupported Kubernetes version {text!r}: draguard knows {', '.join(SUPPORTED)}")


def newer_than_known(text: str) -> str | None:
    """For a release newer than SUPPORTED covers, what `parse_version` assumed and why (else None)."""
    minor = _minor(text)
    if minor is None or minor in SUPPORTED or release_key(minor) < release_key(DEFAULT):
        return None
    return (
        f"Kubernetes {minor} is newer than the releases draguard knows ({', '.join(SUPPORTED)}): judged by "
        f"{DEFAULT}'s rules; fields or CEL functions new in {minor} may be reported as unknown. "
        "Upgrade draguard for its rules."
    )


def _minor(text: str) -> str | None:
    raw = text.strip().removeprefix("v")
    parts = raw.split(".")
    if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() and len(parts[0]) + len(parts[1]) <= 8:
        return f"{int(parts[0])}.{int(parts[1])}"
    return None


def release_key(release: str) -> tuple[int, int]:
    major, minor = release.split(".")
    return int(major), int(minor)


@dataclass(frozen=True, slots=True)
class Gate:
    """A feature gate and the first release that turns it on by default (None: none yet)."""

    name: str
    on_from: str | None
    history: str

    def enabled(self, release: str) -> bool:
        return self.on_from is not None and release_key(self.on_from) <= release_key(release)


_BETA_IN_136 = "alpha and off in 1.34-1.35, beta and on from 1.36"
DEVICE_TAINTS = Gate("DRADeviceTaints", "1.36", "alpha and off in 1.33-1.35, beta and on from 1.36")
CONSUMABLE_CAPACITY = Gate("DRAConsumableCapacity", "1.36", _BETA_IN_136)
EXTENDED_RESOURCE = Gate("DRAExtendedResource", "1.36", _BETA_IN_136)
DERIVED_ATTRIBUTES = Gate("DRADerivedAttributes", None, "alpha and off in 1.37")

REQUEST_FIELDS: dict[str, Gate] = {
    "tolerations": DEVICE_TAINTS,
    "capacity": CONSUMABLE_CAPACITY,
    "derivedAttributes": DERIVED_ATTRIBUTES,
}
"""Fields of a device request (`exactly`, a `firstAvailable` entry, or a v1beta1 request)."""
CONSTRAINT_FIELDS: dict[str, Gate] = {"distinctAttribute": CONSUMABLE_CAPACITY}
CLASS_FIELDS: dict[str, Gate] = {"extendedResourceName": EXTENDED_RESOURCE}
