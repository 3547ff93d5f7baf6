"""One recipe, two front ends: the Containerfile and the local image builder must not drift apart."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shlex
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest

from webhook.dev import image

ROOT = Path(__file__).resolve().parents[2]


def _containerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def test_committed_containerfile_is_the_one_the_recipe_makes() -> None:
    assert (ROOT / "Containerfile").read_text() == image.render_containerfile(image.load_recipe()), (
        "Containerfile is stale: python -m webhook.dev.image containerfile > Containerfile"
    )
    assert image.main(["containerfile", "--check"]) == 0


def test_containerfile_runs_exactly_the_local_builders_install_steps() -> None:
    """Parsed from the Containerfile: every RUN is install.sh, with the builder's steps and arguments."""
    spec = image.load_recipe().draguard
    instr = _containerfile_instructions((ROOT / "Containerfile").read_text())
    runs = [args for word, args in instr if word == "RUN"]
    assert len(runs) == 1
    body = re.sub(r"^--mount=\S+\s+", "", runs[0])
    invoked = [tuple(shlex.split(part)) for part in body.split("&&")]
    assert all(cmd[:2] == ("sh", image.INSTALL_IN_IMAGE) for cmd in invoked), invoked
    assert [cmd[2:] for cmd in invoked] == image.install_steps(spec)
    # The same Debian packages: runtime ones and build-only ones, the latter purged at the end.
    packages = next(cmd[3:] for cmd in invoked if cmd[2] == "packages")
    assert set(packages) == {*spec.packages, *spec.build_packages}
    assert "python3" in spec.packages
    finish = next(cmd[3:] for cmd in invoked if cmd[2] == "finish")
    assert set(finish) == set(spec.build_packages)
    # Nothing installs behind the recipe's back.
    for word, args in instr:
        assert not re.search(r"\b(apt-get|apt|pip|dpkg)\b", args) or word == "LABEL", (word, args)
    froms = [args for word, args in instr if word == "FROM"]
    assert froms == ["${BASE_IMAGE}"]
    assert ("ARG", f"BASE_IMAGE={spec.base}") in instr
    assert "bookworm" in spec.base and spec.suite == "bookworm"


PINNED = re.compile(r"^\S+:[\w.-]+@sha256:[0-9a-f]{64}$")


def _from_images(text: str) -> list[str]:
    """Every FROM's image with ARG defaults substituted, as a build without --build-arg sees it."""
    args: dict[str, str] = {}
    images = []
    for word, rest in _containerfile_instructions(text):
        if word == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args[k] = v
        elif word == "FROM":
            ref = rest.split()[0]
            images.append(re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), ref))
    return images


def test_every_base_image_is_pinned_by_digest() -> None:
    """A tag can be re-pushed with other bytes; the release builds from the digest the recipe names."""
    froms = _from_images((ROOT / "Containerfile").read_text())
    assert froms == [image.load_recipe().draguard.base]
    for ref in froms:
        assert PINNED.match(ref), f"Containerfile: FROM {ref} is not pinned by digest"
    assert froms[0].startswith("docker.io/library/debian:bookworm-slim@sha256:")
    # The check reads what a build reads: an unpinned FROM or ARG default is caught.
    assert _from_images("ARG B=debian:bookworm-slim\nFROM ${B}\nFROM scratch AS x\n") == [
        "debian:bookworm-slim",
        "scratch",
    ]


def test_an_unpinned_base_is_refused_with_what_to_write(tmp_path: Path) -> None:
    recipe = (ROOT / "image/recipe.toml").read_text()
    pinned = image.load_recipe().draguard.base
    bad = tmp_path / "recipe.toml"
    for ref in (pinned.split("@")[0], pinned[:-1], pinned.replace("@sha256:", "@sha512:")):
        bad.write_text(recipe.replace(pinned, ref))
        with pytest.raises(image.ImageError, match=r"\[draguard\]\.base: .* is not pinned; write it as "):
            image.load_recipe(bad)


