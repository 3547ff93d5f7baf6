"""`draguard serve --event-loop`: uvloop when installed (auto), the standard loop on request, and a
clear error, not a traceback, when uvloop is asked for but missing."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.server.conftest import free_port, run_cli, write_policies
from webhook.server import eventloop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_auto_uses_uvloop_when_installed() -> None:
    pytest.importorskip("uvloop")
    assert eventloop.loop_factory("auto")[0] == "uvloop"
    assert eventloop.run(_loop_module(), "auto").startswith("uvloop")


def test_asyncio_is_the_standard_loop() -> None:
    assert eventloop.loop_factory("asyncio") == ("asyncio", None)
    assert eventloop.run(_loop_module(), "asyncio").startswith("asyncio")


def test_auto_falls_back_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    assert eventloop.loop_factory("auto") == ("asyncio", None)
    assert eventloop.run(_loop_module(), "auto").startswith("asyncio")
    with pytest.raises(eventloop.EventLoopError, match="uvloop is not installed"):
        eventloop.loop_factory("uvloop")


def test_serve_says_what_to_do_when_uvloop_is_missing(
    tmp_path: Path, cert_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    pol = write_policies(tmp_path / "pol", "enforce")
    rc = run_cli(
        [
            "serve", "--port", str(free_port()), "--tls-cert", str(cert_dir / "tls.crt"),
            "--tls-key", str(cert_dir / "tls.key"), "--policies", str(pol), "--no-watch",
            "--event-loop", "uvloop",
        ]
    )  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "uvloop is not installed" in err and "--event-loop asyncio" in err and "Traceback" not in err
