"""Review at scale: the streamed review gives the verdicts of the whole-input evaluation, in any
document order, while holding a bounded amount of memory."""

from __future__ import annotations

import io
import json
import random
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.review.conftest import FIXTURES, Run
from webhook.core.findings import Finding
from webhook.review import pipeline
from webhook.review.inputs import InputError, iter_file, parse_text, read_file, read_paths

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "corpus"
POLICIES = str(FIXTURES / "policies")
INVENTORY = str(FIXTURES / "inventory.yaml")


def _row(f: Finding) -> tuple[Any, ...]:
    return (f.rule, f.mode, f.severity, f.object, f.file, f.line, f.message, f.fix,
            json.dumps(f.patch, sort_keys=True, default=str), len(f.generated))


def _reference(paths: list[str], **kw: Any) -> pipeline.ReviewResult:
    """The whole input set evaluated at once: what review did before it streamed."""
    inputs = read_paths(paths, exclude=[Path(kw["policies"]), Path(kw["inventory"])])
    return pipeline.evaluate_inputs(
        inputs,
        pipeline.load_policy_set(kw["policies"], required=True),
        pipeline.load_inventory_file(kw["inventory"]),
    )


def _streamed(paths: list[str], **kw: Any) -> pipeline.ReviewResult:
    return pipeline.review(paths, policies_required=True, **kw).result


def _assert_same(paths: list[str], **kw: Any) -> pipeline.ReviewResult:
    want, got = _reference(paths, **kw), _streamed(paths, **kw)
    assert [_row(f) for f in got.report.findings] == [_row(f) for f in want.report.findings]
    assert (got.report.objects, got.ignored) == (want.report.objects, want.ignored)
    assert got.objects == want.objects
    assert got.files == want.files
    return got


def _documents(root: Path) -> Iterator[str]:
    """The YAML documents of every readable manifest under `root` (broken ones are other tests')."""
    for path in sorted(root.rglob("*.yaml")):
        if path.name.startswith("kustomization") or "suite" in path.name:
            continue
        try:
            text = path.read_text(encoding="utf-8")
            docs = parse_text(text, path.name)
        except (InputError, UnicodeDecodeError):
            continue
        for doc in docs:
            if isinstance(doc.data, dict) and isinstance(doc.data.get("kind"), str):
                yield yaml.safe_dump(doc.data, sort_keys=False)


@pytest.fixture
def corpus_docs() -> list[str]:
    docs = [*_documents(FIXTURES / "manifests"), *_documents(CORPUS)]
    assert len(docs) > 200, "the corpus should give a few hundred objects"
    return docs


