"""Strict semantic versions (semver 2.0.0), as Kubernetes validates `version` attributes.

`Semver.parse` accepts exactly MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD] with no leading zeros in
numeric parts; `coerce_semver` turns the loose versions tools print ("535.104.05", "8.0", "v12")
into that form.
"""

from __future__ import annotations

import contextlib
import functools
import re
from dataclasses import dataclass

_NUM = r"(?:0|[1-9]\d*)"
_PRE_ID = r"(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)"
_BUILD_ID = r"[0-9A-Za-z-]+"
_SEMVER = re.compile(
    rf"({_NUM})\.({_NUM})\.({_NUM})"
    rf"(?:-({_PRE_ID}(?:\.{_PRE_ID})*))?"
    rf"(?:\+({_BUILD_ID}(?:\.{_BUILD_ID})*))?"
)
_LOOSE = re.compile(r"[vV]?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-([0-9A-Za-z.-]+))?(?:\+([0-9A-Za-z.-]+))?")


@functools.total_ordering
@dataclass(frozen=True, slots=True)
class Semver:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Semver:
        """Parse strict semver 2.0.0 text; raises ValueError saying what is wrong."""
        return _parse_cached(text)

    def compare(self, other: Semver) -> int:
        """-1, 0 or 1 by semver precedence (build metadata is ignored)."""
        left = (self.major, self.minor, self.patch)
        right = (other.major, other.minor, other.patch)
        if left != right:
            return -1 if left < right else 1
        return _compare_prerelease(self.prerelease, other.prerelease)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self.compare(other) == 0

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self.compare(other) < 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.prerelease))

    def canonical_key(self) -> str:
        """Text equal for versions of equal precedence (build metadata dropped)."""
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(self.prerelease)}" if self.prerelease else core

    def __str__(self) -> str:
        text = self.canonical_key()
        return f"{text}+{'.'.join(self.build)}" if self.build else text


def _compare_prerelease(left: tuple[str, ...], right: tuple[str, ...]) -> int:
    # A version without pre-release has higher precedence than one with.
    if not left or not right:
        return (not left) - (not right)
    for a, b in zip(left, right, strict=False):
        if a == b:
            continue
        a_num, b_num = a.isdigit(), b.isdigit()
        if a_num and b_num:
            return -1 if int(a) < int(b) else 1
        if a_num != b_num:
            # Numeric identifiers have lower precedence than alphanumeric ones.
            return -1 if a_num else 1
        return -1 if a < b else 1
    return (len(left) > len(right)) - (len(left) < len(right))


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Semver:
    if not isinstance(text, str):
        raise ValueError(f"invalid semver {text!r}: expected text")
    match = _SEMVER.fullmatch(text)
    if match is None:
        hint = ""
        with contextlib.suppress(ValueError):
            hint = f" (did you mean {coerce_semver(text)!r}?)"
        raise ValueError(
            f"invalid semver {text!r}: expected MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD] "
            f"with no leading zeros{hint}"
        )
    major, minor, patch, pre, build = match.groups()
    return Semver(
        int(major), int(minor), int(patch),
        tuple(pre.split(".")) if pre else (),
        tuple(build.split(".")) if build else (),
    )


def is_semver(text: str) -> bool:
    return isinstance(text, str) and _SEMVER.fullmatch(text) is not None


def coerce_semver(text: str) -> str:
    """Normalise a loose version to strict semver text.

    Drops a leading "v", fills missing minor/patch with 0 and strips leading zeros:
    "535.104.05" -> "535.104.5", "8.0" -> "8.0.0", "v12" -> "12.0.0". Raises ValueError when
    the text is not a version at all.
    """
    stripped = text.strip() if isinstance(text, str) else ""
    match = _LOOSE.fullmatch(stripped)
    if match is None:
        raise ValueError(f"cannot read {text!r} as a version: expected digits like 535.104.05 or 12.4")
    major, minor, patch, pre, build = match.groups()
    core = ".".join(str(int(part or "0")) for part in (major, minor, patch))
    if pre:
        parts = pre.split(".")
        if any(not p for p in parts):
            raise ValueError(f"cannot read {text!r} as a version: empty pre-release identifier")
        core += "-" + ".".join(str(int(p)) if p.isdigit() else p for p in parts)
    if build:
        if any(not p for p in build.split(".")):
            raise ValueError(f"cannot read {text!r} as a version: empty build identifier")
        core += "+" + build
    return core
