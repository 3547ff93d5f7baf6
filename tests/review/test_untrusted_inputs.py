"""Review of an untrusted tree: it reads nothing outside the tree, no special file, nothing unbounded,
and kustomize and Helm reach neither the network nor files outside it."""

from __future__ import annotations

import http.server
import io
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.review.conftest import Run
from webhook.review import inputs, kustomize

CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {name}
  namespace: ns
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
"""


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository checkout (the working directory) next to a directory outside it."""
    repo = tmp_path / "repo"
    (repo / "deploy").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.yaml").write_text(CLAIM.format(name="secret"), encoding="utf-8")
    (repo / "deploy" / "claim.yaml").write_text(CLAIM.format(name="mine"), encoding="utf-8")
    monkeypatch.chdir(repo)
    return repo


def _review(draguard: Callable[..., Run], *paths: str) -> Run:
    return draguard("review", *paths, "--policies", str(Path(__file__).parent / "fixtures" / "policies"))


def test_a_link_to_a_device_is_refused_without_reading_it(draguard: Callable[..., Run], tree: Path) -> None:
    (tree / "deploy" / "zero.yaml").symlink_to("/dev/zero")
    run = _review(draguard, "deploy")
    assert run.code == 2
    assert "deploy/zero.yaml: is a symbolic link to /dev/zero, outside the reviewed tree" in run.err
    assert "replace the link with a copy" in run.err


def test_a_link_to_a_file_outside_the_tree_is_refused(draguard: Callable[..., Run], tree: Path) -> None:
    (tree / "deploy" / "stolen.yaml").symlink_to(tree.parent / "outside" / "secret.yaml")
    run = _review(draguard, "deploy")
    assert run.code == 2 and "deploy/stolen.yaml" in run.err and "outside the reviewed tree" in run.err
    assert "secret" not in run.out


def test_a_linked_directory_outside_the_tree_is_refused(draguard: Callable[..., Run], tree: Path) -> None:
    (tree / "deploy" / "more").symlink_to(tree.parent / "outside", target_is_directory=True)
    run = _review(draguard, ".")
    assert run.code == 2 and "deploy/more: is a symbolic link to" in run.err


def test_a_path_argument_that_links_out_is_refused(draguard: Callable[..., Run], tree: Path) -> None:
    (tree / "k8s").symlink_to(tree.parent / "outside", target_is_directory=True)
    run = _review(draguard, "k8s")
    assert run.code == 2 and "k8s: is a symbolic link to" in run.err


def test_links_inside_the_tree_are_followed_once(draguard: Callable[..., Run], tree: Path) -> None:
    (tree / "deploy" / "alias.yaml").symlink_to(tree / "deploy" / "claim.yaml")
    (tree / "deploy" / "loop").symlink_to(tree, target_is_directory=True)  # an ancestor: no endless walk
    run = draguard("review", "deploy", "-f", "json", "--allow-empty")
    assert run.code in (0, 1), run.err
    assert '"objects": 2' in run.out  # claim.yaml and its alias; the loop adds nothing


def test_special_files_are_never_read(draguard: Callable[..., Run], tree: Path) -> None:
    fifo = tree / "deploy" / "pipe.yaml"
    os.mkfifo(fifo)  # reading it would block forever
    run = _review(draguard, "deploy")
    assert run.code == 2 and "deploy/pipe.yaml: is a named pipe (FIFO)" in run.err
    run = _review(draguard, "deploy/pipe.yaml")
    assert run.code == 2 and "named pipe" in run.err


def test_a_file_over_the_size_bound_is_a_clear_error(
    draguard: Callable[..., Run], tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inputs, "MAX_FILE_BYTES", 4096)
    (tree / "deploy" / "big.yaml").write_text(CLAIM.format(name="big") + "#" * 5000 + "\n", encoding="utf-8")
    run = _review(draguard, "deploy")
    assert run.code == 2
    assert "deploy/big.yaml: is larger than 4096 bytes" in run.err
    assert "split it into smaller files" in run.err


LEGACY = (
    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: legacy\nspec:\n  containers:\n  - name: c\n"
    "    image: busybox\n    resources:\n      limits:\n        nvidia.com/gpu: 1\n"
)


def test_migrate_write_never_writes_through_a_link(draguard: Callable[..., Run], tree: Path) -> None:
    # Even a link inside the tree: the write would land on whatever it names.
    target = tree / "shared" / "legacy.yaml"
    target.parent.mkdir()
    target.write_text(LEGACY, encoding="utf-8")
    (tree / "deploy" / "legacy.yaml").symlink_to(target)
    run = draguard("migrate", "--write", "deploy/legacy.yaml")  # no policies/: the default mapping
    assert run.code == 2
    assert "deploy/legacy.yaml: is a symbolic link" in run.err and "never writes through links" in run.err
    assert target.read_text(encoding="utf-8") == LEGACY


def test_migrate_never_reads_through_a_link_out_of_the_tree(draguard: Callable[..., Run], tree: Path) -> None:
    target = tree.parent / "outside" / "legacy.yaml"
    target.write_text(LEGACY, encoding="utf-8")
    (tree / "deploy" / "legacy.yaml").symlink_to(target)
    # The diff would print the target's text.
    run = draguard("migrate", "deploy")
    assert run.code == 2 and "deploy/legacy.yaml: is a symbolic link to" in run.err and run.out == ""


