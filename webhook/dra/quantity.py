"""Kubernetes resource quantities ("80Gi", "1.5", "500m", "2e3"), exact.

Values are held as `Fraction`s so arithmetic and comparison never round. Parsing follows
apimachinery's `resource.ParseQuantity`: an optionally signed decimal number followed by one
binary-SI suffix (Ki..Ei), decimal-SI suffix (n, u, m, "", k, M, G, T, P, E) or decimal exponent
(e3, E-2). As in Kubernetes, a value finer than one nano-unit is rounded up to the next nano-unit.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

_NUMBER = re.compile(r"([+-]?)(\d+\.?\d*|\.\d+)(.*)", re.DOTALL)
_EXPONENT = re.compile(r"[eE]([+-]?\d+)")

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
_NANO = Fraction(1, 10**9)
# Exponents this far out cannot come from a real resource and would only burn memory.
_MAX_EXPONENT = 1000


@functools.total_ordering
@dataclass(frozen=True, slots=True)
class Quantity:
    """An exact quantity. `binary` remembers whether the text used a binary suffix (for `__str__`)."""

    value: Fraction
    binary: bool = False

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Parse Kubernetes quantity text; raises ValueError naming the text and what is wrong."""
        return _parse_cached(text)

    @classmethod
    def of(cls, value: int | Fraction) -> Quantity:
        return cls(Fraction(value))

    # Comparison and arithmetic (the CEL library's compareTo/add/sub).
    def compare(self, other: Quantity) -> int:
        """-1, 0 or 1, like Kubernetes `Quantity.Cmp`."""
        return (self.value > other.value) - (self.value < other.value)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value < other.value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def add(self, other: Quantity | int) -> Quantity:
        rhs = other.value if isinstance(other, Quantity) else Fraction(other)
        return Quantity(self.value + rhs, self.binary)

    def sub(self, other: Quantity | int) -> Quantity:
        rhs = other.value if isinstance(other, Quantity) else Fraction(other)
        return Quantity(self.value - rhs, self.binary)

    def is_integer(self) -> bool:
        """True when the value is a whole number that fits in an int64 (Kubernetes `AsInt64` succeeds)."""
        return self.value.denominator == 1 and INT64_MIN <= self.value.numerator <= INT64_MAX

    def as_integer(self) -> int:
        """The value as int64; ValueError when it is fractional or out of range."""
        if not self.is_integer():
            shown = str(self)
            if len(shown) > 40:
                shown = shown[:20] + "..." + shown[-8:]
            raise ValueError(f"cannot convert value to integer: {shown} is not an integer in int64 range")
        return self.value.numerator

    def as_approximate_float(self) -> float:
        try:
            return float(self.value)
        except OverflowError:
            # Beyond the double range: saturate, as a float conversion of a huge decimal does.
            return math.inf if self.value > 0 else -math.inf

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def canonical_key(self) -> str:
        """An exact text form for equality: the same for equal values, e.g. "85899345920" or "3/2"."""
        return str(self.value)

    def __str__(self) -> str:
        """Kubernetes-like canonical text: the largest suffix that keeps the value exact."""
        value = self.value
        if value == 0:
            return "0"
        sign = "-" if value < 0 else ""
        magnitude = abs(value)
        if self.binary and magnitude.denominator == 1:
            for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
                scaled = magnitude / _BINARY[suffix]
                if scaled.denominator == 1:
                    return f"{sign}{scaled.numerator}{suffix}"
        for suffix in ("E", "P", "T", "G", "M", "k", "", "m", "u", "n"):
            scaled = magnitude / Fraction(10) ** _DECIMAL[suffix]
            if scaled.denominator == 1:
                return f"{sign}{scaled.numerator}{suffix}"
        # Finer than nano cannot come from parse(); show a decimal approximation.
        return f"{sign}{float(magnitude)!r}"


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Quantity:
    if not isinstance(text, str) or not text:
        raise ValueError(
            "invalid quantity '': expected a number with an optional suffix such as 80Gi or 500m"
        )
    match = _NUMBER.fullmatch(text)
    if match is None:
        raise ValueError(
            f"invalid quantity {text!r}: expected a number with an optional suffix "
            "(Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent like e3)"
        )
    sign, digits, suffix = match.groups()
    number = Fraction(digits if not digits.endswith(".") else digits[:-1])
    binary = False
    if suffix in _BINARY:
        number *= _BINARY[suffix]
        binary = True
    elif suffix in _DECIMAL:
        number *= Fraction(10) ** _DECIMAL[suffix]
    else:
        exp = _EXPONENT.fullmatch(suffix)
        if exp is None:
            raise ValueError(
                f"invalid quantity {text!r}: unknown suffix {suffix!r} "
                "(use Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent like e3)"
            )
        power = int(exp.group(1))
        if abs(power) > _MAX_EXPONENT:
            raise ValueError(f"invalid quantity {text!r}: exponent {power} is out of range")
        number *= Fraction(10) ** power
    if number.denominator != 1 and (number / _NANO).denominator != 1:
        # Kubernetes rounds precision finer than 1n up (away from zero) to the next nano-unit.
        number = Fraction(math.ceil(number / _NANO)) * _NANO
    if sign == "-":
        number = -number
    return Quantity(number, binary)
