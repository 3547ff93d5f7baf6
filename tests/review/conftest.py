"""Helpers for the review CLI tests: run `draguard` in-process through `webhook.cli.main`."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from webhook import cli

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
GOLDEN = HERE / "golden"
UPDATE_ENV = "DRAGUARD_UPDATE_GOLDEN"


@dataclass
class Run:
    code: int
    out: str
    err: str


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        # Only a command module that does not exist at all is left out; any other import error
        # is a real failure and must surface.
        if exc.name == name:
            return False
        raise
    return True


@pytest.fixture(autouse=True)
def _no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)


@pytest.fixture
def draguard(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Run]:
    """Call `draguard ARGS...` in-process; SystemExit (argparse usage errors) becomes the exit code."""
    present = tuple(m for m in cli.COMMAND_MODULES if _importable(m))
    monkeypatch.setattr(cli, "COMMAND_MODULES", present)

    def run(*args: str) -> Run:
        capsys.readouterr()
        try:
            code = cli.main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


@pytest.fixture
def in_fixtures(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run from tests/review/fixtures so reported paths are short and stable."""
    monkeypatch.chdir(FIXTURES)
    yield FIXTURES


def check_golden(name: str, actual: str) -> None:
    """Compare with tests/review/golden/NAME; DRAGUARD_UPDATE_GOLDEN=1 rewrites the file."""
    path = GOLDEN / name
    if os.environ.get(UPDATE_ENV):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        return
    assert path.exists(), f"missing golden {path}; run with {UPDATE_ENV}=1 to create it"
    expected = path.read_text(encoding="utf-8")
    assert actual == expected, f"output differs from {path} (set {UPDATE_ENV}=1 to accept the new output)"
