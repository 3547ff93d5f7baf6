"""The local node's images, built without a daemon or a registry, and where the node's binaries are.

`ensure_image()` builds the draguard image from image/recipe.toml the way the Containerfile does: a
Debian root filesystem (debootstrap --variant=minbase), image/install.sh's steps run in it (Debian
packages, the project wheel and its pinned dependencies in /opt/draguard), packed as an OCI
image-layout tar that `ctr -n k8s.io images import` accepts.  `ensure_pause_image()` packs Debian's
static busybox as the pod sandbox image.  Results are cached under ~/.cache/draguard/images, keyed
by the recipe and the project sources.  Building needs root (debootstrap, chroot) and network access
to the Debian mirror apt uses and to the Python package index.

    python -m webhook.dev.image build [--pause] [--force]
    python -m webhook.dev.image containerfile [--check]
    python -m webhook.dev.image node-dir
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .. import __version__

REPO_ROOT = Path(__file__).resolve().parents[2]
RECIPE_DIR = REPO_ROOT / "image"
RECIPE = RECIPE_DIR / "recipe.toml"
INSTALL_SH = RECIPE_DIR / "install.sh"
CONTAINERFILE = REPO_ROOT / "Containerfile"
# What the wheel and the venv step need from the source tree (the Containerfile binds the whole context).
# What the wheel is built from (setup.py maps webhook/, driver/ and the default policies under draguard/).
SOURCES = (
    "pyproject.toml", "setup.py", "README.md", "LICENSE", "constraints.txt", "draguard", "webhook", "driver",
    "policies",
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
ARCH = "amd64"
NODE_BINARIES = ("kubelet", "kube-proxy", "containerd", "ctr", "containerd-shim-runc-v2", "runc", "crictl")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")

Progress = Callable[[str], None]


class ImageError(Exception):
    """An image could not be built or a prerequisite is missing; the message says what to do."""


def _say(msg: str) -> None:
    print(f"[image {time.strftime('%H:%M:%S', time.gmtime())}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The recipe


@dataclass(frozen=True)
class ImageSpec:
    """One image of image/recipe.toml: what goes in and how it runs."""

    repository: str
    tag: str
    packages: tuple[str, ...]
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    build_packages: tuple[str, ...] = ()
    suite: str = "bookworm"
    base: str = ""
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    copy: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.repository}:{self.tag}"


@dataclass(frozen=True)
class Recipe:
    draguard: ImageSpec
    pause: ImageSpec


def _strs(table: dict[str, Any], key: str, where: str, *, required: bool = True) -> tuple[str, ...]:
    val = table.get(key, None if required else [])
    if not isinstance(val, list) or not all(isinstance(v, str) for v in val):
        raise ImageError(f"{where}.{key}: expected a list of strings, got {val!r}")
    return tuple(val)


def _str(table: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    val = table.get(key, default)
    if not isinstance(val, str) or not val:
        raise ImageError(f"{where}.{key}: expected a non-empty string, got {val!r}")
    return val


def _table(table: dict[str, Any], key: str, where: str) -> dict[str, str]:
    val = table.get(key, {})
    if not isinstance(val, dict) or not all(isinstance(v, str) for v in val.values()):
        raise ImageError(f"{where}.{key}: expected a table of strings")
    return dict(val)


# A base image by tag can change under the same recipe; by digest it names fixed bytes.
_PINNED_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/-]*(?::[0-9]+)?/[a-z0-9._/-]+:[\w.-]+@sha256:[0-9a-f]{64}$")


def _base(table: dict[str, Any], where: str) -> str:
    """The Containerfile's base image: optional, but when given it is pinned `name:tag@sha256:<digest>`."""
    val = table.get("base", "")
    if not isinstance(val, str):
        raise ImageError(f"{where}.base: expected a string, got {val!r}")
    if val and not _PINNED_IMAGE.match(val):
        raise ImageError(
            f"{where}.base: {val!r} is not pinned; write it as registry/name:tag@sha256:<64 hex digits> "
            "(the digest of the tag's multi-arch index: crane digest NAME:TAG)"
        )
    return val