def test_containerfile_and_oci_config_run_the_same_way(tmp_path: Path) -> None:
    """User, entrypoint, command, environment and labels: the Containerfile's equal the archive's config."""
    spec = image.load_recipe().draguard
    instr = _containerfile_instructions((ROOT / "Containerfile").read_text())
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    archive = tmp_path / "img.tar"
    image.write_oci_archive(rootfs, spec, archive)
    config = _read_config(archive)["config"]

    assert ("USER", config["User"]) in instr and config["User"] == "65532:65532"
    assert ("ENTRYPOINT", json.dumps(config["Entrypoint"])) in instr
    assert ("CMD", json.dumps(config["Cmd"])) in instr
    env = dict(kv.split("=", 1) for _, args in instr if _ == "ENV" for kv in args.split())
    assert env == dict(e.split("=", 1) for e in config["Env"])
    assert env["PATH"].startswith("/opt/draguard/bin:")
    labels = dict(
        (k, json.loads(v))
        for _, args in instr
        if _ == "LABEL"
        for k, v in re.findall(r'(\S+?)=("(?:[^"\\]|\\.)*")', args)
    )
    assert labels == config["Labels"] and labels["org.opencontainers.image.title"] == "draguard"
    copies = [tuple(args.split()) for word, args in instr if word == "COPY"]
    assert copies == [tuple(c) for c in spec.copy]
    for src, _dest in spec.copy:
        assert (ROOT / src).exists(), src


def _read_config(archive: Path) -> dict[str, object]:
    with tarfile.open(archive) as tf:
        index = json.load(tf.extractfile("index.json"))  # type: ignore[arg-type]
        man_digest = index["manifests"][0]["digest"].split(":")[1]
        manifest = json.load(tf.extractfile(f"blobs/sha256/{man_digest}"))  # type: ignore[arg-type]
        cfg = manifest["config"]["digest"].split(":")[1]
        return json.load(tf.extractfile(f"blobs/sha256/{cfg}"))  # type: ignore[arg-type,no-any-return]


def test_image_tag_is_what_the_bundle_deploys() -> None:
    spec = image.load_recipe().draguard
    for rel in (
        "kustomize/base/webhook/deployment.yaml",
        "kustomize/base/driver/daemonset.yaml",
        "kustomize/base/certs/job.yaml",
        "kustomize/base/certs/cronjob.yaml",
    ):
        assert f"image: {spec.name}\n" in (ROOT / rel).read_text(), rel
    assert (
        f"name: {spec.repository}\n    newTag: {spec.tag}"
        in (ROOT / "kustomize/base/kustomization.yaml").read_text()
    )


