"""What `draguard review` reads: files, directories, stdin, JSON, Lists, kustomizations, and bad input."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.review.conftest import FIXTURES, Run
from webhook.review.inputs import InputError, parse_text, read_paths

POLICIES = ("--policies", str(FIXTURES / "policies"), "--inventory", str(FIXTURES / "inventory.yaml"))


def _json(run: Run) -> dict:
    assert run.err == "", run.err
    return json.loads(run.out)


def test_pointer_lines_follow_the_yaml() -> None:
    text = (
        "# c\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n"
        "spec:\n  containers:\n  - name: a\n    image: x\n"
    )
    (doc,) = parse_text(text, "f.yaml")
    assert doc.line == 2
    assert doc.lines["/spec/containers/0"] == 8
    assert doc.lines["/spec/containers/0/image"] == 9


def test_list_items_keep_their_own_lines(draguard: Callable[..., Run], tmp_path: Path) -> None:
    legacy = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "old", "namespace": "team-a"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
    }
    lst = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}, legacy],
    }
    f = tmp_path / "pods.json"
    f.write_text(json.dumps(lst, indent=2))
    doc = _json(draguard("review", str(f), *POLICIES, "-f", "json"))
    assert doc["summary"]["objects"] == 2
    (finding,) = doc["findings"]
    assert finding["rule"] == "migrate/legacy-gpu"
    line = f.read_text().splitlines()[finding["line"] - 1]
    assert "nvidia.com/gpu" in line


def test_stdin_and_multi_document(draguard: Callable[..., Run], monkeypatch: pytest.MonkeyPatch) -> None:
    text = (
        (FIXTURES / "manifests/legacy/old-job.yaml").read_text()
        + "---\n"
        + (FIXTURES / "manifests/team-ml/training-claim.yaml").read_text()
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    run = draguard("review", "-", *POLICIES, "-f", "json")
    doc = _json(run)
    assert run.code == 1
    assert doc["summary"]["objects"] == 3  # a Job, then a claim and its pod
    assert {f["file"] for f in doc["findings"]} == {"<stdin>"}
    rules = {f["rule"] for f in doc["findings"]}
    assert {"migrate/legacy-gpu", "structure/interconnect"} <= rules


def test_unknown_kinds_are_ignored_and_counted(draguard: Callable[..., Run], tmp_path: Path) -> None:
    f = tmp_path / "widgets.yaml"
    f.write_text("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n---\njust: data\n---\n")
    run = draguard("review", str(f), *POLICIES)
    assert run.code == 0
    assert "(2 ignored: kinds no rule reads)" in run.out
    assert _json(draguard("review", str(f), *POLICIES, "-f", "json"))["summary"]["errors"] == 0


def _one_line_error(run: Run) -> str:
    assert run.code == 2
    assert run.out == ""
    lines = run.err.strip().splitlines()
    assert len(lines) == 1, run.err
    assert "Traceback" not in run.err
    return lines[0]


def test_invalid_yaml_names_line_and_column(draguard: Callable[..., Run], tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: [unclosed\nspec: {}\n")
    msg = _one_line_error(draguard("review", str(f), *POLICIES))
    assert f"{f}:5:" in msg and "invalid YAML" in msg


def test_invalid_json_names_line_and_column(draguard: Callable[..., Run], tmp_path: Path) -> None:
    f = tmp_path / "bad.json"
    f.write_text('{\n  "apiVersion": "v1",\n  "kind": "Pod"\n  "metadata": {}\n}\n')
    msg = _one_line_error(draguard("review", str(f), *POLICIES))
    assert str(f) in msg and ":4:" in msg


def test_missing_and_binary_files(draguard: Callable[..., Run], tmp_path: Path) -> None:
    msg = _one_line_error(draguard("review", str(tmp_path / "nope.yaml"), *POLICIES))
    assert msg.endswith("nope.yaml: no such file or directory")
    b = tmp_path / "blob.yaml"
    b.write_bytes(b"\xff\xfe\x00binary")
    assert "not UTF-8 text" in _one_line_error(draguard("review", str(b), *POLICIES))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file(draguard: Callable[..., Run], tmp_path: Path) -> None:
    f = tmp_path / "secret.yaml"
    f.write_text("kind: Pod\n")
    f.chmod(0)
    assert "permission denied" in _one_line_error(draguard("review", str(f), *POLICIES))


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux /proc")
def test_file_that_fails_to_read(draguard: Callable[..., Run]) -> None:
    # Reading /proc/self/mem from offset 0 fails with EIO, even for root.
    msg = _one_line_error(draguard("review", "/proc/self/mem", *POLICIES))
    assert msg.startswith("draguard review: /proc/self/mem: cannot read:")


def test_unreadable_inventory_and_policies(draguard: Callable[..., Run], tmp_path: Path) -> None:
    f = FIXTURES / "manifests/legacy/old-job.yaml"
    msg = _one_line_error(draguard("review", str(f), "--inventory", str(tmp_path / "inv.yaml")))
    assert "inv.yaml" in msg and "not found" in msg
    bad = tmp_path / "policies"
    bad.mkdir()
    (bad / "tier.yaml").write_text(
        "apiVersion: policy.draguard.io/v1alpha1\nkind: GpuTierPolicy\n"
        "metadata: {name: t}\nspec: {mode: maybe}\n"
    )
    msg = _one_line_error(draguard("review", str(f), "--policies", str(bad)))
    assert "tier.yaml" in msg


def test_directories_are_walked_and_skip_policies_and_inventory(
    draguard: Callable[..., Run], in_fixtures: Path
) -> None:
    # policies/ and inventory.yaml live inside the reviewed tree; they are inputs of the review,
    # not manifests to review. broken-kustomize/ is left out by reviewing the other dirs.
    run = draguard(
        "review",
        "manifests",
        "kustomize",
        "--policies",
        "policies",
        "--inventory",
        "inventory.yaml",
        "-f",
        "json",
    )
    doc = json.loads(run.out)
    assert doc["summary"]["objects"] == 15
    files = {f["file"] for f in doc["findings"]}
    assert not any(f.startswith(("policies/", "inventory")) for f in files)


kustomize_available = shutil.which("kustomize") or shutil.which("kubectl")


@pytest.mark.skipif(not kustomize_available, reason="needs kustomize or kubectl")
def test_kustomization_findings_point_at_the_source_file(
    draguard: Callable[..., Run], in_fixtures: Path
) -> None:
    run = draguard(
        "review", "kustomize", "--policies", "policies", "--inventory", "inventory.yaml", "-f", "json"
    )
    doc = json.loads(run.out)
    assert run.code == 1
    # The overlay is built (namePrefix, namespace applied); the base is not reviewed a second time.
    assert doc["summary"]["objects"] == 2
    (f,) = [f for f in doc["findings"] if f["rule"] == "structure/interconnect"]
    assert f["object"]["name"] == "research-four-a100"
    assert f["object"]["namespace"] == "team-research"
    assert f["file"] == "kustomize/base/training.yaml"
    assert "matchAttribute" in Path(f["file"]).read_text().splitlines()[f["line"] - 1]


@pytest.mark.skipif(not kustomize_available, reason="needs kustomize or kubectl")
def test_failing_kustomization_shows_its_error(draguard: Callable[..., Run], in_fixtures: Path) -> None:
    msg = _one_line_error(draguard("review", "broken-kustomize"))
    assert msg.startswith("draguard review: broken-kustomize: kustomize build failed:")
    assert "missing-file.yaml" in msg


@pytest.mark.skipif(not shutil.which("kubectl"), reason="needs kubectl")
def test_kubectl_kustomize_fallback(monkeypatch: pytest.MonkeyPatch, in_fixtures: Path) -> None:
    monkeypatch.setenv("DRAGUARD_KUSTOMIZE", "kubectl kustomize")
    inputs = read_paths(["kustomize"])
    assert sorted(o.obj["metadata"]["name"] for o in inputs.objects) == [
        "research-four-a100",
        "research-train",
    ]


def test_read_paths_error_type(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        read_paths([str(tmp_path / "x.yaml")])
    assert info.value.file.endswith("x.yaml")


def test_progress_only_when_asked(draguard: Callable[..., Run], tmp_path: Path) -> None:
    docs = [
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\n  namespace: a\ndata: {{k: v}}\n"
        for i in range(250)
    ]
    f = tmp_path / "many.yaml"
    f.write_text("---\n".join(docs))
    quiet = draguard("review", str(f), *POLICIES)
    assert quiet.err == ""  # stderr is not a TTY under pytest
    loud = draguard("review", str(f), *POLICIES, "--progress")
    assert "evaluating 250 documents" in loud.err
    assert loud.out == quiet.out


def test_billion_laughs_is_read_in_linear_time(draguard: Callable[..., Run], tmp_path: Path) -> None:
    rows = ['  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        rows.append(f"  {name}: &{name} [{','.join([f'*{prev}'] * 9)}]")
    f = tmp_path / "laughs.yaml"
    f.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lol}\ndata:\n" + "\n".join(rows) + "\n")
    run = draguard("review", str(f), *POLICIES)  # 9**9 strings if aliases were expanded
    # Refused before anything expands it, with the file and the line of the anchor that blows up.
    assert run.code == 2 and "laughs.yaml:10:" in run.err and "YAML alias expansion too large" in run.err
