"""Structured JSON logs: one object per line, with the fields passed through `extra=`."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import time
from typing import Any, TextIO

from . import codec

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in _STANDARD and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


_handler: logging.StreamHandler[TextIO] | None = None
_LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning", logging.ERROR: "error"}
# (whole second, its text): the date part of a timestamp changes once a second, not per line.
_second: tuple[int, str] = (-1, "")


def utc_millis(ns: int) -> str:
    """`datetime.isoformat(timespec="milliseconds")` of a UTC time in ns since the epoch, with the
    text up to the second worked out once per second (it is most of the cost per log line)."""
    global _second
    sec, rest = divmod(ns, 1_000_000_000)
    cached = _second
    if cached[0] != sec:
        cached = _second = (sec, dt.datetime.fromtimestamp(sec, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{cached[1]}.{rest // 1_000_000:03d}+00:00"


def emit(logger: logging.Logger, level: int, msg: str, fields: dict[str, Any]) -> None:
    """Log one structured line. With `setup()` done, the per-request line skips LogRecord and the
    formatter (the same JSON comes out, at a fraction of the cost on the admission path)."""
    if not logger.isEnabledFor(level):
        return
    h = _handler
    handlers = logging.root.handlers
    if h is None or len(handlers) != 1 or handlers[0] is not h:
        logger.log(level, msg, extra=fields)
        return
    out = {
        "time": utc_millis(time.time_ns()),
        "level": _LEVELS.get(level) or logging.getLevelName(level).lower(),
        "logger": logger.name,
        "msg": msg,
        **fields,
    }
    line = codec.dumps_log(out) + "\n"
    with h.lock or _NOLOCK:
        h.stream.write(line)


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NOLOCK = _NoLock()


def setup(level: str = "info", stream: TextIO | None = None) -> None:
    """Route the `draguard` loggers (and aiohttp's) to JSON lines on stderr."""
    global _handler
    handler: logging.StreamHandler[TextIO] = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    _handler = handler
    root.setLevel(logging.WARNING)
    lvl = getattr(logging, level.upper(), None)
    if not isinstance(lvl, int):
        raise ValueError(f"--log-level {level!r}: use debug, info, warning or error")
    logging.getLogger("draguard").setLevel(lvl)
    # aiohttp's access log would print a line per review; our request log already does.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
