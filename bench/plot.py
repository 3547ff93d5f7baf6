"""Draw the benchmark figures into docs/ (matplotlib, Agg backend; no display needed).

    python bench/plot.py [--results bench/results] [--out docs]

Reads the JSON written by bench/scaling.py (--json) and bench/webhook_concurrency.py (--json), as
bench/run_all.py leaves them in bench/results/, and writes:
  docs/latency-vs-inventory.png   admission p50/p99 and CEL lint time against the device count
  docs/latency-vs-load.png        p50/p99 and throughput against concurrent connections
Missing inputs are skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]


def plot_inventory(data: dict[str, Any], out: Path) -> Path:
    rows = sorted(data["by_devices"], key=lambda r: r["devices"])
    x = [r["devices"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    ax.plot(x, [r["p50_ms"] for r in rows], "o-", label="admission p50")
    ax.plot(x, [r["p99_ms"] for r in rows], "s--", label="admission p99")
    ax.plot(x, [r["cel_lint_ms"] for r in rows], "^:", label="CEL lint (one selector)")
    if all("cold_ms" in r for r in rows):
        ax.plot(
            x,
            [r["cold_ms"]["claim"] for r in rows],
            "v-.",
            label="first claim review after an inventory swap",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("devices in the inventory")
    ax.set_ylabel("milliseconds")
    pol = rows[0]["policies"] if rows else "?"
    ax.set_title(f"draguard request path in-process, one core, {pol} policies")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "latency-vs-inventory.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_load(data: dict[str, Any], out: Path) -> Path:
    rows = [r for r in data["rows"] if r["workers"] == 1]
    rows.sort(key=lambda r: r["connections"])
    two = [r for r in data["rows"] if r["workers"] == 2]
    x = [r["connections"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    ax.plot(x, [r["p50_ms"] for r in rows], "o-", label="p50 (1 worker)")
    ax.plot(x, [r["p99_ms"] for r in rows], "s--", label="p99 (1 worker)")
    for r in two:
        ax.plot([r["connections"]], [r["p99_ms"]], "D", label=f"p99 (2 workers, {r['connections']} conns)")
    ax.set_xscale("log")
    ax.set_xlabel("concurrent TLS connections")
    ax.set_ylabel("latency, ms")
    ax2 = ax.twinx()
    ax2.plot(x, [r["rps"] for r in rows], "k^:", label="req/s (1 worker)")
    for r in two:
        ax2.plot([r["connections"]], [r["rps"]], "kv", label="req/s (2 workers)")
    ax2.set_ylabel("requests per second")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    ax.set_title("draguard serve under load (closed loop)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = out / "latency-vs-load.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    made = []
    for name, fn in (("scaling.json", plot_inventory), ("webhook_concurrency.json", plot_load)):
        src = args.results / name
        if not src.exists():
            print(f"plot: {src} not found; run the benchmark with --json first", file=sys.stderr)
            continue
        made.append(fn(json.loads(src.read_text()), args.out))
    for p in made:
        print(f"wrote {p}")
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
