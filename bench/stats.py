"""The one percentile the benches report: nearest rank, so every figure is a value that was measured."""

from __future__ import annotations

import math
from collections.abc import Sequence


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (q in 0..100) by nearest rank: a p99 of 200 values is the 2nd largest."""
    if not values:
        raise ValueError("a percentile of no values")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]