def test_oci_archive_is_a_valid_image_layout(tmp_path: Path) -> None:
    """Digests and sizes match the blobs, the diff_id is the uncompressed hash, mount points stay empty."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "opt/app").mkdir(parents=True)
    (rootfs / "opt/app/run").write_text("#!/bin/sh\necho hi\n")
    os.chmod(rootfs / "opt/app/run", 0o755)
    (rootfs / "opt/app/link").symlink_to("run")
    for d in ("dev", "proc", "tmp"):
        (rootfs / d).mkdir()
    (rootfs / "dev/leftover").write_text("x")
    (rootfs / "tmp/junk").write_text("x")
    spec = image.load_recipe().pause
    archive = tmp_path / "a.tar"
    digest = image.write_oci_archive(rootfs, spec, archive)
    assert image.read_archive_digest(archive) == digest

    with tarfile.open(archive) as tf:
        names = set(tf.getnames())
        assert {"oci-layout", "index.json"} <= names
        blobs = {
            n.split("/")[-1]: tf.extractfile(n).read()  # type: ignore[union-attr]
            for n in names
            if n.startswith("blobs/sha256/") and tf.getmember(n).isfile()
        }
        index = json.loads(tf.extractfile("index.json").read())  # type: ignore[union-attr]
    for name, data in blobs.items():
        assert hashlib.sha256(data).hexdigest() == name
    entry = index["manifests"][0]
    assert entry["annotations"]["io.containerd.image.name"] == spec.name
    manifest = json.loads(blobs[entry["digest"].split(":")[1]])
    assert len(blobs[entry["digest"].split(":")[1]]) == entry["size"]
    layer = manifest["layers"][0]
    layer_bytes = blobs[layer["digest"].split(":")[1]]
    assert len(layer_bytes) == layer["size"]
    config = json.loads(blobs[manifest["config"]["digest"].split(":")[1]])
    raw = gzip.decompress(layer_bytes)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(raw).hexdigest()]
    assert config["config"]["User"] == spec.user and config["config"]["Entrypoint"] == list(spec.entrypoint)

    layer_path = tmp_path / "layer.tar"
    layer_path.write_bytes(raw)
    with tarfile.open(layer_path) as lt:
        members = {m.name: m for m in lt.getmembers()}
    assert "opt/app/run" in members and members["opt/app/run"].mode & 0o111
    assert members["opt/app/link"].issym() and members["opt/app/link"].linkname == "run"
    assert "dev" in members and "dev/leftover" not in members and "tmp/junk" not in members
    assert members["opt/app/run"].uid == os.getuid() and members["opt/app/run"].uname == ""


def test_bad_recipe_names_the_file_and_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "recipe.toml"
    bad.write_text('[draguard]\nrepository = "x"\npackages = "python3"\n')
    with pytest.raises(image.ImageError, match=r"recipe\.toml: \[draguard\]\.packages: expected a list"):
        image.load_recipe(bad)
    bad.write_text("[draguard\n")
    with pytest.raises(image.ImageError, match=r"recipe\.toml: not valid TOML"):
        image.load_recipe(bad)
    bad.write_text(
        '[draguard]\nrepository = "x"\npackages = []\nuser = "1"\nentrypoint = ["a"]\n'
        'copy = [["../etc", "/x"]]\n[pause]\n'
    )
    with pytest.raises(image.ImageError, match=r"\.copy: .*relative to the repository"):
        image.load_recipe(bad)


def test_debian_mirrors_come_from_apts_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRAGUARD_DEBIAN_MIRROR", raising=False)
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
    )
    assert image.debian_mirrors([deb822]) == (
        "http://mirror.example/debian",
        "http://mirror.example/debian-security",
    )
    one_line = tmp_path / "sources.list"
    one_line.write_text("deb [arch=amd64] http://other.example/debian bookworm main\n")
    assert image.debian_mirrors([one_line])[0] == "http://other.example/debian"
    assert image.debian_mirrors([tmp_path / "missing"]) == (
        image.DEFAULT_MIRROR,
        image.DEFAULT_SECURITY_MIRROR,
    )
    monkeypatch.setenv("DRAGUARD_DEBIAN_MIRROR", "http://override.example/debian")
    assert image.debian_mirrors([deb822])[0] == "http://override.example/debian"


def test_image_key_follows_the_sources_and_the_recipe(tmp_path: Path) -> None:
    for rel in (*image.SOURCES, "image", "webhook/dev/image.py", "driver/sim/topologies"):
        src = ROOT / rel
        dst = tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            subprocess.run(["cp", "-a", str(src), str(dst.parent)], check=True)
        else:
            dst.write_bytes(src.read_bytes())
    recipe = image.load_recipe()
    mirrors = ("http://a/debian", "http://a/debian-security")
    k0 = image.draguard_key(recipe, mirrors, tmp_path)
    assert image.draguard_key(recipe, mirrors, tmp_path) == k0
    (tmp_path / "webhook/__pycache__").mkdir(exist_ok=True)
    (tmp_path / "webhook/__pycache__/x.pyc").write_bytes(b"noise")
    assert image.draguard_key(recipe, mirrors, tmp_path) == k0
    (tmp_path / "driver/new_module.py").write_text("X = 1\n")
    k1 = image.draguard_key(recipe, mirrors, tmp_path)
    assert k1 != k0
    (tmp_path / "image/install.sh").write_text("#!/bin/sh\n")
    assert image.draguard_key(recipe, mirrors, tmp_path) != k1
    assert image.draguard_key(recipe, ("http://b/debian", mirrors[1]), tmp_path) != k0


def test_node_dir_is_where_build_node_puts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRAGUARD_NODE_DIR", raising=False)
    monkeypatch.delenv("DRAGUARD_NODE_CACHE", raising=False)
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/build-node.sh"), "--print-dir"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ},
    ).stdout.strip()
    assert Path(out) == image.find_node_dir()
    monkeypatch.setenv("DRAGUARD_NODE_DIR", "/nonexistent/node")
    with pytest.raises(image.ImageError, match=r"missing kubelet, .* build them with scripts/build-node.sh"):
        image.find_node_bin_dir()


def _pins(text: str) -> dict[str, str]:
    return {
        re.sub(r"[-_.]+", "-", m.group(1)).lower(): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", text, re.M)
    }


def _locked(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a pip-compile --generate-hashes lock."""
    out: dict[str, tuple[str, list[str]]] = {}
    for block in re.split(r"\n(?=\S)", path.read_text()):
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", block)
        if m:
            name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
            out[name] = (m.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return out


def test_image_locks_are_hashed_and_agree_with_constraints() -> None:
    """Every locked distribution has hashes and the pin constraints.txt gives the development venv."""
    lock = _locked(ROOT / image.LOCK)
    constraints = _pins((ROOT / "constraints.txt").read_text())
    assert lock and all(hashes for _v, hashes in lock.values()), "a locked package without --hash"
    for name, (version, _h) in lock.items():
        assert constraints.get(name) == version, (
            f"{name}: lock {version}, constraints.txt {constraints.get(name)}"
        )
    pyproject = (ROOT / "pyproject.toml").read_text()
    project = tomllib.loads(pyproject)["project"]
    # The image runs the webhook and the driver: the core requirements and both extras.
    extras = project["optional-dependencies"]
    runtime = [*project["dependencies"], *extras["webhook"], *extras["driver"]]
    assert len(runtime) > 10
    for dep in runtime:
        name = re.match(r"[A-Za-z0-9._-]+", dep)
        assert name is not None
        locked = re.sub(r"[-_.]+", "-", name.group(0)).lower() in lock
        assert locked, f"{dep} is a runtime dependency but not locked"
    assert "draguard" not in lock and "pip" not in lock

    backend = re.search(r'^requires = \["(setuptools)==([^"]+)"\]$', pyproject, re.M)
    assert backend is not None, "pyproject.toml's build backend must be pinned exactly"
    build = _locked(ROOT / image.BUILD_LOCK)
    assert build["setuptools"][0] == backend.group(2) and build["setuptools"][1]
    install = (ROOT / "image/install.sh").read_text()
    assert install.count("--require-hashes") == 2 and "--constraint" not in install


def test_sbom_lists_installed_debian_and_python_packages(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    (root / "etc/debian_version").write_text("12.11\n")
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(
        "Package: python3\nStatus: install ok installed\nArchitecture: amd64\nVersion: 3.11.2-1+b1\n\n"
        "Package: ca-certificates\nStatus: deinstall ok config-files\nArchitecture: all\nVersion: 1\n\n"
        "Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.36-9+deb12u10\n"
    )
    site = root / "opt/draguard/lib/python3.11/site-packages"
    (site / "ruamel.yaml-0.19.1.dist-info").mkdir(parents=True)
    (site / "ruamel.yaml-0.19.1.dist-info/METADATA").write_text(
        "Metadata-Version: 2.4\nName: ruamel.yaml\nVersion: 0.19.1\nLicense-Expression: MIT\n\nbody\n"
    )
    res = subprocess.run(
        ["python3", str(ROOT / "image/sbom.py"), str(root), "ghcr.io/x/y", "1.0"],
        capture_output=True,
        text=True,
        check=True,
    )
    bom = json.loads(res.stdout)
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.5"
    assert bom["serialNumber"].startswith("urn:uuid:")
    assert bom["metadata"]["component"] == {
        "type": "container",
        "bom-ref": "image",
        "name": "ghcr.io/x/y",
        "version": "1.0",
    }
    purls = {c.get("purl") for c in bom["components"]}
    assert "pkg:deb/debian/python3@3.11.2-1%2Bb1?arch=amd64&distro=debian-12" in purls
    assert "pkg:pypi/ruamel-yaml@0.19.1" in purls
    assert not any("ca-certificates" in str(p) for p in purls), "a purged package is not in the image"
    assert {"type": "operating-system", "bom-ref": "os", "name": "debian", "version": "12.11"} in bom[
        "components"
    ]
    ruamel = next(c for c in bom["components"] if c["name"] == "ruamel.yaml")
    assert ruamel["licenses"] == [{"expression": "MIT"}]
    assert len({c["bom-ref"] for c in bom["components"]}) == len(bom["components"])
    # A release stamps the wheel's version from its tag: the image is described as that version.
    (site / "draguard-0.2.0.dist-info").mkdir()
    meta = "Metadata-Version: 2.4\nName: draguard\nVersion: 0.2.0\n"
    (site / "draguard-0.2.0.dist-info/METADATA").write_text(meta)
    res = subprocess.run(["python3", str(ROOT / "image/sbom.py"), str(root), "ghcr.io/x/y", "1.0"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert json.loads(res.stdout)["metadata"]["component"]["version"] == "0.2.0"


def test_build_without_root_or_debootstrap_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DRAGUARD_IMAGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(image.os, "geteuid", lambda: 1000)
    assert image.main(["build"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("draguard image: building an image needs root") and "Traceback" not in err
    monkeypatch.setattr(image.os, "geteuid", lambda: 0)
    real_which = image.shutil.which
    monkeypatch.setattr(image.shutil, "which", lambda t: None if t == "debootstrap" else real_which(t))
    assert image.main(["build"]) == 1
    assert "debootstrap not found: apt-get install -y debootstrap" in capsys.readouterr().err
    assert not list((tmp_path / "cache").glob("*.oci.tar"))


def test_renovate_tracks_every_digest_pin() -> None:
    """renovate.json's regex managers find each pinned image, so its updates cannot silently stop."""
    config = json.loads((ROOT / "renovate.json").read_text())
    found: dict[str, set[str]] = {}
    for manager in config["customManagers"]:
        files = [re.compile(p.strip("/")) for p in manager["managerFilePatterns"]]
        # Renovate's named groups are ECMAScript's (?<name>); Python spells them (?P<name>).
        patterns = [re.compile(s.replace("(?<", "(?P<")) for s in manager["matchStrings"]]
        for rel in ("image/recipe.toml", "Containerfile", ".github/workflows/release.yml"):
            if any(f.search(rel) for f in files):
                text = (ROOT / rel).read_text()
                for pat in patterns:
                    for m in pat.finditer(text):
                        found.setdefault(rel, set()).add(
                            f"{m['depName']}:{m['currentValue']}@{m['currentDigest']}"
                        )
    base = image.load_recipe().draguard.base
    assert found["image/recipe.toml"] == {base} and found["Containerfile"] == {base}
    workflow = (ROOT / ".github/workflows/release.yml").read_text()
    pinned = set(re.findall(r"image[:=] ?(\S+@sha256:[0-9a-f]{64})", workflow))
    assert pinned and found[".github/workflows/release.yml"] == pinned
