"""Sharing a full GPU by consumable capacity (KEP-5075, `resource.k8s.io/v1`, on from Kubernetes 1.36).

In this mode a full GPU is published with `allowMultipleAllocations: true` and its `memory` capacity
carries a request policy; the scheduler then places several claims on one GPU, each with its own
`shareID` and `consumedCapacity`, as long as their memory adds up to at most the GPU's.

The request policy, and why:
- `validRange.min` = `validRange.step` = the share step (default 1Gi): shares are whole steps, so a GPU
  holds at most memory/step shares (80 on an 80 GB board), which bounds the scheduler's and this
  driver's work per GPU, and a memory limit in whole GiB is what frameworks take.
- `validRange.max` = the largest whole number of steps that fits in the GPU's memory (the API server
  wants max on the step grid): one claim may take all of the GPU but less than a step.
- `default` = that same maximum. A claim that names no
  memory (every claim written before this mode existed) gets practically the whole GPU; what is left
  is less than one step, so no other share fits beside it: turning this mode on changes nothing for
  such claims, they still get a GPU to themselves.

Pure module (no I/O).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

GIB = 1 << 30
DEFAULT_STEP = GIB
MAX_QUANTITY_LEN = 64  # a quantity string longer than this is hostile input, not a GPU's memory
MAX_SHARE_ID_LEN = 64
MEMORY = "memory"
MODE_CAPACITY = "ConsumableCapacity"  # the sharing recorded for a share in the checkpoint

_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?$")
_SUFFIX = {
    "": Decimal(1), "m": Decimal("0.001"), "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9),
    "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18), "Ki": Decimal(1 << 10),
    "Mi": Decimal(1 << 20), "Gi": Decimal(1 << 30), "Ti": Decimal(1 << 40), "Pi": Decimal(1 << 50),
    "Ei": Decimal(1 << 60),
}  # fmt: skip
# A shareID is a UID the scheduler generates; it becomes part of a CDI device name, so only the
# characters CDI allows in names are accepted (and none that could walk out of a file name).
_SHARE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


class QuantityError(ValueError):
    """A Kubernetes quantity that cannot be read as a whole number of bytes."""


def parse_quantity(text: Any) -> int:
    """A Kubernetes quantity (`10Gi`, `10737418240`, `1.5Gi`, `12e9`) as bytes, rounded up."""
    if not isinstance(text, str) or not text or len(text) > MAX_QUANTITY_LEN:
        raise QuantityError(f"{str(text)[:MAX_QUANTITY_LEN]!r} is not a quantity")
    m = _QUANTITY.match(text)
    if not m:
        raise QuantityError(f"{text!r} is not a quantity (such as 10Gi or 10737418240)")
    number, suffix = m.group(1), m.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            exp = int(suffix[1:])
            if abs(exp) > 30:  # bounded: no exponent makes a GPU's memory that large
                raise QuantityError(f"{text!r}: exponent out of range")
            value = Decimal(number) * (Decimal(10) ** exp)
        else:
            value = Decimal(number) * _SUFFIX[suffix]
    except InvalidOperation:
        raise QuantityError(f"{text!r} is not a quantity") from None
    if value < 0:
        raise QuantityError(f"{text!r} is negative")
    whole = int(value.to_integral_value(rounding="ROUND_CEILING"))
    return whole


def check_share_id(share: Any) -> str:
    """The shareID of an allocation result, checked; ValueError saying why it cannot be used."""
    if not isinstance(share, str) or not share:
        raise ValueError(f"shareID {share!r} is not a string")
    if len(share) > MAX_SHARE_ID_LEN or not _SHARE_ID.match(share):
        raise ValueError(
            f"shareID {share[:MAX_SHARE_ID_LEN]!r} is not a UID (letters, digits, '-', '_', '.', ':', "
            f"at most {MAX_SHARE_ID_LEN} characters)"
        )
    return share


@dataclass(frozen=True, slots=True)
class CapacitySharing:
    """Which full GPUs are shared by capacity, and the step their memory is shared in.

    `models` None: every full GPU of the node; otherwise only GPUs whose NVML product name is listed.
    """

    models: frozenset[str] | None = None
    step: int = DEFAULT_STEP

    def __post_init__(self) -> None:
        if self.step <= 0:
            raise ValueError(f"the memory share step must be positive, got {self.step}")

    def applies(self, product_name: str) -> bool:
        return self.models is None or product_name in self.models

    def default_share(self, memory: int) -> int:
        """The memory a claim that names none consumes: the most whole steps that fit."""
        return (memory // self.step) * self.step

    def request_policy(self, memory: int) -> dict[str, int | dict[str, int]]:
        """The `memory` capacity's request policy for a GPU of `memory` bytes (values in bytes)."""
        top = self.default_share(memory)  # the API server wants max on the step grid too
        return {"default": top, "validRange": {"min": self.step, "max": top, "step": self.step}}

    def eligible(self, memory: int | None) -> bool:
        """A GPU can be shared by memory only when NVML reports its memory and it holds one step."""
        return memory is not None and memory >= self.step


def parse_capacity_sharing(models: str | None, step: str | None = None) -> CapacitySharing | None:
    """The `--share-by-capacity` setting: `all`, or product names separated by commas; None: off.

    ValueError with the setting to fix when a value cannot be used.
    """
    if models is None or not models.strip():
        return None
    step_bytes = DEFAULT_STEP
    if step is not None:
        try:
            step_bytes = parse_quantity(step)
        except QuantityError as exc:
            raise ValueError(f"--share-memory-step: {exc}") from None
        if step_bytes < (1 << 20):
            raise ValueError(f"--share-memory-step: {step!r} is below 1Mi; shares that small are no use")
    if models.strip() == "all":
        return CapacitySharing(None, step_bytes)
    names = frozenset(n.strip() for n in models.split(",") if n.strip())
    if not names:
        raise ValueError("--share-by-capacity: give `all` or GPU product names separated by commas")
    return CapacitySharing(names, step_bytes)


def consumed_memory(result: Mapping[str, Any], driver_name: str) -> int | None:
    """The memory an allocation result consumes (`consumedCapacity.memory`), None when absent.

    QuantityError when present but unreadable.
    """
    consumed = result.get("consumedCapacity")
    if consumed is None:
        return None
    if not isinstance(consumed, Mapping):
        raise QuantityError("consumedCapacity is not a map of capacity name to quantity")
    for key in (MEMORY, f"{driver_name}/{MEMORY}"):
        if key in consumed:
            return parse_quantity(consumed[key])
    return None
