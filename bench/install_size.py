"""What `pip install draguard` costs a pull request's CI job: install size and `review` start-up.

    python bench/install_size.py [--runs N] [--json FILE]

Builds the wheel from this checkout and installs it twice into fresh virtual environments, with the
pins of constraints.txt: once as `pip install draguard` (the offline commands: review, test,
migrate, explain, lint-cel, schema, preflight, quota render) and once with the `webhook` and
`driver` extras, which is what every install pulled before the extras existed (the baseline). Both
are measured in this run: the packages' size on disk (an empty venv's pip and setuptools
subtracted), and the wall time and peak memory of `draguard --version` and of
`draguard review examples/ --inventory examples/inventory.yaml`, the runs of the two interleaved.
Needs the package index pip is configured with; without it the benchmark says so and exits 3
(skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SKIPPED = 3


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            p = Path(dirpath, f)
            if not p.is_symlink():
                total += p.stat().st_size
    return total


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def _venv(path: Path) -> None:
    res = _run([sys.executable, "-m", "venv", str(path)])
    if res.returncode != 0:
        raise SystemExit(f"python -m venv failed: {res.stderr.strip()}")


def _timed(cmd: list[str], cwd: Path) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one run, from the child's own rusage (wait4)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err)
        _pid, status, usage = os.wait4(proc.pid, 0)
        took = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in (0, 1):  # 1: review found errors, as it does on the examples
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {err.read().decode()[-500:]}")
    return took, usage.ru_maxrss


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=9, help="runs of each command per install (interleaved)")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument(
        "--before", metavar="REF",
        help="also install the wheel built from this git commit (e.g. the last before a packaging change)",
    )
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="draguard-install-") as tmp_s:
        tmp = Path(tmp_s)
        res = _run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
             str(tmp / "dist"), str(ROOT)],
        )
        if res.returncode != 0:
            raise SystemExit(f"building the wheel failed: {res.stderr.strip()[-800:]}")
        wheel = next((tmp / "dist").glob("draguard-*.whl"))
        before: Path | None = None
        if args.before:
            src = tmp / "before-src"
            src.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before], capture_output=True)
            if archive.returncode != 0:
                raise SystemExit(f"git archive {args.before}: {archive.stderr.decode().strip()}")
            subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
            res = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp / "dist-before"), str(src)])
            if res.returncode != 0:
                raise SystemExit(f"building {args.before}'s wheel failed: {res.stderr.strip()[-800:]}")
            before = next((tmp / "dist-before").glob("draguard-*.whl"))
        _venv(tmp / "empty")
        empty = _size(_site(tmp / "empty"))
        arms = {"light": str(wheel), "full": f"{wheel}[webhook,driver]"}
        if before is not None:
            arms["before"] = str(before)
        out: dict[str, Any] = {"wheel_bytes": wheel.stat().st_size, "arms": {}}
        for name, spec in arms.items():
            venv = tmp / name
            _venv(venv)
            shown = spec.replace(str(wheel), "draguard").replace(str(before), f"draguard@{args.before}")
            print(f"installing {name}: pip install {shown}", file=sys.stderr)
            res = _run(
                [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 "-c", str(ROOT / "constraints.txt"), spec],
            )
            if res.returncode != 0:
                print(f"install_size: pip could not install from the package index, skipped:\n"
                      f"{res.stderr.strip()[-600:]}", file=sys.stderr)
                return SKIPPED
            dists = _run([str(venv / "bin/python"), "-m", "pip", "list", "--format=json"]).stdout
            out["arms"][name] = {
                "bytes": _size(_site(venv)) - empty,
                "distributions": len(json.loads(dists)) - 2,  # pip, setuptools of the empty venv
                "runs": {"version": [], "review": []},
            }

        # A cwd outside the checkout, so each install runs its own copy and its shipped policies.
        work = tmp / "work"
        work.mkdir()
        commands = {
            "version": ["--version"],
            "review": [
                "review", str(ROOT / "examples"), "--inventory", str(ROOT / "examples/inventory.yaml"),
            ],
        }
        for _ in range(args.runs):
            for cmd_name, cmd_args in commands.items():
                for name in arms:
                    exe = str(tmp / name / "bin/draguard")
                    out["arms"][name]["runs"][cmd_name].append(_timed([exe, *cmd_args], work))

    print(f"wheel: {out['wheel_bytes'] / 1e6:.2f} MB; {args.runs} runs of each command per install, "
          "interleaved")
    print(f"{'install':<34}{'size MB':>9}{'dists':>7}{'version p50 s':>15}{'review p50 s':>14}"
          f"{'review p90 s':>14}{'review RSS MiB':>16}")
    rows: dict[str, dict[str, float]] = {}
    for name, arm in out["arms"].items():
        v = [t for t, _ in arm["runs"]["version"]]
        r = [t for t, _ in arm["runs"]["review"]]
        rss = max(m for _, m in arm["runs"]["review"]) / 1024
        rows[name] = {
            "size_mb": arm["bytes"] / 1e6, "distributions": arm["distributions"],
            "version_p50_s": statistics.median(v), "review_p50_s": statistics.median(r),
            "review_p90_s": _pct(r, 0.9), "review_rss_mib": rss,
        }
        label = {
            "light": "pip install draguard", "full": "draguard[webhook,driver] (baseline)",
            "before": f"draguard at {args.before}",
        }[name]
        row = rows[name]
        print(f"{label:<34}{row['size_mb']:>9.1f}{row['distributions']:>7}{row['version_p50_s']:>15.3f}"
              f"{row['review_p50_s']:>14.3f}{row['review_p90_s']:>14.3f}{row['review_rss_mib']:>16.1f}")
    light, full = rows["light"], rows["full"]
    ratios = {k: light[k] / full[k] for k in ("size_mb", "version_p50_s", "review_p50_s") if full[k]}
    print("light / baseline: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    if "before" in rows:
        old = rows["before"]
        then = {k: light[k] / old[k] for k in ("size_mb", "version_p50_s", "review_p50_s") if old[k]}
        ratios.update({f"{k}_vs_before": v for k, v in then.items()})
        print(f"light / {args.before}: " + ", ".join(f"{k} {v:.2f}" for k, v in then.items()))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "ratios": ratios}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
