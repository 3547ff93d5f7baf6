#!/usr/bin/env python3
"""The sdist and the wheel of one version: a copy of the tree, stamped, built by the pinned backend.

The tracked (and not ignored) files are copied to a temporary directory, the derived version
(scripts/release/version.py) is stamped into the copy's pyproject.toml and every `__version__`
line of the packages, and setuptools' PEP 517 hooks build both there, with the setuptools that is
installed (the release workflow installs image/build.lock's with --require-hashes, so the backend is
pinned by hash as in the image; `python -m build --no-isolation` does the same).  The checkout is
never modified.  The results are checked before they are reported: the wheel's METADATA and the
sdist's PKG-INFO carry the version.

    python3 scripts/release/dist.py --out dist [--version 1.2.3]

Prints one JSON document: the version, the files and their sha256.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import version as versions  # this directory, not an installed package

ROOT = Path(__file__).resolve().parents[2]
# The backend prints its own progress on stdout, so the names it returns go to a file.
HOOKS = """
import sys
from setuptools import build_meta as backend
out, names = sys.argv[1], sys.argv[2]
built = [backend.build_sdist(out), backend.build_wheel(out)]
with open(names, "w") as f:
    f.write("\\n".join(built))
"""


class DistError(Exception):
    """The distributions cannot be built or are not what they claim; the message says why."""


def tracked_files(repo: Path) -> list[str]:
    cmd = ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    res = subprocess.run(cmd, capture_output=True, check=False)
    if res.returncode != 0:
        raise DistError(f"{repo}: git ls-files failed: {res.stderr.decode().strip()}")
    return sorted({f for f in res.stdout.decode().split("\0") if f and (repo / f).is_file()})


def version_files(tree: Path, files: list[str]) -> list[Path]:
    """pyproject.toml and each package __init__.py that declares __version__."""
    out = [tree / "pyproject.toml"]
    for rel in files:
        if rel.endswith("__init__.py") and "/" in rel and not rel.startswith(("tests/", "tools/", "bench/")):
            p = tree / rel
            if re.search(r'^__version__\s*=\s*"', p.read_text(errors="replace"), re.M):
                out.append(p)
    return out


def _metadata_version(text: str) -> str:
    return str(email.parser.Parser().parsestr(text).get("Version", ""))


def verify(sdist: Path, wheel: Path, version: str) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = [n for n in names if n.endswith(".dist-info/METADATA")]
        if len(meta) != 1:
            raise DistError(f"{wheel.name}: expected one .dist-info/METADATA, found {len(meta)}")
        got = _metadata_version(zf.read(meta[0]).decode())
    if got != version:
        raise DistError(f"{wheel.name}: METADATA says version {got!r}, expected {version!r}")
    with tarfile.open(sdist) as tf:
        pkg = [m for m in tf.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")]
        member = tf.extractfile(pkg[0]) if pkg else None
        got = _metadata_version(member.read().decode()) if member else ""
    if got != version:
        raise DistError(f"{sdist.name}: PKG-INFO says version {got!r}, expected {version!r}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build(
    out: Path, version: str | None = None, repo: Path = ROOT, python: str = sys.executable
) -> dict[str, object]:
    v = version or versions.derive(repo).python
    files = tracked_files(repo)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="draguard-dist-") as tmp:
        tree = Path(tmp) / "src"
        for rel in files:
            dst = tree / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / rel, dst)
        versions.stamp(v, version_files(tree, files))
        built = Path(tmp) / "dist"
        built.mkdir()
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        names = Path(tmp) / "built.txt"
        res = subprocess.run(
            [python, "-c", HOOKS, str(built), str(names)],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if res.returncode != 0:
            tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-15:])
            raise DistError(f"the build backend failed:\n{tail}")
        sdist_name, wheel_name = names.read_text().splitlines()
        sdist, wheel = built / sdist_name, built / wheel_name
        verify(sdist, wheel, v)
        results = []
        for f in (sdist, wheel):
            dst = out / f.name
            shutil.copyfile(f, dst)
            results.append({"file": str(dst), "sha256": _sha256(dst)})
    return {"version": v, "files": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dist.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the sdist and the wheel")
    p.add_argument("--version", help="the version to stamp (default: derived from git tags)")
    args = p.parse_args(argv)
    try:
        summary = build(args.out, args.version)
    except (DistError, versions.VersionError) as exc:
        print(f"dist.py: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