def _spec(data: dict[str, Any], section: str, path: Path, default_tag: str | None) -> ImageSpec:
    where = f"{path}: [{section}]"
    t = data.get(section)
    if not isinstance(t, dict):
        raise ImageError(f"{path}: missing the [{section}] table")
    copy = []
    for item in t.get("copy", []):
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(s, str) for s in item)):
            raise ImageError(f"{where}.copy: each entry is [source in the repository, path in the image]")
        src, dest = item
        if Path(src).is_absolute() or ".." in Path(src).parts or not dest.startswith("/"):
            raise ImageError(
                f"{where}.copy: {item!r}: source must be relative to the repository, dest absolute"
            )
        copy.append((src, dest))
    return ImageSpec(
        repository=_str(t, "repository", where),
        tag=_str(t, "tag", where, default_tag),
        packages=_strs(t, "packages", where),
        build_packages=_strs(t, "build_packages", where, required=False),
        suite=_str(t, "suite", where, "bookworm"),
        base=_base(t, where),
        user=_str(t, "user", where),
        entrypoint=_strs(t, "entrypoint", where),
        cmd=_strs(t, "cmd", where, required=False),
        env=_table(t, "env", where),
        labels=_table(t, "labels", where),
        copy=tuple(copy),
    )


def load_recipe(path: Path = RECIPE) -> Recipe:
    """Read image/recipe.toml; a malformed file is an ImageError naming the file and the key."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ImageError(f"{path}: cannot read the image recipe: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ImageError(f"{path}: not valid TOML: {exc}") from None
    return Recipe(draguard=_spec(data, "draguard", path, __version__), pause=_spec(data, "pause", path, None))


# ---------------------------------------------------------------------------------------------
# Front end 1: the Containerfile, generated from the recipe


def _json_list(items: Iterable[str]) -> str:
    return json.dumps(list(items))


# Hashed locks (scripts/lock-image.sh): the runtime dependencies and the build backend.
LOCK = "image/requirements.lock"
BUILD_LOCK = "image/build.lock"
# Where the sbom step writes the image's CycloneDX SBOM.
SBOM_IN_IMAGE = "/usr/share/draguard/sbom.cdx.json"
# Where both front ends put the source tree while the install steps run.
SRC_IN_IMAGE = "/tmp/src"
INSTALL_IN_IMAGE = f"{SRC_IN_IMAGE}/image/install.sh"


def install_steps(spec: ImageSpec) -> list[tuple[str, ...]]:
    """image/install.sh's invocations, in order; the Containerfile and the local builder run these."""
    return [
        ("packages", *spec.build_packages, *spec.packages),
        ("wheel", SRC_IN_IMAGE, "/tmp/wheels"),
        ("venv", "/tmp/wheels", f"{SRC_IN_IMAGE}/{LOCK}"),
        ("finish", *spec.build_packages),
        ("sbom", SRC_IN_IMAGE, spec.repository, spec.tag),
    ]


