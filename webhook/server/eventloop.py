"""Which asyncio event loop `draguard serve` runs on.

uvloop (libuv, with TLS done in compiled code) answers an admission review with less CPU and
about half the latency of the standard loop at the same load (docs/performance.md); `auto` uses
it when it is installed and falls back to asyncio otherwise, so the server runs everywhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
CHOICES = ("auto", "uvloop", "asyncio")


class EventLoopError(ValueError):
    """The requested loop cannot be used here."""


def loop_factory(choice: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """(name of the loop used, factory for asyncio.Runner; None = the standard loop)."""
    if choice not in CHOICES:
        raise EventLoopError(f"--event-loop {choice!r}: use one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return "asyncio", None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise EventLoopError(
                "--event-loop uvloop: uvloop is not installed; pip install uvloop, "
                "or use --event-loop asyncio"
            ) from None
        return "asyncio", None
    return "uvloop", uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """`asyncio.run(main)` on the chosen loop."""
    try:
        _name, factory = loop_factory(choice)
    except EventLoopError:
        main.close()  # never awaited: close it rather than leak a warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
