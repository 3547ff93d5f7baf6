#!/usr/bin/env python3
"""The Kustomize bundle (kustomize/) as an OCI artifact, written as an OCI image layout.

One gzipped tar of the kustomize/ tree (base, overlays, components, uninstall.sh) is the content; two
manifests point at that same blob, because the two GitOps engines read different layer media types:

- `flux`:   config application/vnd.cncf.flux.config.v1+json, layer
            application/vnd.cncf.flux.content.v1.tar+gzip and the source/revision/created annotations:
            what `flux push artifact` writes, so an OCIRepository, `flux pull artifact` and
            `flux diff artifact` read it as their own.
- `argocd`: the same config and blob with layer type application/vnd.oci.image.layer.v1.tar+gzip.
            Argo CD's OCI source takes exactly one content layer and, by default, only that type (or
            Helm's); it refuses the Flux type unless the repo-server is reconfigured.
Flux's source-controller takes the first layer whatever its type, so it could read the argocd manifest
too; the flux one exists for Flux's own tools and for layerSelector.mediaType.

The layout directory's index.json names them `flux` and `argocd` (org.opencontainers.image.ref.name);
tools/ocibundle pushes each to its repository.  The tar is reproducible: sorted entries, owner 0,
modification time the commit's (or $SOURCE_DATE_EPOCH), gzip without name or time, so the same commit
gives the same digests on any machine.

    python3 scripts/release/bundle.py --out dist [--image ghcr.io/OWNER/draguard@sha256:...]
        [--version 1.2.3] [--source https://github.com/OWNER/draguard]

--image pins the bundle's draguard image (base/kustomization.yaml `images:`) in the artifact only; the
repository's tree is never changed.  Standard library only (the release workflow runs it bare).
Prints one JSON document: the files written and each manifest's digest.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import version as versions  # this directory, not an installed package

ROOT = Path(__file__).resolve().parents[2]
IMAGE_NAME = "ghcr.io/draguard/draguard"  # the name the bundle's manifests use (kustomize images:)
DEFAULT_SOURCE = os.environ.get("DRAGUARD_SOURCE_URL", "https://github.com/draguard/draguard")
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
FLUX_CONFIG = "application/vnd.cncf.flux.config.v1+json"
FLUX_CONTENT = "application/vnd.cncf.flux.content.v1.tar+gzip"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_TYPES = {"flux": FLUX_CONTENT, "argocd": OCI_LAYER}
# Not content: caches and the maintainer's script that copies policies/ into base/policies.
SKIP = re.compile(r"(^|/)(__pycache__|\.[^/]*)(/|$)|^sync-policies\.py$")
# Bounds on what is packed: the tree is a few hundred small files; anything far larger is a mistake.
MAX_FILES = 5000
MAX_BYTES = 64 << 20
DIGEST_REF = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._/:-]*[a-z0-9])@(?P<digest>sha256:[0-9a-f]{64})$")
TAG_REF = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._/:-]*?[a-z0-9]):(?P<tag>\w[\w.-]{0,127})$", re.A)


class BundleError(Exception):
    """The bundle cannot be built; the message says why."""


def _files(tree: Path) -> Iterator[Path]:
    count = size = 0
    for path in sorted(tree.rglob("*")):
        rel = path.relative_to(tree).as_posix()
        if SKIP.search(rel) or path.is_dir():
            continue
        if path.is_symlink() or not path.is_file():
            # Flux's and Argo CD's extractors both refuse or drop links; the bundle must not need one.
            raise BundleError(f"{path}: only regular files can go in the bundle (links are not extracted)")
        count += 1
        size += path.stat().st_size
        if count > MAX_FILES or size > MAX_BYTES:
            raise BundleError(f"{tree}: more than {MAX_FILES} files or {MAX_BYTES >> 20} MiB; not a bundle")
        yield path


def pin_image(kustomization: str, image: str) -> str:
    """base/kustomization.yaml with the draguard image entry set to `image` (name@digest or name:tag)."""
    m = DIGEST_REF.match(image) or TAG_REF.match(image)
    if m is None:
        raise BundleError(f"--image {image!r}: expected NAME@sha256:<64 hex> or NAME:TAG")
    # The entry as the repository writes it: `- name: <IMAGE_NAME>` followed by its own keys.
    name = re.escape(IMAGE_NAME)
    entry = re.compile(rf"^(?P<indent>[ \t]*)- name: {name}[ \t]*\n(?:(?P=indent)  [^\n]*\n?)*", re.M)
    found = list(entry.finditer(kustomization))
    if len(found) != 1:
        raise BundleError(
            f"kustomize/base/kustomization.yaml: expected one images entry for {IMAGE_NAME}, "
            f"found {len(found)}"
        )
    ind = found[0]["indent"]
    lines = [f"{ind}- name: {IMAGE_NAME}", f"{ind}  newName: {m['name']}"]
    pin = f"digest: {m['digest']}" if "digest" in m.groupdict() else f"newTag: {m['tag']}"
    lines.append(f"{ind}  {pin}")
    start, end = found[0].span()
    return kustomization[:start] + "\n".join(lines) + "\n" + kustomization[end:]


def layer_bytes(tree: Path, mtime: int, image: str | None) -> bytes:
    """The gzipped tar of `tree`, byte for byte the same for the same files, image and time."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        dirs: set[str] = set()
        for path in _files(tree):
            rel = path.relative_to(tree).as_posix()
            # Parent directories first, each once, so extractors need not invent them.
            parts = rel.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
                    tf.addfile(info)
            data = path.read_bytes()
            if image is not None and rel == "base/kustomization.yaml":
                data = pin_image(data.decode(), image).encode()
            info = tarfile.TarInfo(rel)
            info.size, info.mtime = len(data), mtime
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            tf.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def _blob(layout: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _json(obj: object) -> bytes:
    # Compact and key-sorted: the manifest digest is a digest of exactly these bytes.
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build(
    out: Path, *, tree: Path, version: str, commit: str, created: int, source: str, image: str | None
) -> dict[str, object]:
    """Write the layout directory, its tar and the plain content tar.gz under `out`; return a summary."""
    name = f"draguard-bundle-{version}"
    layout = out / f"{name}.oci"
    if layout.exists():
        raise BundleError(f"{layout} exists; remove it or choose another --out")
    layout.mkdir(parents=True)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    content = layer_bytes(tree, created, image)
    layer = _blob(layout, content)
    # Flux writes no configuration content; an empty JSON object is the OCI spec's empty config.
    config = {"mediaType": FLUX_CONFIG, **_blob(layout, b"{}")}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))
    annotations = {
        # Flux reads source and revision (`flux pull/list artifacts`), Argo CD shows all of these.
        "org.opencontainers.image.source": source,
        "org.opencontainers.image.revision": f"{version}@sha1:{commit}",
        "org.opencontainers.image.created": stamp,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.title": "draguard-bundle",
        "org.opencontainers.image.description": "draguard Kustomize bundle: base, overlays (aks, gke, eks, "
        "local) and components",
        "org.opencontainers.image.licenses": "Apache-2.0",
    }
    manifests = []
    digests: dict[str, str] = {}
    for ref, layer_type in LAYER_TYPES.items():
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": config,
            "layers": [{"mediaType": layer_type, **layer}],
            "annotations": annotations,
        }
        desc = _blob(layout, _json(manifest))
        digests[ref] = str(desc["digest"])
        manifests.append(
            {"mediaType": MANIFEST, **desc, "annotations": {"org.opencontainers.image.ref.name": ref}}
        )
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}
    (layout / "index.json").write_bytes(_json(index))
    # The layout as one file (the release asset; `oras cp --from-oci-layout` reads it), and the content
    # itself for people who want the tree without an OCI client (sha256 = the layer digest).
    archive = out / f"{name}.oci.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tf:
        for path in sorted(layout.rglob("*")):
            info = tf.gettarinfo(str(path), arcname=path.relative_to(layout).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = created, 0, 0, "", ""
            if path.is_file():
                with path.open("rb") as f:
                    tf.addfile(info, f)
            else:
                tf.addfile(info)
    plain = out / f"{name}.tar.gz"
    plain.write_bytes(content)
    return {
        "layout": str(layout),
        "archive": str(archive),
        "content": str(plain),
        "layer": layer["digest"],
        "manifests": digests,
        "image": image,
    }


def commit_time(repo: Path) -> int:
    if os.environ.get("SOURCE_DATE_EPOCH", "").isdigit():
        return int(os.environ["SOURCE_DATE_EPOCH"])
    res = subprocess.run(
        ["git", "-C", str(repo), "show", "-s", "--format=%ct", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return int(res.stdout.strip()) if res.returncode == 0 and res.stdout.strip().isdigit() else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bundle.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the layout and the archives")
    p.add_argument("--image", help="pin the draguard image: NAME@sha256:DIGEST (a release) or NAME:TAG")
    p.add_argument("--version", help="the bundle's version (default: scripts/release/version.py --oci)")
    p.add_argument(
        "--source", default=DEFAULT_SOURCE, help="the source repository URL recorded in the annotations"
    )
    p.add_argument("--tree", type=Path, default=ROOT / "kustomize", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        v = versions.derive(ROOT)
        summary = build(
            args.out,
            tree=args.tree,
            version=args.version or v.oci,
            commit=v.commit,
            created=commit_time(ROOT),
            source=args.source,
            image=args.image,
        )
    except (BundleError, versions.VersionError) as exc:
        print(f"bundle.py: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"bundle.py: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