# --------------------------------------------------------------------------- kustomize


def _kustomization(directory: Path, body: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(body, encoding="utf-8")


@pytest.mark.parametrize(
    "entry",
    [
        "resources:\n- https://raw.githubusercontent.com/example/repo/main/claim.yaml\n",
        "resources:\n- github.com/example/repo/deploy?ref=v1\n",
        "resources:\n- git@github.com:example/repo.git//deploy\n",
        "configMapGenerator:\n- name: c\n  files:\n  - key=https://example.com/data\n",
    ],
)
def test_kustomize_remote_references_are_refused(
    draguard: Callable[..., Run], tree: Path, entry: str
) -> None:
    _kustomization(tree / "overlay", entry)
    run = _review(draguard, "overlay")
    assert run.code == 2
    assert "overlay/kustomization.yaml:" in run.err and "without network access" in run.err
    assert "vendor it into the repository" in run.err


def test_kustomize_bases_outside_the_tree_are_refused(draguard: Callable[..., Run], tree: Path) -> None:
    _kustomization(tree.parent / "outside", "resources:\n- secret.yaml\n")
    _kustomization(tree / "overlay", "resources:\n- ../../outside\n")
    run = _review(draguard, "overlay")
    assert run.code == 2 and "outside the reviewed tree" in run.err and "../../outside" in run.err


def test_kustomize_links_out_of_the_tree_are_refused(draguard: Callable[..., Run], tree: Path) -> None:
    _kustomization(tree / "overlay", "resources:\n- claim.yaml\n")
    (tree / "overlay" / "claim.yaml").symlink_to(tree.parent / "outside" / "secret.yaml")
    run = _review(draguard, "overlay")
    assert run.code == 2 and "overlay/claim.yaml: is a symbolic link to" in run.err


def test_kustomize_special_files_and_helm_charts_are_refused(
    draguard: Callable[..., Run], tree: Path
) -> None:
    _kustomization(tree / "overlay", "resources:\n- pipe.yaml\n")
    os.mkfifo(tree / "overlay" / "pipe.yaml")  # kustomize would block reading it
    run = _review(draguard, "overlay")
    assert run.code == 2 and "overlay/pipe.yaml: is a named pipe (FIFO)" in run.err
    _kustomization(tree / "charts", "helmCharts:\n- name: x\n  repo: https://charts.example.com\n")
    run = _review(draguard, "charts")
    assert run.code == 2 and "charts/kustomization.yaml: uses helmCharts" in run.err


def test_helm_chart_links_out_of_the_tree_are_refused(
    draguard: Callable[..., Run], tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chart = tree / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n", encoding="utf-8")
    (chart / "files").mkdir()
    (chart / "files" / "key").symlink_to(tree.parent / "outside" / "secret.yaml")  # .Files.Get "files/key"
    monkeypatch.setenv("DRAGUARD_HELM", "/bin/false")  # refused before helm would run
    run = _review(draguard, "chart")
    assert run.code == 2 and "chart/files/key: is a symbolic link to" in run.err


class _Counter(http.server.BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        body = CLAIM.format(name="fetched").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Counter.hits = 0
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/claim.yaml"
    finally:
        httpd.shutdown()
        thread.join()


@pytest.mark.skipif(kustomize.kustomize_command() is None, reason="needs kustomize or kubectl")
def test_the_kustomize_build_itself_has_no_network(tree: Path, server: str) -> None:
    # Past the checks (run_build is the build alone), kustomize still cannot reach a server, not
    # even one on the runner's own loopback.
    if not kustomize._can_unshare():
        pytest.skip("no network namespace here: only the proxy variables and the checks apply")
    _kustomization(tree / "overlay", f"resources:\n- {server}\n")
    with pytest.raises(inputs.InputError, match="kustomize build failed"):
        kustomize.run_build(tree / "overlay", "overlay")
    assert _Counter.hits == 0


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")
def test_a_local_kustomization_still_builds(draguard: Callable[..., Run], tree: Path) -> None:
    _kustomization(tree / "base", "resources:\n- claim.yaml\n")
    (tree / "base" / "claim.yaml").write_text(CLAIM.format(name="base-claim"), encoding="utf-8")
    _kustomization(tree / "overlay", "resources:\n- ../base\nnamePrefix: p-\n")
    run = draguard("review", "overlay", "-f", "junit")
    assert run.code in (0, 1), run.err
    assert 'name="ResourceClaim/ns/p-base-claim' in run.out


def test_stdin_over_the_size_bound_is_a_clear_error(
    draguard: Callable[..., Run], tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inputs, "MAX_FILE_BYTES", 4096)
    monkeypatch.setattr(sys, "stdin", io.StringIO(CLAIM.format(name="big") + "#" * 5000 + "\n"))
    run = _review(draguard, "-")
    assert run.code == 2 and "<stdin>: is larger than 4096 bytes" in run.err