@pytest.mark.parametrize("order", ["as-is", "reversed", "shuffled"])
def test_streamed_verdicts_match_the_whole_input(
    order: str, corpus_docs: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small chunks: claims, templates, classes and namespaces arrive before and after the workloads
    # that read them, in other chunks and other files.
    monkeypatch.setattr(pipeline, "CHUNK", 7)
    docs = list(corpus_docs)
    if order == "reversed":
        docs.reverse()
    elif order == "shuffled":
        random.Random(32).shuffle(docs)
    half = len(docs) // 2
    (tmp_path / "a.yaml").write_text("---\n".join(docs[:half]), encoding="utf-8")
    (tmp_path / "b.yaml").write_text("---\n".join(docs[half:]), encoding="utf-8")
    got = _assert_same([str(tmp_path)], policies=POLICIES, inventory=INVENTORY)
    assert got.report.findings, "the corpus has findings to compare"


def _template(ns: str, name: str, cls: str) -> str:
    return (
        f"apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata:\n  name: {name}\n"
        f"  namespace: {ns}\nspec:\n  spec:\n    devices:\n      requests:\n      - name: gpu\n"
        f"        exactly:\n          deviceClassName: {cls}\n"
    )


def _vllm(ns: str, name: str, template: str) -> str:
    return (
        f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n"
        f"  template:\n    spec:\n      containers:\n      - name: c\n        image: vllm/vllm-openai:v0.6\n"
        f"        resources:\n          claims:\n          - name: gpu\n      resourceClaims:\n"
        f"      - name: gpu\n        resourceClaimTemplateName: {template}\n"
    )


def test_a_template_read_after_the_workload_still_decides_its_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LLM workload names a template on the wrong GPU class that is read only later, in
    another file: it is judged again once the template is known."""
    monkeypatch.setattr(pipeline, "CHUNK", 1)
    (tmp_path / "a-workloads.yaml").write_text(
        "---\n".join(_vllm("ml", f"serve-{i}", "gpu-small") for i in range(3)), encoding="utf-8"
    )
    (tmp_path / "b-templates.yaml").write_text(_template("ml", "gpu-small", "gpu.nvidia.com-a100"),
                                               encoding="utf-8")
    got = _assert_same([str(tmp_path)], policies=POLICIES, inventory=INVENTORY)
    tier = [f for f in got.report.findings if f.rule.startswith("tier/")]
    assert sorted(f.object.name for f in tier) == ["serve-0", "serve-1", "serve-2"]


def write_gpu_workloads(path: Path, size: int) -> None:
    """About `size` bytes of GPU Deployments: legacy `nvidia.com/gpu` limits and claim templates."""
    parts: list[str] = []
    total, i = 0, 0
    while total < size:
        ns = f"team-{i % 5}"
        if i % 10 == 0:
            doc = _template(ns, f"gpu-{i % 3}", "gpu.nvidia.com-h100")
        elif i % 2:
            doc = _vllm(ns, f"serve-{i}", f"gpu-{i % 3}")
        else:
            doc = (
                f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: train-{i}\n  namespace: {ns}\n"
                f"spec:\n  replicas: {1 + i % 3}\n  template:\n    spec:\n      containers:\n"
                "      - name: c\n"
                f"        image: example.com/trainer:{i}\n        resources:\n          limits:\n"
                f"            nvidia.com/gpu: {1 + i % 2}\n"
            )
        parts.append(doc)
        total += len(doc) + 4
        i += 1
    path.write_text("---\n".join(parts), encoding="utf-8")


def test_stdin_is_streamed_and_read_again_like_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stdin is copied to a temporary file and streamed: workloads read before the templates they
    name are judged again from it, and the report is the file's, named <stdin>."""
    monkeypatch.setattr(pipeline, "CHUNK", 2)
    text = "---\n".join([*(_vllm("ml", f"serve-{i}", "gpu-small") for i in range(5)),
                         _template("ml", "gpu-small", "gpu.nvidia.com-a100")])
    f = tmp_path / "in.yaml"
    f.write_text(text, encoding="utf-8")
    from_file = _streamed([str(f)], policies=POLICIES, inventory=INVENTORY)
    from_stdin = _streamed(["-"], policies=POLICIES, inventory=INVENTORY, stdin=io.StringIO(text))
    assert sum(x.rule.startswith("tier/") for x in from_stdin.report.findings) == 5
    shown = from_file.files[0]
    def rows(r: pipeline.ReviewResult) -> list[str]:  # all but the file, which differs by design
        return [repr(_row(x)[:4] + _row(x)[5:]) for x in r.report.findings]

    assert [row.replace("<stdin>", shown) for row in rows(from_stdin)] == rows(from_file)
    assert {x.file for x in from_stdin.report.findings} == {"<stdin>"}


def test_memory_follows_the_largest_document_not_the_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reviewing 4x the documents adds only their findings and a compact record each to the peak;
    reading the whole input first (what review did before it streamed) adds every document."""
    monkeypatch.setattr(pipeline, "CHUNK", 32)  # both inputs span many chunks, as large ones do
    small, large = tmp_path / "small.yaml", tmp_path / "large.yaml"
    write_gpu_workloads(small, 100_000)
    write_gpu_workloads(large, 400_000)

    def peak(fn: Callable[[], object]) -> int:
        tracemalloc.start()
        try:
            fn()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    kw = {"policies": POLICIES, "inventory": INVENTORY}
    pipeline.review([str(small)], **kw)  # imports and caches, outside the measure
    streamed = [peak(lambda p=p: pipeline.review([str(p)], **kw)) for p in (small, large)]
    whole = [peak(lambda p=p: read_file(p)) for p in (small, large)]
    assert whole[1] > 3 * whole[0], whole  # the documents really are 4x as many
    assert streamed[1] < whole[1] / 2, (streamed, whole)
    assert streamed[1] - streamed[0] < (whole[1] - whole[0]) / 2, (streamed, whole)


def test_files_are_read_one_document_at_a_time(tmp_path: Path) -> None:
    """The second document's error is only met after the first document was handed on."""
    f = tmp_path / "x.yaml"
    f.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\nkey: [unclosed\n",
                 encoding="utf-8")
    it = iter_file(f, "x.yaml")
    objs, _ = next(it)
    assert [o.obj["metadata"]["name"] for o in objs] == ["a"]
    with pytest.raises(InputError, match=r"x.yaml:7:1: invalid YAML"):
        next(it)


def test_streamed_errors_are_the_whole_file_errors(tmp_path: Path) -> None:
    cases = {
        "bad-utf8.yaml": b"apiVersion: v1\nkind: ConfigMap\n# \xff\xfe\n",
        "dup.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  name: b\n",
        "bomb.yaml": b"a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + b"".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n".encode()
                   for i in range(6)),
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(InputError) as whole:
            read_file(path, name)
        with pytest.raises(InputError) as streamed:
            for _ in iter_file(path, name):
                pass
        assert str(streamed.value) == str(whole.value), name


def test_progress_goes_to_stderr_only_when_asked(
    draguard: Callable[..., Run], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline._Ticker, "EVERY", 0.0)
    f = tmp_path / "many.yaml"
    write_gpu_workloads(f, 300_000)
    quiet = draguard("review", str(f), "--policies", POLICIES, "-f", "json")
    loud = draguard("review", str(f), "--policies", POLICIES, "-f", "json", "--progress")
    assert quiet.err == ""
    lines = loud.err.splitlines()
    assert any(line.startswith("draguard: ") and "objects reviewed" in line for line in lines), loud.err
    assert lines[-1].startswith("draguard: reviewed ") and " objects from 1 files in " in lines[-1]
    # stdout stays the machine format, unchanged by progress.
    assert json.loads(loud.out)["findings"] == json.loads(quiet.out)["findings"]
