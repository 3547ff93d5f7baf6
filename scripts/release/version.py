#!/usr/bin/env python3
"""draguard's version, from git tags: one number for the wheel, the image tag and the bundle.

A commit tagged `vX.Y.Z` (or `vX.Y.Z-rc.N`) is that release; any other commit is a development build
of the next patch release, `X.Y.(Z+1).devN+g<commit>` (N commits after the last version tag), and with
no version tag at all the next release is pyproject.toml's own version (`0.1.0.devN+g<commit>`).
A tree with uncommitted changes gets `.dirty` in the local part, so it is never taken for the tag.

Why a script and not setuptools-scm: the rule above is one `git describe` call, and the static
version in pyproject.toml then stays the one place a build reads.  A release build stamps the derived
version into pyproject.toml and the packages' `__version__` (--stamp) in its own checkout before
building; the repository keeps the last released version.  setuptools-scm would be another build
dependency (with its own hashes in image/build.lock) and would need git metadata inside every build,
including the image build, which sees the tree without .git.

    python3 scripts/release/version.py                  # the Python version (PEP 440)
    python3 scripts/release/version.py --oci            # the same as an OCI tag (no '+')
    python3 scripts/release/version.py --json           # every form, and whether it is a release
    python3 scripts/release/version.py --require-release  # exit 1 unless HEAD is a clean version tag
    python3 scripts/release/version.py --stamp pyproject.toml webhook/__init__.py
    python3 scripts/release/version.py --github-output  # version, oci_tag, release for later steps

Standard library only: the release workflow runs it before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The tags a release is cut from; the workflow's trigger (`v*.*.*`) is wider, and a tag that does not
# match here fails --require-release rather than shipping an odd version.
TAG = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-rc\.(0|[1-9]\d*))?$")
DESCRIBE = re.compile(r"^(?P<tag>.+)-(?P<count>\d+)-g(?P<sha>[0-9a-f]+)$")
# The [project] table's version line; the file is otherwise left byte for byte as it was.
PYPROJECT_VERSION = re.compile(r'^(version\s*=\s*)"[^"\n]*"', re.M)
INIT_VERSION = re.compile(r'^(__version__\s*=\s*)"[^"\n]*"', re.M)


class VersionError(Exception):
    """A version cannot be derived (or stamped); the message says why and what to do."""


@dataclass(frozen=True)
class Version:
    python: str  # PEP 440: the wheel and sdist
    oci: str  # an OCI tag ([A-Za-z0-9_.-], no '+'): the image and the bundle
    release: bool  # HEAD is exactly a version tag and the tree is clean
    tag: str | None  # the version tag it derives from
    commit: str


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30, check=False
        )
    except FileNotFoundError:
        raise VersionError("git not found on PATH; the version comes from git tags") from None


def _pyproject_version(repo: Path) -> str:
    path = repo / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise VersionError(f"{path}: cannot read the [project] version: {exc}") from None
    version = data.get("project", {}).get("version")
    if not isinstance(version, str) or not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise VersionError(f"{path}: [project] version {version!r} is not X.Y.Z")
    return version


def derive(repo: Path = ROOT) -> Version:
    """The version of the commit checked out in `repo` (see the module docstring for the rule)."""
    head = _git(repo, "rev-parse", "HEAD")
    if head.returncode != 0:
        raise VersionError(f"{repo} is not a git checkout with a commit: {head.stderr.strip()}")
    commit = head.stdout.strip()
    short = commit[:12]
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip() != ""
    local = f"g{short}" + (".dirty" if dirty else "")  # PEP 440 local part
    suffix = f"g{short}" + ("-dirty" if dirty else "")  # the same in an OCI tag
    # --match takes a glob; TAG then decides. --first-parent: a merged branch's tags do not count.
    desc = _git(
        repo,
        "describe",
        "--tags",
        "--long",
        "--abbrev=12",
        "--first-parent",
        "--match",
        "v[0-9]*.[0-9]*.[0-9]*",
    )
    m = DESCRIBE.match(desc.stdout.strip()) if desc.returncode == 0 else None
    tag = m["tag"] if m and TAG.match(m["tag"]) else None
    if tag is None:
        # No version tag reachable (a new repository, or a shallow clone without tags).
        commits = _git(repo, "rev-list", "--count", "HEAD").stdout.strip() or "0"
        base = _pyproject_version(repo)
        return Version(f"{base}.dev{commits}+{local}", f"{base}-dev.{commits}.{suffix}", False, None, commit)
    assert m is not None
    t = TAG.match(tag)
    assert t is not None
    major, minor, patch, rc = t.groups()
    count = int(m["count"])
    if count == 0 and not dirty:
        python = f"{major}.{minor}.{patch}" + (f"rc{rc}" if rc is not None else "")
        return Version(python, tag[1:], True, tag, commit)
    if count == 0:
        # The tagged commit with local changes: the tag's version, marked as not that release.
        base_py = f"{major}.{minor}.{patch}" + (f"rc{rc}" if rc is not None else "")
        return Version(f"{base_py}+g{short}.dirty", f"{tag[1:]}-g{short}-dirty", False, tag, commit)
    # After a release, the next patch; after a release candidate, the next candidate, so that a
    # development build sorts after what it was built on (PEP 440 and SemVer agree on both orders).
    if rc is None:
        nxt = f"{major}.{minor}.{int(patch) + 1}"
        return Version(f"{nxt}.dev{count}+{local}", f"{nxt}-dev.{count}.{suffix}", False, tag, commit)
    base = f"{major}.{minor}.{patch}"
    nrc = int(rc) + 1
    oci = f"{base}-rc.{nrc}.dev.{count}.{suffix}"
    return Version(f"{base}rc{nrc}.dev{count}+{local}", oci, False, tag, commit)


def stamp(version: str, paths: list[Path]) -> None:
    """Write `version` into pyproject.toml's [project] table and into `__version__` of Python files."""
    for path in paths:
        try:
            text = path.read_text()
        except OSError as exc:
            raise VersionError(f"cannot stamp {path}: {exc.strerror}") from None
        if path.name == "pyproject.toml":
            # Only the [project] table: other tables may have a `version` key of their own.
            start = re.search(r"^\[project\]\s*$", text, re.M)
            if start is None:
                raise VersionError(f"{path}: no [project] table")
            nxt = re.search(r"^\[", text[start.end() :], re.M)
            end = start.end() + nxt.start() if nxt else len(text)
            body, n = PYPROJECT_VERSION.subn(rf'\g<1>"{version}"', text[start.end() : end])
            new = text[: start.end()] + body + text[end:]
        else:
            new, n = INIT_VERSION.subn(rf'\g<1>"{version}"', text)
        if n != 1:
            raise VersionError(f"{path}: expected exactly one version line to stamp, found {n}")
        path.write_text(new)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="version.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", type=Path, default=ROOT, help="the git checkout (default: this repository)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--oci", action="store_true", help="print the OCI tag form")
    out.add_argument("--json", action="store_true", help="print every form as JSON")
    p.add_argument(
        "--require-release",
        action="store_true",
        help="exit 1 unless HEAD is exactly a vX.Y.Z tag and the tree is clean",
    )
    p.add_argument(
        "--stamp",
        nargs="+",
        type=Path,
        metavar="FILE",
        default=[],
        help="write the Python version into FILEs (pyproject.toml, __init__.py)",
    )
    p.add_argument(
        "--github-output",
        action="store_true",
        help="also append version, oci_tag and release to $GITHUB_OUTPUT",
    )
    args = p.parse_args(argv)
    try:
        v = derive(args.repo)
        if args.require_release and not v.release:
            raise VersionError(
                f"HEAD ({v.commit[:12]}) is not a release: it derives {v.python}; a release needs a "
                "tag vX.Y.Z (or vX.Y.Z-rc.N) on this very commit and no uncommitted changes"
            )
        stamp(v.python, args.stamp)
    except VersionError as exc:
        print(f"version.py: {exc}", file=sys.stderr)
        return 1
    if args.github_output:
        target = os.environ.get("GITHUB_OUTPUT")
        if not target:
            print("version.py: --github-output needs $GITHUB_OUTPUT (set by GitHub Actions)", file=sys.stderr)
            return 1
        with open(target, "a") as f:
            f.write(f"version={v.python}\noci_tag={v.oci}\nrelease={str(v.release).lower()}\n")
    print(json.dumps(asdict(v), indent=2) if args.json else (v.oci if args.oci else v.python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
