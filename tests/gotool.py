"""Reference programs in Go (tools/<name>/), where another project's library defines the behaviour.

`go_tool(name)` returns the built binary, building it with scripts/build-tools.sh when missing.
Without Go the test skips, except under CI=true, where a missing reference is a failure.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "build-tools.sh"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def go_tool(name: str) -> Path:
    """Path of tools/<name>'s binary, built on first use (a file lock: parallel sessions build once)."""
    path = Path(subprocess.run(["bash", str(SCRIPT), "--path", name], check=True, capture_output=True,
                               text=True).stdout.strip())
    if path.is_file():
        return path
    if shutil.which("go") is None:
        _unavailable(f"tools/{name}: go is not installed (run scripts/build-tools.sh on a machine with Go)")
    path.parent.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            res = subprocess.run(["bash", str(SCRIPT), name], capture_output=True, text=True)
            if res.returncode != 0:
                pytest.fail(f"building tools/{name} failed:\n{res.stdout}\n{res.stderr}", pytrace=False)
    return path


def run_tool(
    name: str, *args: str, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run tools/<name> (built on first use) with `args`; its output as text, never raising on exit."""
    return subprocess.run(
        [str(go_tool(name)), *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
