"""Feeds CDI specs to the reference CDI library (tools/cdicheck, tags.cncf.io/container-device-interface)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.gotool import go_tool


def cdicheck(spec_dir: Path, *ids: str) -> tuple[int, dict[str, Any]]:
    """Load every spec in `spec_dir`, inject `ids` into an empty OCI spec; (exit status, result)."""
    res = subprocess.run([str(go_tool("cdicheck")), "--spec-dir", str(spec_dir), *ids],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    try:
        return res.returncode, json.loads(res.stdout)
    except ValueError:
        raise AssertionError(f"cdicheck printed no JSON (exit {res.returncode}): {res.stderr}") from None


def check_spec_file(path: Path) -> dict[str, Any]:
    """Validate one spec file alone and inject all its devices; the applied OCI spec."""
    spec = json.loads(path.read_text())
    ids = [f"{spec['kind']}={d['name']}" for d in spec["devices"]]
    with tempfile.TemporaryDirectory(prefix="dg-cdi-") as d:
        shutil.copy(path, Path(d) / path.name)
        rc, out = cdicheck(Path(d), *ids)
    assert rc == 0 and not out["specErrors"] and not out["unresolved"] and not out.get("injectError"), out
    assert sorted(out["devices"]) == sorted(ids)
    oci: dict[str, Any] = out["oci"]
    return oci
