"""Helpers for the adversarial suite: a 10,000-device inventory, RSS, hostile reviews and client
certificates (the server and its TLS clients are tests/reliability/conftest.py's WebhookProcess)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
import yaml

from tests import pki
from tests.reliability.conftest import ROOT, SEED, review_body

RSS_BOUND_MIB = 256
DEVICES = 10_000
PRODUCTS = (("NVIDIA A100 80GB PCIe", "80Gi"), ("NVIDIA H100 80GB HBM3", "80Gi"))


def write_big_inventory(path: Path, devices: int = DEVICES, per_node: int = 8) -> Path:
    """`devices` GPUs in ResourceSlices, 8 per node, A100 and H100 nodes alternating, plus the seed's
    DeviceClasses and an H100 claim template in team-a."""
    docs: list[Any] = []
    for n in range((devices + per_node - 1) // per_node):
        product, mem = PRODUCTS[n % 2]
        node = f"gpu-node-{n:05d}"
        devs = [
            {
                "name": f"gpu-{i}",
                "attributes": {
                    "uuid": {"string": f"GPU-{n:05d}-{i}"},
                    "productName": {"string": product},
                    "index": {"int": i},
                    "driverVersion": {"version": "550.54.15"},
                },
                "capacity": {"memory": {"value": mem}},
            }
            for i in range(min(per_node, devices - n * per_node))
        ]
        docs.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-gpu.nvidia.com"},
                "spec": {
                    "driver": "gpu.nvidia.com",
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devs,
                },
            }
        )
    docs += [d for d in yaml.safe_load_all((SEED / "deviceclasses.yaml").read_text()) if d]
    docs.append(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-h100", "namespace": "team-a"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-h100"}}]
                    }
                }
            },
        }
    )
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def rss_mib(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / (1024 * 1024)


def claim_review(name: str, selectors: list[str], uid: str, namespace: str = "team-a") -> bytes:
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": f"r{i}",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com-h100",
                            "selectors": [{"cel": {"expression": s}}],
                        },
                    }
                    for i, s in enumerate(selectors)
                ]
            }
        },
    }
    return json.dumps(
        review_body(obj, group="resource.k8s.io", kind="ResourceClaim", namespace=namespace, uid=uid)
    ).encode()


def unique_selector(tag: str, size: int = 7000) -> str:
    """A valid selector of about `size` bytes whose text (and so its compiled form) is unique."""
    terms: list[str] = []
    length = 0
    j = 0
    while length < size:
        t = f"device.attributes['gpu.nvidia.com'].productName == 'NVIDIA {tag} {j}'"
        terms.append(t)
        length += len(t) + 4
        j += 1
    return "device.driver == 'gpu.nvidia.com' && (" + " || ".join(terms) + ")"


# --- certificates ----------------------------------------------------------------------------------


def make_ca(name: str) -> pki.Issued:
    return pki.issue(name, ca=True)


def client_cert(ca: pki.Issued, cn: str, out: Path) -> tuple[Path, Path]:
    """A client certificate for `cn` signed by `ca`, written as out.crt / out.key."""
    key, cert = pki.issue(cn, ca)
    crt, k = out.with_suffix(".crt"), out.with_suffix(".key")
    crt.write_bytes(pki.pem(cert))
    k.write_bytes(pki.pem(key))
    return crt, k


def write_ca(ca: pki.Issued, path: Path) -> Path:
    path.write_bytes(pki.pem(ca[1]))
    return path


__all__ = ["ROOT", "RSS_BOUND_MIB"]
