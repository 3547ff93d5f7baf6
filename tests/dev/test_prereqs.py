"""scripts/prereqs.sh: `make demo` and `make test` say what a fresh machine lacks before any build starts."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "prereqs.sh"


def _run(path_dirs: list[Path], mode: str = "test") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PATH"}
    env["PATH"] = os.pathsep.join([*(str(d) for d in path_dirs), os.environ.get("PATH", "")])
    return subprocess.run(["bash", str(SCRIPT), mode], capture_output=True, text=True, env=env, timeout=60)


def _fake(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    f = bin_dir / name
    f.write_text(f"#!/bin/sh\n{body}\n")
    f.chmod(0o755)


def test_an_old_go_is_refused_with_the_version_needed(tmp_path: Path) -> None:
    _fake(tmp_path / "bin", "go", "echo go1.19.8")
    r = _run([tmp_path / "bin"])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "go is go1.19.8" in r.stdout
    assert "Go >= 1.26" in r.stdout


def test_a_missing_library_names_the_package_and_the_command(tmp_path: Path) -> None:
    # dpkg-query answers "not installed" for libseccomp-dev only; apt-get is shadowed so nothing installs.
    _fake(
        tmp_path / "bin",
        "dpkg-query",
        'for a; do last=$a; done; [ "$last" = libseccomp-dev ] && exit 1; printf "install ok installed"',
    )
    _fake(tmp_path / "bin", "apt-get", "echo apt-get must not be reached in this test >&2; exit 100")
    r = _run([tmp_path / "bin"])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "libseccomp-dev" in r.stdout
    # As root the script tries apt-get (failing here), then prints the exact command; else only prints it.
    assert "apt-get install -y libseccomp-dev" in r.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the check for a machine with every prerequisite runs as root")
def test_this_machine_has_every_prerequisite() -> None:
    if shutil.which("go") is None:
        pytest.fail("go is not on PATH on a machine that runs the test suite", pytrace=False)
    r = _run([])
    assert r.returncode == 0, r.stdout + r.stderr


def test_make_demo_and_test_check_prerequisites_before_building() -> None:
    for goal, mode in (("test", "test"), ("demo", "demo")):
        r = subprocess.run(
            ["make", "-s", "-n", "--no-print-directory", goal],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        first = r.stdout.splitlines()[0]
        assert first == f"bash scripts/prereqs.sh {mode}", r.stdout[:500]


def test_an_unknown_mode_is_a_usage_error() -> None:
    r = _run([], mode="deploy")
    assert r.returncode == 2
    assert "usage: scripts/prereqs.sh demo|test" in r.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot and mount namespaces need root")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_a_plain_chroot_is_refused_because_exec_would_land_in_the_outer_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    # A root on a tmpfs of its own (so its / differs from the machine's) with the machine's programs,
    # libraries, /proc and /dev bound in, and this checkout at its own path; built and entered in a
    # private mount namespace, so nothing outlives the test. apt-get is shadowed: dpkg sees no packages
    # there, and the check must not try to install them.
    script = f"""
set -e
r={root}
mount -t tmpfs draguard-chroot-test "$r"
for d in usr bin sbin lib lib32 lib64 libx32 etc proc sys dev; do
    if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$r/$d"
    elif [ -d "/$d" ]; then mkdir -p "$r/$d" && mount --rbind "/$d" "$r/$d"
    fi
done
mkdir -p "$r{ROOT}" "$r/tmp" "$r/home" "$r/fakebin" && mount --bind "{ROOT}" "$r{ROOT}"
printf '#!/bin/sh\necho apt-get must not run here >&2; exit 100\n' > "$r/fakebin/apt-get"
chmod +x "$r/fakebin/apt-get"
exec chroot "$r" /usr/bin/env HOME=/home PATH="/fakebin:$PATH" bash "{SCRIPT}" test
"""
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "this is a chroot" in r.stdout, r.stdout + r.stderr
    assert "pivot_root" in r.stdout
