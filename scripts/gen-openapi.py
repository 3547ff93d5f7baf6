#!/usr/bin/env python3
"""Regenerate webhook/review/schemas/k8s-<release>.json.gz from a kube-apiserver's /openapi/v3.

    .venv/bin/python scripts/gen-openapi.py                 # starts the built etcd + kube-apiserver
    .venv/bin/python scripts/gen-openapi.py --server URL --ca CA --cert CRT --key KEY

Without --server it starts the binaries scripts/build-k8s.sh builds (~/.cache/draguard/k8s/<version>/bin,
or $DRAGUARD_K8S_BIN) with every resource.k8s.io version served, reads the group documents draguard
reviews, trims them (webhook/review/openapi.py: `trim`) and writes the file for the server's release.
"""

from __future__ import annotations

import argparse
import json
import shutil
import ssl
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from webhook.review.openapi import ROOT_KINDS, encode, trim  # noqa: E402

# Served off by default in recent releases; the file must cover every version draguard reads.
RUNTIME_CONFIG = "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"


def group_paths() -> list[str]:
    return sorted({"api/v1" if av == "v1" else f"apis/{av}" for av in ROOT_KINDS})


def fetch(get: Any) -> dict[str, Any]:
    """The trimmed schema set from a server, `get(path) -> JSON`."""
    version = get("/version")["gitVersion"]
    index = get("/openapi/v3")["paths"]
    docs = {}
    for path in group_paths():
        if path not in index:
            raise SystemExit(f"gen-openapi: the API server serves no /openapi/v3/{path} (runtime config?)")
        docs[path] = get(index[path]["serverRelativeURL"])
    return trim(docs, version.removeprefix("v").split("-")[0].split("+")[0])


def client(url: str, ca: str, cert: str, key: str) -> Any:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)

    def get(path: str) -> Any:
        req = urllib.request.Request(url.rstrip("/") + path, headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=60) as resp:
            return json.loads(resp.read())

    return get


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", help="a running API server's URL (otherwise the built one is started)")
    ap.add_argument("--ca")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--out", type=Path, default=ROOT / "webhook" / "review" / "schemas")
    args = ap.parse_args()
    if args.server:
        if not (args.ca and args.cert and args.key):
            ap.error("--server needs --ca, --cert and --key (a client certificate that may read /openapi)")
        data = fetch(client(args.server, args.ca, args.cert, args.key))
    else:
        from tests.apiserver import find_bin, start

        bin_dir = find_bin()
        if bin_dir is None:
            raise SystemExit("gen-openapi: no etcd/kube-apiserver binaries: run scripts/build-k8s.sh first")
        base = Path(tempfile.mkdtemp(prefix="dg-openapi-", dir="/tmp"))
        server = start(bin_dir, base, runtime_config=RUNTIME_CONFIG)
        try:
            data = fetch(lambda p: server.request("GET", p))
        finally:
            server.stop()
            shutil.rmtree(base, ignore_errors=True)
    release = ".".join(data["kubernetes"].split(".")[:2])
    out = args.out / f"k8s-{release}.json.gz"
    out.write_bytes(encode(data))
    kinds, schemas = len(data["roots"]), len(data["schemas"])
    print(f"{out}: Kubernetes {data['kubernetes']}, {kinds} kinds, {schemas} schemas")
    return 0


if __name__ == "__main__":
    sys.exit(main())
