"""The Kustomize bundle as an OCI artifact (scripts/release/bundle.py): media types, digests, content,
reproducibility, the image pin, and a round trip through a registry read back by Flux's and Argo CD's
rules (tools/ocibundle: go-containerregistry and oras-go, the libraries those engines pull with)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from release_scripts import ROOT, SCRIPTS, load

from tests.gotool import go_tool
from tests.kustomize.kbundle import kustomize_command

bundle = load("bundle")
IMAGE = "ghcr.io/acme/draguard@sha256:" + "ab" * 32
FLUX_CONFIG = "application/vnd.cncf.flux.config.v1+json"
FLUX_CONTENT = "application/vnd.cncf.flux.content.v1.tar+gzip"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def make(out: Path, image: str | None = IMAGE, tree: Path = ROOT / "kustomize") -> dict[str, Any]:
    return dict(
        bundle.build(
            out,
            tree=tree,
            version="1.2.3",
            commit="c0ffee" * 6 + "abcd",
            created=1_700_000_000,
            source="https://example.com/acme/draguard",
            image=image,
        )
    )


def blob(layout: Path, digest: str) -> bytes:
    algo, hexd = digest.split(":")
    data = (layout / "blobs" / algo / hexd).read_bytes()
    assert hashlib.sha256(data).hexdigest() == hexd, f"blob {digest} does not hash to its name"
    return data


def manifests(layout: Path) -> dict[str, dict[str, Any]]:
    index = json.loads((layout / "index.json").read_text())
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json" and index["schemaVersion"] == 2
    out = {}
    for desc in index["manifests"]:
        data = blob(layout, desc["digest"])
        assert len(data) == desc["size"] and desc["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
        out[desc["annotations"]["org.opencontainers.image.ref.name"]] = json.loads(data)
    return out


def tar_files(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}  # type: ignore[union-attr]


def expected_files() -> dict[str, bytes]:
    tree = ROOT / "kustomize"
    return {
        p.relative_to(tree).as_posix(): p.read_bytes()
        for p in sorted(tree.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.name != "sync-policies.py"
    }


def test_layout_has_flux_and_argocd_manifests_over_one_verified_blob(tmp_path: Path) -> None:
    summary = make(tmp_path)
    layout = Path(summary["layout"])
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    found = manifests(layout)
    assert set(found) == {"flux", "argocd"}
    flux, argo = found["flux"], found["argocd"]
    # What `flux push artifact` writes, and what Argo CD accepts by default.
    assert flux["config"]["mediaType"] == FLUX_CONFIG and [ly["mediaType"] for ly in flux["layers"]] == [
        FLUX_CONTENT
    ]
    assert [ly["mediaType"] for ly in argo["layers"]] == [OCI_LAYER]
    assert flux["layers"][0]["digest"] == argo["layers"][0]["digest"] == summary["layer"]
    for m in (flux, argo):
        assert m["schemaVersion"] == 2 and m["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
        for desc in (m["config"], *m["layers"]):
            assert len(blob(layout, desc["digest"])) == desc["size"]
        ann = m["annotations"]
        assert ann["org.opencontainers.image.source"] == "https://example.com/acme/draguard"
        assert ann["org.opencontainers.image.revision"] == "1.2.3@sha1:" + "c0ffee" * 6 + "abcd"
        assert ann["org.opencontainers.image.created"] == "2023-11-14T22:13:20Z"
    # The plain archive is the layer itself, and the layout archive holds the same layout.
    assert "sha256:" + hashlib.sha256(Path(summary["content"]).read_bytes()).hexdigest() == summary["layer"]
    with tarfile.open(summary["archive"]) as tf:
        index = tf.extractfile("index.json")
        assert index is not None and index.read() == (layout / "index.json").read_bytes()


def test_content_is_the_kustomize_tree_with_the_image_pinned_by_digest(tmp_path: Path) -> None:
    summary = make(tmp_path)
    files = tar_files(Path(summary["content"]).read_bytes())
    want = expected_files()
    assert set(files) == set(want)
    changed = {name for name in want if files[name] != want[name]}
    assert changed == {"base/kustomization.yaml"}
    images = yaml.safe_load(files["base/kustomization.yaml"])["images"]
    assert {
        "name": "ghcr.io/draguard/draguard",
        "newName": "ghcr.io/acme/draguard",
        "digest": "sha256:" + "ab" * 32,
    } in images
    # Nothing else in the file moved: the pin is the only difference.
    before = want["base/kustomization.yaml"].decode().splitlines()
    after = files["base/kustomization.yaml"].decode().splitlines()
    removed = [ln.strip() for ln in before if ln not in after]
    added = sorted(ln.strip() for ln in after if ln not in before)
    assert all(ln.startswith("newTag:") for ln in removed)
    assert added == ["digest: sha256:" + "ab" * 32, "newName: ghcr.io/acme/draguard"]


def test_same_input_same_digests_and_unpinned_bundle_is_the_tree(tmp_path: Path) -> None:
    a, b = make(tmp_path / "a"), make(tmp_path / "b")
    assert (a["layer"], a["manifests"]) == (b["layer"], b["manifests"])
    assert Path(a["archive"]).read_bytes() == Path(b["archive"]).read_bytes()
    plain = make(tmp_path / "c", image=None)
    assert plain["layer"] != a["layer"]
    assert tar_files(Path(plain["content"]).read_bytes()) == expected_files()


def _images(docs: list[Any]) -> Iterator[str]:
    for d in docs:
        spec = d.get("spec") or {}
        for pod in (
            spec.get("template", {}).get("spec"),
            spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec"),
        ):
            for c in (pod or {}).get("containers", []) + (pod or {}).get("initContainers", []):
                yield c["image"]


@pytest.mark.parametrize("overlay", ["gke", "local"])
def test_every_overlay_of_the_extracted_bundle_runs_the_pinned_image(tmp_path: Path, overlay: str) -> None:
    cmd = kustomize_command()
    if cmd is None:
        pytest.skip("neither kustomize nor kubectl found (PATH, ~/.cache/draguard/k8s)")
    summary = make(tmp_path / "b")
    root = tmp_path / "x"
    with tarfile.open(summary["content"]) as tf:
        # Python before 3.11.4 (Debian bookworm's 3.11.2) has no extraction filters; the archive is
        # this test's own.
        tf.extractall(root, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))  # type: ignore[arg-type]
    res = subprocess.run(
        [*cmd, str(root / "overlays" / overlay)], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stderr
    images = [i for i in _images([d for d in yaml.safe_load_all(res.stdout) if d]) if "draguard" in i]
    assert images and set(images) == {IMAGE}, images


def test_bad_image_reference_and_links_are_refused_with_a_message(tmp_path: Path) -> None:
    with pytest.raises(bundle.BundleError, match="expected NAME@sha256:<64 hex> or NAME:TAG"):
        make(tmp_path / "a", image="ghcr.io/acme/draguard@sha256:short")
    tree = tmp_path / "tree"
    (tree / "base").mkdir(parents=True)
    (tree / "base" / "kustomization.yaml").write_text("resources: []\n")
    (tree / "base" / "link.yaml").symlink_to("/etc/passwd")
    with pytest.raises(bundle.BundleError, match="only regular files"):
        make(tmp_path / "b", image=None, tree=tree)
    res = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "bundle.py"),
            "--out",
            str(tmp_path / "c"),
            "--image",
            "not a reference",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (
        res.returncode == 1 and res.stderr.startswith("bundle.py: --image") and "Traceback" not in res.stderr
    )


def test_ocibundle_check_verifies_digests_and_each_engines_rules(tmp_path: Path) -> None:
    tool = str(go_tool("ocibundle"))
    layout = Path(make(tmp_path)["layout"])
    res = subprocess.run(
        [tool, "check", str(layout)], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stderr
    read = {r["name"]: r for r in json.loads(res.stdout)}
    assert read["flux"]["layerMediaTypes"] == [FLUX_CONTENT] and read["argocd"]["layerMediaTypes"] == [
        OCI_LAYER
    ]
    assert read["flux"]["files"] == read["argocd"]["files"] == sorted(expected_files())

    # One flipped byte in the content blob: the digest no longer matches and the check says so.
    layer = json.loads(
        blob(layout, json.loads((layout / "index.json").read_text())["manifests"][0]["digest"])
    )
    path = layout / "blobs" / "sha256" / layer["layers"][0]["digest"].split(":")[1]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    res = subprocess.run(
        [tool, "check", str(layout)], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 1 and "digest" in res.stderr.lower(), res.stderr


def test_push_to_a_registry_and_pull_as_flux_and_as_argocd(tmp_path: Path) -> None:
    tool = str(go_tool("ocibundle"))
    summary = make(tmp_path / "b")
    reg = subprocess.Popen([tool, "serve", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    try:
        assert reg.stdout is not None
        addr = json.loads(reg.stdout.readline())["address"]
        flux_ref, argo_ref = f"{addr}/acme/draguard-bundle:1.2.3", f"{addr}/acme/draguard-bundle-argocd:1.2.3"
        res = subprocess.run(
            [tool, "push", "--plain-http", summary["layout"], f"flux={flux_ref}", f"argocd={argo_ref}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        pushed = json.loads(res.stdout)
        assert pushed == {
            "flux": f"{addr}/acme/draguard-bundle@{summary['manifests']['flux']}",
            "argocd": f"{addr}/acme/draguard-bundle-argocd@{summary['manifests']['argocd']}",
        }
        want = tar_files(Path(summary["content"]).read_bytes())
        for as_, ref in (("flux", flux_ref), ("argocd", argo_ref)):
            out = tmp_path / as_
            res = subprocess.run(
                [tool, "pull", "--as", as_, "--plain-http", ref, str(out)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert res.returncode == 0, res.stderr
            assert json.loads(res.stdout)["digest"] == summary["manifests"][as_]
            got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
            assert got == want
        # Argo CD's default rules refuse Flux's layer type: why the bundle has a manifest for each.
        res = subprocess.run(
            [tool, "pull", "--as", "argocd", "--plain-http", flux_ref, str(tmp_path / "no")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert res.returncode == 1 and "not in Argo CD's default allowed list" in res.stderr
    finally:
        reg.terminate()
        reg.wait(timeout=10)


def _layout_with_layer(root: Path, layer: bytes) -> Path:
    """A layout whose only manifest (`argocd`) has `layer` as its content, digests all correct."""
    layout = root / "hostile.oci"
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')

    def put(data: bytes) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        (layout / "blobs" / "sha256" / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    config = {"mediaType": FLUX_CONFIG, **put(b"{}")}
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": [{"mediaType": OCI_LAYER, **put(layer)}],
    }
    desc = put(json.dumps(manifest).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **desc,
                "annotations": {"org.opencontainers.image.ref.name": "argocd"},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index))
    return layout


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("../escape.yaml", "outside the extraction directory"),
        ("/etc/cron.d/x", "outside the extraction directory"),
    ],
)
def test_ocibundle_refuses_a_layer_that_would_write_outside_its_directory(
    tmp_path: Path, entry: str, message: str
) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        info = tarfile.TarInfo(entry)
        info.size = 3
        tf.addfile(info, io.BytesIO(b"x: "))
    layout = _layout_with_layer(tmp_path, gzip.compress(raw.getvalue()))
    res = subprocess.run(
        [str(go_tool("ocibundle")), "check", str(layout)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 1 and message in res.stderr, res.stderr
    assert not (tmp_path / "escape.yaml").exists()
