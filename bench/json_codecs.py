"""AdmissionReview parse and response serialise: the standard json module against orjson and msgspec.

    .venv/bin/python bench/json_codecs.py [--rounds 7] [--number 2000]

The bodies are bench/webhook.py's mixed review stream (legacy Pods, Deployments with claims, a
DeviceClass) plus one Deployment of about 185 KiB (60 containers with 40 env entries each, the size a
large Helm-rendered workload reaches). The responses are what draguard answers: an allow with one warning,
a denial with findings, and a mutating patch. Each codec is timed on the same objects, the codecs
interleaved round by round; the least time per call over the rounds is printed, with its ratio to
the standard library measured in the same run. Codecs that are not installed are listed as missing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _large_body() -> bytes:
    containers = [
        {
            "name": f"c{i}",
            "image": f"registry.example.com/team/app-{i}:v1.2.3",
            "env": [{"name": f"VAR_{i}_{j}", "value": "x" * 40} for j in range(40)],
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
        }
        for i in range(60)
    ]
    obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "big", "namespace": "ml", "labels": {"app": "big"}},
        "spec": {"template": {"metadata": {"labels": {"app": "big"}}, "spec": {"containers": containers}}},
    }
    doc = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "big-0",
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "object": obj,
        },
    }
    return json.dumps(doc).encode()


def _responses() -> list[dict[str, Any]]:
    def doc(resp: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}

    return [
        doc(
            {
                "uid": "u-1",
                "allowed": True,
                "warnings": ["draguard: legacy/nvidia-gpu: use a claim " + "x" * 60],
            }
        ),
        doc(
            {
                "uid": "u-2",
                "allowed": False,
                "status": {"code": 403, "reason": "Forbidden", "message": "tier/llm: " + "y" * 400},
                "warnings": [f"draguard: finding {i} " + "z" * 80 for i in range(6)],
                "auditAnnotations": {"draguard.io/findings": "tier/llm,quota/team"},
            }
        ),
        doc({"uid": "u-3", "allowed": True, "patchType": "JSONPatch", "patch": "W3sib3AiOiJhZGQi" * 40}),
    ]


def codecs() -> dict[str, tuple[Callable[[bytes], Any], Callable[[Any], bytes]] | str]:
    out: dict[str, tuple[Callable[[bytes], Any], Callable[[Any], bytes]] | str] = {
        "json": (json.loads, lambda o: json.dumps(o, separators=(",", ":")).encode()),
    }
    try:
        orjson: Any = importlib.import_module("orjson")
        out["orjson"] = (orjson.loads, orjson.dumps)
    except ImportError:
        out["orjson"] = "missing"
    try:
        msgspec: Any = importlib.import_module("msgspec")
        dec, enc = msgspec.json.Decoder(), msgspec.json.Encoder()
        out["msgspec"] = (dec.decode, enc.encode)
    except ImportError:
        out["msgspec"] = "missing"
    return out


def _time(fn: Callable[[Any], Any], arg: Any, number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn(arg)
    return (time.perf_counter() - t0) / number


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--number", type=int, default=2000, help="calls per timing (the large body: 1/50 of it)")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    from bench.webhook import reviews

    stream = reviews()
    big = _large_body()
    responses = _responses()
    cs = codecs()
    ready = {n: c for n, c in cs.items() if not isinstance(c, str)}
    # Every codec must read the bodies back to what the standard library reads.
    for name, (loads, dumps) in ready.items():
        for b in (*stream, big):
            assert loads(b) == json.loads(b), name
        for r in responses:
            assert json.loads(dumps(r)) == r, name
    cases: list[tuple[str, str, Any, int]] = [
        ("parse", "mixed stream (5 reviews, mean)", stream, args.number),
        ("parse", f"large Deployment ({len(big) // 1024} KiB)", [big], max(1, args.number // 50)),
        ("serialise", "responses (3 shapes, mean)", responses, args.number),
    ]
    best: dict[tuple[str, str], float] = {}
    for _ in range(args.rounds):
        for op, label, items, number in cases:
            for name, (loads, dumps) in ready.items():
                fn = loads if op == "parse" else dumps
                t = sum(_time(fn, it, number) for it in items) / len(items)
                key = (f"{op}: {label}", name)
                best[key] = min(best.get(key, float("inf")), t)
    print(f"least time per call over {args.rounds} interleaved rounds (ratio: standard json / codec)")
    print(f"{'case':<46} " + " ".join(f"{n:>20}" for n in cs))
    rows = []
    for op, label, _items, _n in cases:
        case = f"{op}: {label}"
        base = best[(case, "json")]
        cells = []
        row: dict[str, Any] = {"case": case}
        for n in cs:
            if (case, n) not in best:
                cells.append(f"{'missing':>20}")
                continue
            t = best[(case, n)]
            row[n] = {"us": t * 1e6, "speedup": base / t}
            cells.append(f"{t * 1e6:>9.1f} µs ({base / t:>4.1f}x)")
        rows.append(row)
        print(f"{case:<46} " + " ".join(cells))
    versions = {n: getattr(importlib.import_module(n), "__version__", "?") for n in ready if n != "json"}
    print("versions:", versions or "none installed")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "versions": versions}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
