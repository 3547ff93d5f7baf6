#!/usr/bin/env python3
"""The release workflow's build steps on this machine: what a tag would publish, minus pushing and signing.

    .venv/bin/python scripts/release/build.py [--out dist/release] [--no-image]

1. the version from git tags (version.py), as the workflow's `version` job derives it;
2. the sdist and the wheel of that version (dist.py), as the `python` job builds them;
3. the image as an OCI archive: the local image build (`make image`, webhook.dev.image) rather than
   BuildKit, reused from its cache when the recipe and the sources are unchanged (a first build needs
   root and debootstrap, 10-20 minutes); --no-image leaves it out;
4. the Kustomize bundle as an OCI layout and archive (bundle.py) whose image is pinned to that
   archive's digest, as the `bundle` job pins the pushed image's, then read back by Flux's and Argo CD's
   rules (tools/ocibundle check, built on first use by scripts/build-tools.sh);
5. SHA256SUMS over everything, the file attached to the GitHub release.

Prints one JSON document: the version and every file with its digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bundle  # this directory, not an installed package
import dist
import version as versions

ROOT = Path(__file__).resolve().parents[2]


class BuildError(Exception):
    """A step failed; the message names it and says why."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def image_archive(out: Path, oci_version: str) -> tuple[Path, str]:
    """The local image build's draguard archive (built or reused), linked into `out`, and its digest."""
    res = subprocess.run(
        [sys.executable, "-m", "webhook.dev.image", "build", "--print-path"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise BuildError(
            f"image: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else 'failed'} "
            "(--no-image leaves the image out)"
        )
    paths = [Path(p) for p in res.stdout.split() if Path(p).name.startswith("draguard-")]
    if len(paths) != 1:
        raise BuildError(f"image: expected one draguard archive from the image build, got {res.stdout!r}")
    with tarfile.open(paths[0]) as tf:
        member = tf.extractfile("index.json")
        if member is None:
            raise BuildError(f"{paths[0]}: no index.json; not an OCI image archive")
        digest = str(json.load(member)["manifests"][0]["digest"])
    dst = out / f"draguard-image-{oci_version}.oci.tar"
    dst.unlink(missing_ok=True)
    try:
        os.link(paths[0], dst)  # 100 MB: a hard link where the cache is on the same file system
    except OSError:
        shutil.copyfile(paths[0], dst)
    return dst, digest


def check_bundle(layout: Path) -> list[dict[str, object]]:
    script = ROOT / "scripts" / "build-tools.sh"
    built = subprocess.run(["bash", str(script), "ocibundle"], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        raise BuildError(f"tools/ocibundle: {built.stderr.strip() or built.stdout.strip()}")
    tool = subprocess.run(
        ["bash", str(script), "--path", "ocibundle"], capture_output=True, text=True, check=True
    ).stdout.strip()
    res = subprocess.run([tool, "check", str(layout)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise BuildError(f"bundle: {res.stderr.strip()}")
    return list(json.loads(res.stdout))


def run(out: Path, with_image: bool) -> dict[str, object]:
    v = versions.derive(ROOT)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    summary: dict[str, object] = {
        "version": v.python,
        "oci_tag": v.oci,
        "release": v.release,
        "commit": v.commit,
    }
    summary["python"] = dist.build(out, v.python)
    image_ref = None
    if with_image:
        archive, digest = image_archive(out, v.oci)
        image_ref = f"{bundle.IMAGE_NAME}@{digest}"
        summary["image"] = {"archive": str(archive), "digest": digest}
    created = bundle.commit_time(ROOT)
    b = bundle.build(
        out,
        tree=ROOT / "kustomize",
        version=v.oci,
        commit=v.commit,
        created=created,
        source=bundle.DEFAULT_SOURCE,
        image=image_ref,
    )
    b["checked"] = [
        {"name": r["name"], "digest": r["digest"], "files": len(r["files"])}  # type: ignore[arg-type]
        for r in check_bundle(Path(str(b["layout"])))
    ]
    summary["bundle"] = b
    sums = [f"{_sha256(p)}  {p.name}" for p in sorted(out.iterdir()) if p.is_file()]
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    summary["sha256sums"] = str(out / "SHA256SUMS")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="build.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "dist" / "release", help="output directory (replaced)")
    p.add_argument("--no-image", action="store_true", help="leave the image archive out")
    args = p.parse_args(argv)
    try:
        summary = run(args.out, not args.no_image)
    except (BuildError, bundle.BundleError, dist.DistError, versions.VersionError) as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
