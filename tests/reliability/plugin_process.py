"""The DRA plugin as a child process that tests kill and restart; what it left on disk."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from driver.checkpoint import PREPARE_COMPLETED, Checkpoint
from driver.state import CRASH_ENV
from tests.driver.driver_helpers import Kubelet

HERE = Path(__file__).parent


class Plugin:
    """plugin_runner.py as a child process."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.proc: subprocess.Popen[str] | None = None

    def claims(self, *objs: dict[str, Any]) -> None:
        (self.base / "claims.json").write_text(json.dumps(list(objs)))

    def start(self, crash_at: str | None = None) -> dict[str, Any]:
        env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
        if crash_at:
            env[CRASH_ENV] = crash_at
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "plugin_runner.py"), str(self.base)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"plugin did not start: {err[-2000:]}")
        return dict(json.loads(line))

    def wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    async def kubelet(self) -> Kubelet:
        k = Kubelet(self.base / "registry" / "gpu.nvidia.com-reg.sock")
        await k.register()
        return k

    # --- what is on disk ---------------------------------------------------------------------------
    def cdi_uids(self) -> set[str]:
        d = self.base / "cdi"
        if not d.is_dir():
            return set()
        return {
            m.group(1)
            for p in d.iterdir()
            if (m := re.match(r"k8s\.gpu\.nvidia\.com-claim_(.+)\.json$", p.name))
        }

    def checkpoint(self) -> dict[str, str]:
        return {uid: e.state for uid, e in Checkpoint(self.base / "plugins").load().items()}

    def assert_consistent(self) -> None:
        """Every CDI spec belongs to a claim the checkpoint holds as prepared, and vice versa."""
        cp = self.checkpoint()
        completed = {u for u, s in cp.items() if s == PREPARE_COMPLETED}
        assert self.cdi_uids() == completed, f"CDI specs {self.cdi_uids()} vs prepared claims {cp}"