def render_containerfile(recipe: Recipe) -> str:
    """The Containerfile for the draguard image: the same packages, install steps and runtime config."""
    s = recipe.draguard
    runs = [f"sh {INSTALL_IN_IMAGE} {' '.join(step)}" for step in install_steps(s)]
    lines = [
        "# GENERATED from image/recipe.toml by `python -m webhook.dev.image containerfile`; edit the recipe.",
        "# draguard image: webhook (`draguard serve`), certificates (`draguard certs`) and the DRA driver",
        f"# (`draguard driver run`). Build: podman build -t {s.name} -f Containerfile .",
        "# The same recipe builds it without a daemon: python -m webhook.dev.image build",
        "#",
        "# Debian packages, then image/install.sh in the image itself: the project wheel (build backend from",
        "# image/build.lock) and its dependencies from image/requirements.lock, both with --require-hashes,",
        "# in /opt/draguard; pip and the build-only packages are removed, a CycloneDX SBOM is written to",
        f"# {SBOM_IN_IMAGE}. The source tree is bind-mounted for that step, so no layer holds it.",
        f"ARG BASE_IMAGE={s.base}",
        "FROM ${BASE_IMAGE}",
        "LABEL " + " \\\n      ".join(f"{k}={json.dumps(v)}" for k, v in s.labels.items()),
        f"RUN --mount=type=bind,target={SRC_IN_IMAGE} \\\n    " + " \\\n && ".join(runs),
    ]
    for src, dest in s.copy:
        lines.append(f"COPY {src} {dest}")
    if s.env:
        lines.append("ENV " + " \\\n    ".join(f"{k}={v}" for k, v in s.env.items()))
    lines.append(f"USER {s.user}")
    lines.append(f"ENTRYPOINT {_json_list(s.entrypoint)}")
    lines.append(f"CMD {_json_list(s.cmd)}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Front end 2: the local builder


def debian_mirrors(sources: Sequence[Path] | None = None) -> tuple[str, str]:
    """(main, security) Debian mirror URLs apt uses here; $DRAGUARD_DEBIAN_MIRROR overrides the main one."""
    if sources is None:
        d = Path("/etc/apt")
        sources = [
            d / "sources.list",
            *sorted((d / "sources.list.d").glob("*.sources")),
            *sorted((d / "sources.list.d").glob("*.list")),
        ]
    main = security = ""
    for f in sources:
        try:
            text = f.read_text()
        except OSError:
            continue
        for url in re.findall(r"^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, re.M):
            url = url.rstrip("/")
            if url.endswith("/debian-security") and not security:
                security = url
            elif url.endswith("/debian") and not main:
                main = url
    main = os.environ.get("DRAGUARD_DEBIAN_MIRROR") or main or DEFAULT_MIRROR
    return main, security or DEFAULT_SECURITY_MIRROR


def image_cache_dir() -> Path:
    env = os.environ.get("DRAGUARD_IMAGE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "draguard" / "images"


@contextlib.contextmanager
def _locked(cache: Path, name: str) -> Iterator[None]:
    """One builder per cache entry: work trees, test runs and CI may share the cache."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _prune(cache: Path, pattern: str, keep: int) -> None:
    """Keep the newest `keep` archives of one image (other work trees may still use those)."""
    old = sorted(cache.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)[keep:]
    for p in old:
        p.unlink(missing_ok=True)
        for suffix in (".log", ".cdx.json"):
            p.with_name(p.name.removesuffix(".oci.tar") + suffix).unlink(missing_ok=True)


@dataclass(frozen=True)
class BuiltImage:
    """An OCI archive in the cache: `ctr -n k8s.io images import <path>` makes `name` available."""

    name: str
    path: Path
    digest: str  # the manifest's, as `ctr images ls` shows it

    @property
    def sbom(self) -> Path:
        """The image's CycloneDX SBOM next to the archive (also in the image at SBOM_IN_IMAGE)."""
        return self.path.with_name(self.path.name.removesuffix(".oci.tar") + ".cdx.json")


def _hash_tree(h: Any, root: Path, rel: str) -> None:
    p = root / rel
    if p.is_file():
        h.update(f"F {rel}\n".encode())
        h.update(p.read_bytes())
        return
    for sub in sorted(p.rglob("*")):
        if (
            sub.is_file()
            and "__pycache__" not in sub.parts
            and sub.suffix != ".pyc"
            and not any(part.endswith(".egg-info") for part in sub.parts)
        ):
            h.update(f"F {sub.relative_to(root)}\n".encode())
            h.update(sub.read_bytes())


def draguard_key(recipe: Recipe, mirrors: tuple[str, str], root: Path = REPO_ROOT) -> str:
    """Cache key of the draguard image: the recipe, the install steps, this builder and the sources."""
    h = hashlib.sha256()
    h.update(repr((recipe.draguard, mirrors)).encode())
    for rel in ("image", "webhook/dev/image.py", *SOURCES, *(src for src, _ in recipe.draguard.copy)):
        _hash_tree(h, root, rel)
    return h.hexdigest()[:16]


def _run(
    cmd: Sequence[str], what: str, *, env: dict[str, str] | None = None, log: Path | None = None
) -> None:
    """Run a build command; on failure the error names the step and shows the end of its output."""
    res = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    out = res.stdout.decode(errors="replace")
    if log is not None:
        with log.open("a") as f:
            f.write(f"$ {' '.join(cmd)}\n{out}\n")
    if res.returncode != 0:
        tail = "\n".join(out.splitlines()[-25:])
        raise ImageError(f"{what} failed (exit {res.returncode}):\n{tail}")


def _check_builder() -> None:
    if os.geteuid() != 0:
        raise ImageError("building an image needs root (debootstrap and chroot); run it as root")
    for tool, pkg in (("debootstrap", "debootstrap"), ("unshare", "util-linux"), ("chroot", "coreutils")):
        if shutil.which(tool) is None:
            raise ImageError(f"{tool} not found: apt-get install -y {pkg}")


def _sources_list(suite: str, mirrors: tuple[str, str]) -> str:
    """The apt sources of Debian's own bookworm images, pointed at the mirror this machine uses."""
    main, security = mirrors
    return (
        f"Types: deb\nURIs: {main}\nSuites: {suite} {suite}-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        f"Types: deb\nURIs: {security}\nSuites: {suite}-security\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )


def _base_rootfs(
    spec: ImageSpec, mirrors: tuple[str, str], cache: Path, progress: Progress, log: Path
) -> Path:
    """debootstrap's minbase system as a tar in the cache (the slow part; shared by source changes)."""
    key = hashlib.sha256(repr(("minbase", spec.suite, ARCH, mirrors[0])).encode()).hexdigest()[:16]
    tar = cache / f"base-{spec.suite}-{key}.tar"
    with _locked(cache, f"base-{key}"):
        if not tar.is_file():
            _debootstrap(spec, mirrors, tar, progress, log)
    return tar


def _debootstrap(spec: ImageSpec, mirrors: tuple[str, str], tar: Path, progress: Progress, log: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=".base-", dir=tar.parent))
    try:
        t0 = time.monotonic()
        progress(f"debootstrap --variant=minbase {spec.suite} from {mirrors[0]}")
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--arch={ARCH}",
                spec.suite,
                str(work / "rootfs"),
                mirrors[0],
            ],
            "debootstrap",
            log=log,
        )
        _run(
            [
                "tar",
                "-C",
                str(work / "rootfs"),
                "--numeric-owner",
                "--xattrs",
                "-cf",
                str(work / "base.tar"),
                ".",
            ],
            "packing the base root filesystem",
            log=log,
        )
        os.replace(work / "base.tar", tar)
        progress(f"base root filesystem in {time.monotonic() - t0:.0f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _host_ca_bundle() -> Path | None:
    for cand in (
        os.environ.get("PIP_CERT"),
        os.environ.get("SSL_CERT_FILE"),
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if cand and Path(cand).is_file():
            return Path(cand)
    return None


def _chroot(rootfs: Path, args: Sequence[str], what: str, log: Path) -> None:
    """Run install.sh in the root filesystem, in a private mount namespace: /proc and /dev vanish with it."""
    r = str(rootfs)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    if (rootfs / "tmp/build-ca.crt").is_file():
        env["PIP_CERT"] = "/tmp/build-ca.crt"
    script = (
        'set -e; mount -t proc proc "$1/proc"; mount --bind /dev "$1/dev"; r=$1; shift; '
        'exec chroot "$r" /usr/bin/env -i "$@"'
    )
    envs = [f"{k}={v}" for k, v in env.items()]
    _run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            r,
            *envs,
            "sh",
            INSTALL_IN_IMAGE,
            *args,
        ],
        what,
        log=log,
    )


