"""Every test starts from the same logging set-up: a command run in-process (`serve`, `audit run`)
calls `webhook.server.logs.setup()`, which sets logger levels and a root handler for the life of a
process. Left in place, `--log-level error` in one test would hide the warnings a later test
expects to capture."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

_LOGGERS = ("", "draguard", "aiohttp.access")


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    from webhook.server import logs

    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    before = logs._handler
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    added = logs._handler
    if added is not None and added is not before:
        logging.getLogger().removeHandler(added)
        logs._handler = before
