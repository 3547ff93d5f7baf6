"""Consumable capacity (KEP-5075): a device's per-capacity request policy and what a share consumes.

The arithmetic is the scheduler's (`calculateConsumedCapacity`, `violatesPolicy`), exact on
fractions: no request takes the policy's default (or the whole capacity); a request is rounded
up to the next valid value or the next step from `validRange.min`; the result must not exceed
`validRange.max`, must be a listed value, or a whole number of steps from the minimum.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .quantity import Quantity


def parse_quantity(raw: object) -> Quantity | None:
    """A quantity from a string or number; None for anything unreadable."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        raw = str(raw)
    if not isinstance(raw, str):
        return None
    try:
        return Quantity.parse(raw)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    default: Quantity | None = None
    valid_values: tuple[Quantity, ...] = ()
    min: Quantity | None = None
    max: Quantity | None = None
    step: Quantity | None = None

    @property
    def has_range(self) -> bool:
        return self.min is not None or self.max is not None or self.step is not None


def read_policy(raw: object) -> RequestPolicy | None:
    if not isinstance(raw, Mapping):
        return None
    values = raw.get("validValues")
    parsed = tuple(q for q in (parse_quantity(v) for v in (values if isinstance(values, list) else ())) if q)
    rng = raw.get("validRange")
    rng = rng if isinstance(rng, Mapping) else {}
    return RequestPolicy(
        parse_quantity(raw.get("default")),
        parsed,
        parse_quantity(rng.get("min")),
        parse_quantity(rng.get("max")),
        parse_quantity(rng.get("step")),
    )


def consumed(requested: Quantity | None, value: Quantity, policy: RequestPolicy | None) -> Quantity:
    """What one allocation consumes of a capacity: the request rounded up by the policy."""
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return value
    if policy is None:
        return requested
    if policy.min is not None:
        if requested < policy.min:
            return policy.min
        if policy.step is None or policy.step.value <= 0:
            return requested
        added = requested.value - policy.min.value
        n = -(-added // policy.step.value)  # ceiling
        return Quantity(policy.min.value + policy.step.value * n, policy.step.binary)
    if policy.valid_values:
        for v in sorted(policy.valid_values):
            if requested <= v:
                return v
    return requested


def violates(amount: Quantity, policy: RequestPolicy | None) -> str | None:
    """Why `amount` is not a value the policy allows, or None when it is."""
    if policy is None:
        return None
    if policy.default is not None and amount == policy.default:
        return None
    if policy.has_range:
        if policy.max is not None and amount > policy.max:
            return f"{amount} is above the request policy's maximum {policy.max}"
        if policy.step is not None and policy.step.value > 0:
            base = policy.min.value if policy.min is not None else 0
            if (amount.value - base) % policy.step.value != 0:
                return f"{amount} is not a whole number of {policy.step} steps from {policy.min}"
        return None
    if policy.valid_values and amount not in policy.valid_values:
        return f"{amount} is not one of the valid values {', '.join(map(str, policy.valid_values))}"
    return None