def _copy_sources(dest: Path, root: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", ".mypy_cache")
    dest.mkdir(parents=True)
    for rel in (*SOURCES, "image"):
        src = root / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(src, dest / rel)


def _clear_dir(p: Path) -> None:
    if p.is_dir():
        for child in p.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def build_draguard_rootfs(
    rootfs: Path,
    recipe: Recipe,
    mirrors: tuple[str, str],
    cache: Path,
    progress: Progress,
    log: Path,
    root: Path = REPO_ROOT,
) -> None:
    """The Containerfile's steps, in a chroot: base system, packages, wheel, venv, finish, copies."""
    s = recipe.draguard
    base = _base_rootfs(s, mirrors, cache, progress, log)
    rootfs.mkdir(parents=True)
    _run(
        ["tar", "-C", str(rootfs), "--numeric-owner", "--xattrs", "-xpf", str(base)],
        "unpacking the base",
        log=log,
    )
    # As in Debian's own images: the updates and security suites, apt's lists not kept.
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    (rootfs / "etc/apt/sources.list.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(_sources_list(s.suite, mirrors))
    _copy_sources(rootfs / SRC_IN_IMAGE.lstrip("/"), root)
    ca = _host_ca_bundle()
    if ca is not None:
        # pip in the chroot verifies the package index with this machine's trust store.
        shutil.copy(ca, rootfs / "tmp/build-ca.crt")
    resolv = rootfs / "etc/resolv.conf"
    resolv.unlink(missing_ok=True)
    shutil.copy("/etc/resolv.conf", resolv)
    try:
        for step in install_steps(s):
            t0 = time.monotonic()
            progress(f"install.sh {' '.join(step)}")
            _chroot(rootfs, step, f"image/install.sh {step[0]}", log)
            progress(f"  {step[0]} in {time.monotonic() - t0:.0f} s")
    finally:
        resolv.unlink(missing_ok=True)
        resolv.touch()  # the runtime bind-mounts its own over it
        _clear_dir(rootfs / "tmp")
    for src, dest in s.copy:
        target = rootfs / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if (root / src).is_dir():
            shutil.copytree(root / src, target, dirs_exist_ok=True)
        else:
            shutil.copy2(root / src, target)


# ---------------------------------------------------------------------------------------------
# OCI image layout


class _Sink(Protocol):
    def write(self, data: bytes, /) -> int: ...


class _HashingWriter(io.RawIOBase):
    """Counts and hashes what passes through to `out`."""

    def __init__(self, out: _Sink) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)


# Mount points the runtime fills; their contents (device nodes, leftovers) stay out of the layer.
_EMPTY_DIRS = ("dev", "proc", "sys", "run", "tmp", "var/tmp")


def _layer_filter(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
    name = ti.name.removeprefix("./")
    for d in _EMPTY_DIRS:
        if name.startswith(d + "/"):
            return None
    ti.uname = ti.gname = ""
    return ti


def _write_layer(rootfs: Path, blobs: Path) -> tuple[str, str, int]:
    """gzip'ed tar of rootfs as a blob: (diff_id, digest, size)."""
    tmp = blobs / ".layer.tmp"
    with tmp.open("wb") as raw:
        outer = _HashingWriter(raw)
        with gzip.GzipFile(fileobj=outer, mode="wb", compresslevel=6, mtime=0) as gz:
            inner = _HashingWriter(gz)
            with tarfile.open(fileobj=inner, mode="w|", format=tarfile.PAX_FORMAT) as tf:
                for entry in sorted(os.listdir(rootfs)):
                    tf.add(str(rootfs / entry), arcname=entry, filter=_layer_filter)
    digest = outer.sha.hexdigest()
    os.replace(tmp, blobs / digest)
    return f"sha256:{inner.sha.hexdigest()}", f"sha256:{digest}", outer.size


def _blob(blobs: Path, data: bytes) -> tuple[str, int]:
    d = hashlib.sha256(data).hexdigest()
    (blobs / d).write_bytes(data)
    return f"sha256:{d}", len(data)


def write_oci_archive(rootfs: Path, spec: ImageSpec, out: Path) -> str:
    """Pack rootfs as a one-layer OCI image-layout tar named spec.name; returns the manifest digest."""
    layout = out.parent / f".{out.name}.layout"
    shutil.rmtree(layout, ignore_errors=True)
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    try:
        diff_id, layer_digest, layer_size = _write_layer(rootfs, blobs)
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        config: dict[str, Any] = {
            "created": created,
            "architecture": ARCH,
            "os": "linux",
            "config": {
                "User": spec.user,
                "Env": [f"{k}={v}" for k, v in spec.env.items()],
                "Entrypoint": list(spec.entrypoint),
                "Cmd": list(spec.cmd),
                "Labels": dict(spec.labels),
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": created, "created_by": "webhook.dev.image from image/recipe.toml"}],
        }
        cfg_digest, cfg_size = _blob(blobs, json.dumps(config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": cfg_digest,
                "size": cfg_size,
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest,
                    "size": layer_size,
                }
            ],
        }
        man_digest, man_size = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": man_digest,
                    "size": man_size,
                    "platform": {"architecture": ARCH, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": spec.name,
                        "org.opencontainers.image.ref.name": spec.tag,
                    },
                }
            ],
        }
        (layout / "index.json").write_text(json.dumps(index, sort_keys=True))
        (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
        tmp = out.parent / f".{out.name}.tmp"
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
            for name in ("oci-layout", "index.json", "blobs"):
                tf.add(str(layout / name), arcname=name)
        os.replace(tmp, out)
        return man_digest
    finally:
        shutil.rmtree(layout, ignore_errors=True)


def read_archive_digest(path: Path) -> str:
    with tarfile.open(path) as tf:
        member = tf.extractfile("index.json")
        if member is None:
            raise ImageError(f"{path}: no index.json; not an OCI image archive")
        digest = json.load(member)["manifests"][0]["digest"]
    return str(digest)


# ---------------------------------------------------------------------------------------------
# Entry points


def ensure_image(progress: Progress = _say, *, force: bool = False, cache: Path | None = None) -> BuiltImage:
    """The draguard image's OCI archive, built when the recipe or the sources changed."""
    recipe = load_recipe()
    mirrors = debian_mirrors()
    cache = cache or image_cache_dir()
    s = recipe.draguard
    key = draguard_key(recipe, mirrors)
    out = cache / f"draguard-{s.tag}-{key}.oci.tar"
    if out.is_file() and not force:
        progress(f"up to date: {s.name} in {out}")
        return BuiltImage(s.name, out, read_archive_digest(out))
    _check_builder()
    with _locked(cache, f"draguard-{key}"):
        if out.is_file() and not force:
            return BuiltImage(s.name, out, read_archive_digest(out))
        log = cache / f"draguard-{s.tag}-{key}.log"
        log.write_text("")
        t0 = time.monotonic()
        progress(f"building {s.name} (log: {log})")
        work = Path(tempfile.mkdtemp(prefix=f".draguard-{key}-", dir=cache))
        try:
            build_draguard_rootfs(work / "rootfs", recipe, mirrors, cache, progress, log)
            sbom = work / "rootfs" / SBOM_IN_IMAGE.lstrip("/")
            if not sbom.is_file():
                raise ImageError(f"install.sh sbom wrote no {SBOM_IN_IMAGE}")
            shutil.copy(sbom, BuiltImage(s.name, out, "").sbom)
            t1 = time.monotonic()
            progress("packing the OCI archive")
            digest = write_oci_archive(work / "rootfs", s, out)
            progress(f"  packed in {time.monotonic() - t1:.0f} s")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        _prune(cache, f"draguard-{s.tag}-*.oci.tar", keep=4)
    size = out.stat().st_size / 1e6
    progress(f"{s.name} ({digest[:19]}, {size:.0f} MB) in {out} after {time.monotonic() - t0:.0f} s")
    return BuiltImage(s.name, out, digest)


def _busybox(work: Path, pkg: str, log: Path) -> Path:
    """The static busybox from the Debian package (downloaded with apt, not taken from the host)."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise ImageError("the pause image is built from Debian's busybox-static: needs apt-get and dpkg-deb")
    res = subprocess.run(["apt-get", "download", pkg], cwd=work, capture_output=True, text=True)
    if res.returncode != 0:
        _run(["apt-get", "update", "-q"], "apt-get update", log=log)
        res = subprocess.run(["apt-get", "download", pkg], cwd=work, capture_output=True, text=True)
        if res.returncode != 0:
            raise ImageError(f"apt-get download {pkg} failed: {res.stderr.strip()}")
    debs = sorted(work.glob("*.deb"))
    _run(["dpkg-deb", "-x", str(debs[0]), str(work / "x")], f"unpacking {debs[0].name}", log=log)
    busybox = work / "x" / "bin" / "busybox"
    with busybox.open("rb") as f:
        head = f.read(4096)
    if b"/lib64/ld-linux" in head or b"/lib/ld-linux" in head:
        raise ImageError(f"{debs[0].name}: /bin/busybox is not static; the pause image needs busybox-static")
    return busybox


def ensure_pause_image(
    progress: Progress = _say, *, force: bool = False, cache: Path | None = None
) -> BuiltImage:
    """The pod sandbox image: Debian's static busybox, sleeping until told to stop."""
    spec = load_recipe().pause
    cache = cache or image_cache_dir()
    key = hashlib.sha256(repr(spec).encode()).hexdigest()[:16]
    out = cache / f"pause-{spec.tag}-{key}.oci.tar"
    if out.is_file() and not force:
        progress(f"up to date: {spec.name} in {out}")
        return BuiltImage(spec.name, out, read_archive_digest(out))
    with _locked(cache, f"pause-{key}"):
        if out.is_file() and not force:
            return BuiltImage(spec.name, out, read_archive_digest(out))
        log = cache / f"pause-{spec.tag}-{key}.log"
        log.write_text("")
        progress(f"building {spec.name} from Debian's {' '.join(spec.packages)}")
        work = Path(tempfile.mkdtemp(prefix=".pause-", dir=cache))
        try:
            busybox = _busybox(work, spec.packages[0], log)
            rootfs = work / "rootfs"
            for d in ("bin", *_EMPTY_DIRS, "etc"):
                (rootfs / d).mkdir(parents=True, exist_ok=True)
            shutil.copy2(busybox, rootfs / "bin" / "busybox")
            (rootfs / "bin" / "sh").symlink_to("busybox")
            digest = write_oci_archive(rootfs, spec, out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    progress(f"{spec.name} ({digest[:19]}) in {out}")
    return BuiltImage(spec.name, out, digest)


def find_node_dir() -> Path:
    """Where scripts/build-node.sh puts the node's binaries (bin/ and cni/), built or not.

    $DRAGUARD_NODE_DIR overrides; otherwise the same key as the script: its pinned versions and
    the Kubernetes release of scripts/k8s-build/go.mod.
    """
    env = os.environ.get("DRAGUARD_NODE_DIR")
    if env:
        return Path(env)
    versions = (REPO_ROOT / "scripts/node-build/versions").read_text()
    gomod = (REPO_ROOT / "scripts/k8s-build/go.mod").read_text()
    m = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", gomod, re.M)
    if m is None:
        raise ImageError("scripts/k8s-build/go.mod pins no k8s.io/kubernetes version")
    lines = sorted(ln for ln in versions.splitlines() if re.match(r"^[A-Z_]+=", ln))
    text = "".join(ln + "\n" for ln in lines) + f"KUBERNETES_VERSION={m.group(1)}\n"
    key = hashlib.sha256(text.encode()).hexdigest()[:12]
    root = os.environ.get("DRAGUARD_NODE_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "draguard" / "node") / f"{m.group(1)}-{key}"


def find_node_bin_dir() -> Path:
    """The node's bin/ (kubelet, kube-proxy, containerd, ctr, the shim, runc, crictl), checked complete."""
    d = find_node_dir()
    missing = [b for b in NODE_BINARIES if not os.access(d / "bin" / b, os.X_OK)]
    missing += [f"cni/{p}" for p in CNI_PLUGINS if not os.access(d / "cni" / p, os.X_OK)]
    if missing:
        raise ImageError(
            f"{d}: missing {', '.join(missing)}; build them with scripts/build-node.sh (or make k8s)"
        )
    return d / "bin"


def find_cni_bin_dir() -> Path:
    """The CNI plugins' directory (bridge, host-local, loopback, portmap), checked complete."""
    return find_node_bin_dir().parent / "cni"


def add_commands(parser: argparse.ArgumentParser) -> None:
    """build, containerfile, node-dir under `parser` (`python -m webhook.dev.image`, `draguard dev image`)."""
    sub = parser.add_subparsers(dest="image_command", required=True, metavar="SUBCOMMAND")
    b = sub.add_parser("build", help="build (or reuse) the draguard image and the pause image (root)")
    b.add_argument("--force", action="store_true", help="rebuild even when the cache has the image")
    b.add_argument("--print-path", action="store_true", help="print only the archives' paths on stdout")
    c = sub.add_parser("containerfile", help="print the Containerfile the recipe makes")
    c.add_argument("--check", action="store_true", help="exit 1 if ./Containerfile differs from it")
    sub.add_parser("node-dir", help="print where scripts/build-node.sh puts the node's binaries")
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    try:
        if args.image_command == "containerfile":
            text = render_containerfile(load_recipe())
            if args.check:
                if CONTAINERFILE.read_text() != text:
                    print(
                        f"{CONTAINERFILE} differs from what image/recipe.toml makes; regenerate it with:\n"
                        "  python -m webhook.dev.image containerfile > Containerfile",
                        file=sys.stderr,
                    )
                    return 1
                return 0
            sys.stdout.write(text)
            return 0
        if args.image_command == "node-dir":
            print(find_node_dir())
            return 0
        images = [ensure_image(force=args.force), ensure_pause_image(force=args.force)]
        for img in images:
            print(img.path if args.print_path else f"{img.name} {img.path}")
        return 0
    except ImageError as exc:
        print(f"draguard image: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webhook.dev.image", description=__doc__.split("\n\n")[0])
    add_commands(parser)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
