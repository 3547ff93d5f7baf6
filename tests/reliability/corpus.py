"""The hostile-input corpus, generated in code (deterministic; `python -m tests.reliability.corpus DIR`
writes it out as files for inspection).

Two halves:
- `review_cases()`: HTTP bodies for POST /validate and /mutate (malformed JSON, wrong types at every
  level of an AdmissionReview, hostile objects inside well-formed reviews, bodies over 3 MiB,
  deep nesting, unicode and invalid UTF-8, CEL with huge cost).
- `manifest_cases()`: files for `draguard review` (the same hostile objects as YAML/JSON, plus YAML
  bombs, deep YAML nesting, Python tags, bad encodings, oversized files).
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UID = "5b0f9c1e-0000-4000-8000-00000000beef"
MIB = 1024 * 1024


@dataclass(frozen=True)
class Case:
    id: str
    body: bytes
    # For manifests: the file name suffix decides how review reads it.
    suffix: str = ".yaml"


def base_objects() -> dict[str, tuple[str, str, str, dict[str, Any]]]:
    """name -> (group, version, kind, object): the shapes the webhook checks."""
    sel = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
    return {
        "pod": ("", "v1", "Pod", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": [{"name": "c", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
        "deployment": ("apps", "v1", "Deployment", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "team-a"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d"}}, "template": {
                "metadata": {"labels": {"app": "d", "draguard.io/workload-class": "llm"}},
                "spec": {"containers": [{"name": "s", "image": "vllm/vllm-openai:v0.6.3",
                                         "resources": {"claims": [{"name": "gpu"}]}}],
                         "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-h100"}]}}}}),
        "claim": ("resource.k8s.io", "v1", "ResourceClaim", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "team-a"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com-h100", "count": 1,
                "selectors": [{"cel": {"expression": sel}}]}}],
                "constraints": [{"requests": ["gpu"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}]}}}),
        "deviceclass": ("resource.k8s.io", "v1", "DeviceClass", {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "x"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}),
        "template-v1beta1": ("resource.k8s.io", "v1beta1", "ResourceClaimTemplate", {
            "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t", "namespace": "team-a"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu",
                                                        "deviceClassName": "gpu.nvidia.com-a100",
                                                        "count": 2}]}}}}),
    }  # fmt: skip


# Paths (into each base object) where a hostile value is planted.
PATHS: dict[str, list[tuple[Any, ...]]] = {
    "pod": [
        ("metadata",),
        ("metadata", "name"),
        ("metadata", "labels"),
        ("spec",),
        ("spec", "containers"),
        ("spec", "containers", 0),
        ("spec", "containers", 0, "resources"),
        ("spec", "containers", 0, "resources", "limits"),
        ("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"),
        ("spec", "containers", 0, "image"),
    ],
    "deployment": [
        ("spec", "replicas"),
        ("spec", "template"),
        ("spec", "template", "spec"),
        ("spec", "template", "metadata", "labels"),
        ("spec", "template", "spec", "resourceClaims"),
        ("spec", "template", "spec", "resourceClaims", 0, "resourceClaimTemplateName"),
        ("spec", "template", "spec", "containers", 0, "resources", "claims"),
    ],
    "claim": [
        ("spec", "devices"),
        ("spec", "devices", "requests"),
        ("spec", "devices", "requests", 0, "exactly"),
        ("spec", "devices", "requests", 0, "exactly", "count"),
        ("spec", "devices", "requests", 0, "exactly", "deviceClassName"),
        ("spec", "devices", "requests", 0, "exactly", "selectors"),
        ("spec", "devices", "requests", 0, "exactly", "selectors", 0, "cel", "expression"),
        ("spec", "devices", "constraints"),
        ("spec", "devices", "constraints", 0, "matchAttribute"),
    ],
    "deviceclass": [("spec",), ("spec", "selectors"), ("spec", "selectors", 0, "cel", "expression")],
    "template-v1beta1": [
        ("spec", "spec"),
        ("spec", "spec", "devices", "requests", 0, "count"),
        ("spec", "spec", "devices", "requests", 0, "deviceClassName"),
    ],
}

HOSTILE_VALUES: dict[str, Any] = {
    "null": None,
    "empty-str": "",
    "int": 7,
    "negative": -1,
    "int-huge": 2**80,
    "float-huge": 1.7e308,
    "bool": True,
    "list": [1, "a", None],
    "dict": {"a": {"b": "c"}},
    "unicode": "\u202e\U0001f600\u0000名前\ufeff",
    "long-str": "x" * 70000,
}


def _plant(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(obj)
    cur = out
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value
    return out


def _nest(depth: int, leaf: Any = "x") -> Any:
    v: Any = leaf
    for i in range(depth):
        v = {"n": v} if i % 2 else [v]
    return v


def hostile_objects() -> Iterator[tuple[str, str, str, str, Any]]:
    """(id, group, version, kind, object) for every planted hostile value, plus special shapes."""
    bases = base_objects()
    for name, paths in PATHS.items():
        group, version, kind, obj = bases[name]
        for path in paths:
            for vname, value in HOSTILE_VALUES.items():
                pid = "/".join(str(p) for p in path)
                yield f"{name}:{pid}={vname}", group, version, kind, _plant(obj, path, value)
    g, v, k, claim = bases["claim"]
    expr = ("spec", "devices", "requests", 0, "exactly", "selectors", 0, "cel", "expression")
    cel = {
        "cel-nested-comprehension": "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, "
        "[1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, a+b+c+d > 0))))",
        "cel-regex-backtrack": "device.attributes['gpu.nvidia.com'].productName.matches('^(a+)+$')",
        "cel-100kb": " || ".join(["device.driver == 'gpu.nvidia.com'"] * 3000),
        "cel-deep-parens": "(" * 400 + "true" + ")" * 400,
        "cel-string-blowup": "'"
        + "a" * 1000
        + "'.size() > 0 && "
        + " && ".join(["device.attributes['gpu.nvidia.com'].productName + 'x' != ''"] * 50),
        "cel-syntax": "device.attributes[",
        "cel-wrong-type": "device.capacity['gpu.nvidia.com'].memory > 1",
        "cel-unicode": "device.attributes['gpu.nvidia.com'].productName == '\u202e\U0001f600'",
        "cel-nul": "device.driver == '\u0000'",
        "cel-list-of-1000": "device.driver in [" + ",".join(f"'d{i}'" for i in range(1000)) + "]",
    }
    for cid, e in cel.items():
        yield cid, g, v, k, _plant(claim, expr, e)
    _g, _v, _k, pod = bases["pod"]
    yield "pod-deep-nesting-900", "", "v1", "Pod", _plant(pod, ("metadata", "annotations"), {"a": _nest(900)})
    yield (
        "pod-10k-labels",
        "",
        "v1",
        "Pod",
        _plant(pod, ("metadata", "labels"), {f"k{i}": "v" for i in range(10000)}),
    )
    many = [
        {"name": f"c{i}", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}} for i in range(3000)
    ]
    yield "pod-3000-containers", "", "v1", "Pod", _plant(pod, ("spec", "containers"), many)
    yield "pod-unicode-name", "", "v1", "Pod", _plant(pod, ("metadata", "name"), "ポッド-\U0001f680-\u200d")
    yield "pod-rtl-namespace", "", "v1", "Pod", _plant(pod, ("metadata", "namespace"), "\u202eteam-a")
    yield "not-an-object-list", "", "v1", "Pod", [pod]
    yield "not-an-object-str", "", "v1", "Pod", "apiVersion: v1"
    yield "kind-mismatch", "", "v1", "Pod", bases["claim"][3]


def _review(obj: Any, group: str, version: str, kind_: str, **over: Any) -> dict[str, Any]:
    req: dict[str, Any] = {
        "uid": UID,
        "kind": {"group": group, "version": version, "kind": kind_},
        "resource": {"group": group, "version": version, "resource": kind_.lower() + "s"},
        "namespace": "team-a",
        "operation": "CREATE",
        "userInfo": {"username": "hostile"},
        "object": obj,
        "oldObject": None,
    }
    req.update(over)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")


def review_cases() -> list[Case]:
    """HTTP bodies for the webhook endpoints."""
    cases: list[Case] = []
    bases = base_objects()
    good = _dumps(_review(bases["pod"][3], "", "v1", "Pod"))
    # Truncated at 40 points through the body.
    for i in range(1, 41):
        cut = len(good) * i // 41
        cases.append(Case(f"truncated-{i:02d}", good[:cut]))
    raw = {
        "empty": b"",
        "whitespace": b"   \n",
        "not-json": b"apiVersion: admission.k8s.io/v1\nkind: AdmissionReview\n",
        "json-null": b"null",
        "json-number": b"42",
        "json-string": b'"AdmissionReview"',
        "json-list": b"[]",
        "nan": b'{"apiVersion": NaN}',
        "invalid-utf8": b'{"apiVersion": "admission.k8s.io/v1", "x": "\xff\xfe"}',
        "utf16": good.decode().encode("utf-16"),
        "bom": b"\xef\xbb\xbf" + good,
        "lone-surrogate": b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
        b'{"uid": "\\ud800", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": {"metadata": '
        b'{"name": "\\udfff"}}}}',
        "deep-array-100k": b"[" * 100000 + b"]" * 100000,
        "deep-object-100k": b'{"a":' * 100000 + b"1" + b"}" * 100000,
        "deep-in-request-5k": _dumps(_review("@", "", "v1", "Pod")).replace(
            b'"@"', b'{"n":[' * 2500 + b"1" + b"]}" * 2500
        ),
        "duplicate-keys": b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", '
        b'"request": {"uid": "a"}, '
        b'"request": "b"}',
        "big-number": b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", '
        b'"request": {"uid": "u", '
        b'"object": {"spec": {"replicas": 1' + b"0" * 5000 + b"}}}}",
    }
    for cid, body in raw.items():
        cases.append(Case(cid, body))
    pod = bases["pod"][3]
    envelopes: dict[str, Any] = {
        "review-v1beta1": {**_review(pod, "", "v1", "Pod"), "apiVersion": "admission.k8s.io/v1beta1"},
        "review-no-kind": {k: v for k, v in _review(pod, "", "v1", "Pod").items() if k != "kind"},
        "review-kind-wrong": {**_review(pod, "", "v1", "Pod"), "kind": "Pod"},
        "review-no-request": {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
        "review-request-list": {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": [],
        },
        "review-request-str": {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": "x",
        },
        "review-uid-int": _review(pod, "", "v1", "Pod", uid=12),
        "review-uid-empty": _review(pod, "", "v1", "Pod", uid=""),
        "review-uid-huge": _review(pod, "", "v1", "Pod", uid="u" * 100000),
        "review-kind-str": _review(pod, "", "v1", "Pod", kind="Pod"),
        "review-kind-null": _review(pod, "", "v1", "Pod", kind=None),
        "review-operation-int": _review(pod, "", "v1", "Pod", operation=1),
        "review-operation-unknown": _review(pod, "", "v1", "Pod", operation="EXPLODE"),
        "review-namespace-list": _review(pod, "", "v1", "Pod", namespace=["a"]),
        "review-dryrun-str": _review(pod, "", "v1", "Pod", dryRun="yes"),
        "review-subresource-int": _review(pod, "", "v1", "Pod", subResource=3),
        "review-object-null": _review(None, "", "v1", "Pod"),
        "review-object-int": _review(5, "", "v1", "Pod"),
        "review-update-old-garbage": _review(pod, "", "v1", "Pod", operation="UPDATE", oldObject="garbage"),
        "review-unknown-kind": _review(pod, "example.com", "v1", "Widget"),
        "review-dra-unknown-version": _review(
            bases["claim"][3], "resource.k8s.io", "v1alpha9", "ResourceClaim"
        ),
        "review-userinfo-huge": _review(pod, "", "v1", "Pod", userInfo={"groups": ["g"] * 50000}),
    }
    for cid, doc in envelopes.items():
        cases.append(Case(cid, _dumps(doc)))
    for cid, group, version, kind, obj in hostile_objects():
        cases.append(Case(f"object:{cid}", _dumps(_review(obj, group, version, kind))))
    # Over the 3 MiB limit (valid JSON, so only the size is wrong).
    big = _review(_plant(pod, ("metadata", "annotations"), {"pad": "x" * (3 * MIB + 10)}), "", "v1", "Pod")
    cases.append(Case("body-over-3mib", _dumps(big)))
    return cases


YAML_SPECIAL: dict[str, bytes] = {
    "billion-laughs": (
        b"a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + b"".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n".encode()
            for i in range(8)
        )
        + b"kind: Pod\napiVersion: v1\nmetadata: {name: bomb, labels: *i}\nspec: {containers: *i}\n"
    ),
    "alias-bomb-in-spec": (
        b"apiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec:\n  x0: &x0 {c: [{name: a, image: b}]}\n"
        + b"".join(
            f"  x{i}: &x{i} [*x{i - 1}, *x{i - 1}, *x{i - 1}, *x{i - 1}]\n".encode() for i in range(1, 14)
        )
        + b"  containers: *x13\n"
    ),
    "deep-flow-nesting": b"apiVersion: v1\nkind: Pod\nmetadata: {name: d}\nspec: "
    + b"[" * 20000
    + b"]" * 20000
    + b"\n",
    "deep-block-nesting": b"apiVersion: v1\nkind: Pod\nmetadata:\n"
    + b"".join(b"  " * (i + 1) + f"k{i}:\n".encode() for i in range(3000)),
    "python-object-tag": b"!!python/object/apply:os.system ['echo pwned']\n",
    "python-name-tag": b"apiVersion: v1\nkind: !!python/name:os.system Pod\n",
    "unknown-tag": b"apiVersion: v1\nkind: Pod\nmetadata: !Secret {name: x}\n",
    "tabs": b"apiVersion: v1\nkind: Pod\nmetadata:\n\tname: x\n",
    "unclosed-quote": b"apiVersion: v1\nkind: Pod\nmetadata: {name: 'x}\n",
    "duplicate-keys": b"apiVersion: v1\nkind: Pod\nkind: Deployment\nmetadata: {name: x}\n",
    "binary": bytes(range(256)) * 4,
    "latin1": "apiVersion: v1\nkind: Pod\nmetadata: {name: caf\xe9}\n".encode("latin-1"),
    "utf16": "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n".encode("utf-16"),
    "nul-bytes": b"apiVersion: v1\x00\nkind: Pod\n",
    "only-comments": b"# nothing here\n---\n# still nothing\n",
    "scalar-doc": b"just a string\n",
    "list-doc": b"- 1\n- 2\n",
    "many-docs-garbage": b"\n---\n".join(
        [b"apiVersion: v1\nkind: Pod\nmetadata: {name: ok}", b": : :", b"[1, 2"]
    ),
    "list-kind-garbage-items": b"apiVersion: v1\nkind: List\nitems: [1, 'two', null, [3]]\n",
    "list-kind-items-str": b"apiVersion: v1\nkind: List\nitems: nope\n",
    "huge-int": b"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: "
    + b"9" * 5000
    + b"}\n",
    "float-inf": b"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: .inf}\n",
    "timestamps": b"apiVersion: v1\nkind: Pod\nmetadata: {name: 2024-01-01}\n"
    b"spec: {containers: 2001-12-14t21:59:43.10-05:00}\n",
    "merge-key": b"base: &b {apiVersion: v1, kind: Pod}\n<<: *b\nmetadata: {name: m}\n",
    "over-3mib": b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: big\n  annotations:\n    pad: "
    + b"x" * (3 * MIB + 10)
    + b"\n",
    "json-truncated": b'{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"',
    "json-deep": b'{"apiVersion": "v1", "kind": "Pod", "spec": ' + b"[" * 100000 + b"]" * 100000 + b"}",
}


def manifest_cases() -> list[Case]:
    """Files for `draguard review`."""
    import yaml

    cases: list[Case] = []
    for cid, _g, _v, _k, obj in hostile_objects():
        try:
            text = yaml.safe_dump(obj, allow_unicode=True, sort_keys=False)
            cases.append(Case(f"yaml:{cid}", text.encode("utf-8", "surrogatepass")))
        except RecursionError:  # too deep for the YAML emitter: the same object as JSON
            cases.append(Case(f"json:{cid}", _dumps(obj), ".json"))
    for cid, body in YAML_SPECIAL.items():
        suffix = ".json" if cid.startswith("json") else ".yaml"
        cases.append(Case(f"special:{cid}", body, suffix))
    return cases


def write_corpus(out: Path) -> int:
    """Write every case as a file (review bodies as .json, manifests as .yaml/.json)."""
    n = 0
    for sub, cases in (("reviews", review_cases()), ("manifests", manifest_cases())):
        d = out / sub
        d.mkdir(parents=True, exist_ok=True)
        for i, c in enumerate(cases):
            safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in c.id)[:80]
            suffix = ".json" if sub == "reviews" else c.suffix
            (d / f"{i:03d}-{safe}{suffix}").write_bytes(c.body)
            n += 1
    return n


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "corpus")
    print(f"wrote {write_corpus(target)} files under {target}")
