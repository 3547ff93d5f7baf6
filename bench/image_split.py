"""Would a webhook-only image pay?  The shipped image against the same image without the driver's parts.

    python bench/image_split.py [--repeat 3] [--json OUT]        (root: unpacks and chroots)

Takes the draguard image the local builder made (`python -m webhook.dev.image build`; reused from the
cache), unpacks its layer and derives the webhook-only root filesystem from it: the distributions
only the DRA driver loads (grpcio, protobuf, nvidia-ml-py, found by their RECORD files) and the
driver's generated gRPC stubs are removed.  In a chroot it checks that every module the webhook,
audit and certificate pods load still imports (and that the driver's plugin no longer does), then
packs it with the same OCI packer as the real build.  Both images are measured in the same run:
compressed layer bytes (what a node pulls), unpacked bytes, time to unpack the layer (gunzip and
untar, the node's share of a pull; median of --repeat), Debian packages, Python distributions and
setuid/setgid files.  Pull time at a given link speed is bytes / speed + unpack time.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from webhook.dev import image  # noqa: E402

# Loaded only by `draguard driver run` (gRPC to the kubelet, NVML); the webhook never imports them.
DRIVER_ONLY_DISTRIBUTIONS = ("grpcio", "protobuf", "nvidia-ml-py")
DRIVER_ONLY_PATHS = ("driver/proto",)
# The webhook, audit and certs pods run `draguard serve|audit|certs`: every module of the webhook
# package (its development harness aside) must still import without the driver's parts.
IMPORT_ALL = (
    "import importlib, pkgutil, webhook\n"
    "mods = [m.name for m in pkgutil.walk_packages(webhook.__path__, 'webhook.')\n"
    "        if not m.name.startswith('webhook.dev')]\n"
    "for m in mods: importlib.import_module(m)\n"
    "print(len(mods))\n"
)
SITE = "opt/draguard/lib/python3.11/site-packages"
_CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
LINK_GBITS = (1.0, 0.1)  # a datacenter node's pull link, and a congested or cross-region one


def _layer_blob(archive: Path, work: Path) -> Path:
    with tarfile.open(archive) as tf:
        index = json.load(tf.extractfile("index.json"))  # type: ignore[arg-type]
        man = json.load(tf.extractfile("blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]))  # type: ignore[arg-type]
        name = "blobs/sha256/" + man["layers"][0]["digest"].split(":")[1]
        tf.extract(name, work, filter="data")
    return work / name


def _unpack(blob: Path, dest: Path) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    t0 = time.perf_counter()
    subprocess.run(["tar", "-C", str(dest), "--numeric-owner", "-xzf", str(blob)], check=True)
    return time.perf_counter() - t0


def _du(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            total += st.st_size
    return total


def _census(root: Path) -> dict[str, Any]:
    status = (root / "var/lib/dpkg/status").read_text()
    debs = [
        b.split("\n", 1)[0].removeprefix("Package: ")
        for b in status.split("\n\n")
        if "Status: install ok installed" in b
    ]
    dists = sorted(p.name.split("-")[0] for p in (root / SITE).glob("*.dist-info"))
    privileged = []
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            st = os.lstat(p)
            if os.path.isfile(p) and not os.path.islink(p) and st.st_mode & 0o6000:
                privileged.append("/" + os.path.relpath(p, root))
    return {
        "debian_packages": len(debs),
        "python_distributions": len(dists),
        "setuid_setgid_files": sorted(privileged),
        "unpacked_bytes": _du(root),
    }


def _remove_distribution(root: Path, name: str) -> list[str]:
    """Delete every file a distribution's RECORD lists, then its now-empty directories."""
    site = root / SITE
    norm = name.replace("-", "_").lower()
    infos = [p for p in site.glob("*.dist-info") if p.name.split("-")[0].lower() == norm]
    if len(infos) != 1:
        raise SystemExit(f"{name}: expected one dist-info in {site}, found {len(infos)}")
    removed = []
    with (infos[0] / "RECORD").open() as f:
        for row in csv.reader(f):
            path = (site / row[0]).resolve()
            if path.is_file() and site in path.parents:
                path.unlink()
                removed.append(row[0])
    for pycache in site.rglob("__pycache__"):
        if pycache.is_dir() and not any(pycache.iterdir()):
            pycache.rmdir()
    for d in sorted((p for p in site.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(d.iterdir()):
            d.rmdir()
    shutil.rmtree(infos[0], ignore_errors=True)
    return removed


def _chroot_python(root: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_CHROOT, str(root), "/opt/draguard/bin/python", "-c", code],
        capture_output=True,
        text=True,
        env={"PATH": "/opt/draguard/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
    )


def _check_webhook_only(root: Path) -> None:
    res = _chroot_python(root, IMPORT_ALL)
    if res.returncode != 0 or not res.stdout.strip().isdigit():
        raise SystemExit(f"the webhook-only root filesystem cannot import the webhook:\n{res.stderr}")
    print(f"webhook-only: all {res.stdout.strip()} webhook modules import", file=sys.stderr)
    res = subprocess.run(
        [_CHROOT, str(root), "/opt/draguard/bin/draguard", "serve", "--help"],
        capture_output=True,
        text=True,
        env={"PATH": "/opt/draguard/bin:/usr/bin:/bin"},
    )
    if res.returncode != 0 or "usage:" not in res.stdout:
        raise SystemExit(f"draguard serve --help failed in the webhook-only image:\n{res.stderr}")
    res = _chroot_python(root, "import driver.plugin")
    if res.returncode == 0:
        raise SystemExit("driver.plugin still imports: the driver's parts were not removed")


def _measure(blob: Path, work: Path, repeat: int) -> tuple[float, Path]:
    times = [_unpack(blob, work / "unpack") for _ in range(repeat)]
    return statistics.median(times), work / "unpack"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="unpack timings per image (median reported)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/image_split.py needs root (unpacks with owners, chroots)", file=sys.stderr)
        return 3  # skipped (bench/run_all.py)
    try:
        built = image.ensure_image(progress=lambda m: print(f"[image] {m}", file=sys.stderr))
    except image.ImageError as exc:
        print(f"bench/image_split.py: no draguard image to measure: {exc}", file=sys.stderr)
        return 3
    spec = image.load_recipe().draguard
    with tempfile.TemporaryDirectory(prefix="image-split-") as tmp:
        work = Path(tmp)
        full_blob = _layer_blob(built.path, work)
        full_unpack, root = _measure(full_blob, work, args.repeat)
        full = {"layer_bytes": full_blob.stat().st_size, "unpack_s": full_unpack, **_census(root)}

        removed: dict[str, int] = {}
        before = _du(root)
        for dist in DRIVER_ONLY_DISTRIBUTIONS:
            removed[dist] = len(_remove_distribution(root, dist))
        for rel in DRIVER_ONLY_PATHS:
            shutil.rmtree(root / SITE / rel)
        removed_bytes = before - _du(root)
        _check_webhook_only(root)
        wh_archive = work / "webhook.oci.tar"
        image.write_oci_archive(root, spec, wh_archive)
        wh_dir = work / "wh"
        wh_dir.mkdir()
        wh_blob = _layer_blob(wh_archive, wh_dir)
        wh_unpack, wh_root = _measure(wh_blob, wh_dir, args.repeat)
        webhook = {"layer_bytes": wh_blob.stat().st_size, "unpack_s": wh_unpack, **_census(wh_root)}

    out: dict[str, Any] = {
        "image": str(built.path.name),
        "full": full,
        "webhook_only": webhook,
        "removed_files": removed,
        "removed_unpacked_bytes": removed_bytes,
        "layer_ratio": webhook["layer_bytes"] / full["layer_bytes"],
    }
    print(f"{'':32}{'full image':>14}{'webhook-only':>14}{'ratio':>8}")
    for key, unit, scale in (
        ("layer_bytes", "MB", 1e6),
        ("unpacked_bytes", "MB", 1e6),
        ("unpack_s", "s", 1.0),
    ):
        a, b = full[key] / scale, webhook[key] / scale
        print(f"{key + ' (' + unit + ')':32}{a:14.1f}{b:14.1f}{b / a:8.2f}")
    for gbit in LINK_GBITS:
        a = full["layer_bytes"] * 8 / (gbit * 1e9) + full["unpack_s"]
        b = webhook["layer_bytes"] * 8 / (gbit * 1e9) + webhook["unpack_s"]
        out[f"pull_s_at_{gbit:g}gbit"] = {"full": a, "webhook_only": b}
        print(f"{f'pull at {gbit:g} Gbit/s (s)':32}{a:14.1f}{b:14.1f}{b / a:8.2f}")
    for key in ("debian_packages", "python_distributions"):
        print(f"{key:32}{full[key]:14d}{webhook[key]:14d}")
    print(f"{'setuid/setgid files':32}{len(full['setuid_setgid_files']):14d}"
          f"{len(webhook['setuid_setgid_files']):14d}")  # fmt: skip
    gone = [f"{k} ({v} files)" for k, v in removed.items()] + list(DRIVER_ONLY_PATHS)
    print(f"removed: {', '.join(gone)}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
