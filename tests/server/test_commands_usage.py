"""`draguard quota render|usage` and the DRA health figures derived from cached claims."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.server.conftest import ROOT, run_cli, seed_inventory
from webhook.server.caches import allocation_seconds
from webhook.server.usage import dra_stats

QUOTA = """
apiVersion: policy.draguard.io/v1alpha1
kind: GpuQuotaPolicy
metadata: {name: budgets}
spec:
  mode: enforce
  budgets:
  - namespace: team-a
    deviceClasses: {gpu.nvidia.com-a100: 4}
    claims: 10
"""


def claim(name: str, ns: str, cls: str, count: int, allocated: list[str] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls, "count": count}}]}
        },
    }
    if allocated is not None:
        obj["status"] = {
            "allocation": {
                "allocationTimestamp": "2026-01-01T00:00:12Z",
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node1", "device": d}
                        for d in allocated
                    ]
                },
            }
        }
    return obj


def test_quota_render_prints_resource_quotas(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "q.yaml").write_text(QUOTA)
    assert run_cli(["quota", "render", "--policies", str(tmp_path)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs[0]["kind"] == "ResourceQuota" and docs[0]["metadata"]["namespace"] == "team-a"
    assert docs[0]["spec"]["hard"]["gpu.nvidia.com-a100.deviceclass.resource.k8s.io/devices"] == "4"


def test_quota_usage_from_claims_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "q.yaml").write_text(QUOTA)
    claims = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            claim("a", "team-a", "gpu.nvidia.com-a100", 2),
            claim("b", "team-a", "gpu.nvidia.com-a100", 1),
        ],
    }
    (tmp_path / "claims.json").write_text(json.dumps(claims))
    inv = ROOT / "tests" / "fixtures" / "seed" / "cluster-inventory.yaml"
    assert (
        run_cli(
            [
                "quota",
                "usage",
                "--policies",
                str(tmp_path / "q.yaml"),
                "--claims",
                str(tmp_path / "claims.json"),
                "--inventory",
                str(inv),
                "-o",
                "json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert {"scope": "team-a", "deviceClass": "gpu.nvidia.com-a100", "devices": 3} in out["devices"]
    assert out["budgets"][0]["deviceClasses"] == {"gpu.nvidia.com-a100": 4}


def test_quota_usage_reports_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "q.yaml").write_text(QUOTA)
    rc = run_cli(["quota", "usage", "--policies", str(tmp_path), "--claims", str(tmp_path / "missing.yaml")])
    assert rc == 2 and "missing.yaml" in capsys.readouterr().err


def test_dra_stats_from_cached_claims() -> None:
    inv = seed_inventory()
    claims = [
        claim("a", "team-a", "gpu.nvidia.com-a100", 2, allocated=["gpu-0", "gpu-1"]),
        claim("b", "team-a", "gpu.nvidia.com-a100", 1),
    ]
    s = dra_stats(inv, claims)
    assert (s.claims_total, s.claims_pending, s.claims_allocated) == (2, 1, 1)
    assert s.devices_allocated == {"gpu.nvidia.com-a100": 2}
    from webhook.engine.quota import QuotaCalculator

    matching = QuotaCalculator(inv).matching("gpu.nvidia.com-a100") or []
    assert matching and s.devices_available["gpu.nvidia.com-a100"] == len(matching) - 2
    assert allocation_seconds(claims[0]) == 12.0 and allocation_seconds(claims[1]) is None


def test_rebuilder_reuses_inventory_until_dra_objects_change() -> None:
    from webhook.server.caches import ClusterCache
    from webhook.server.metrics import Metrics
    from webhook.server.usage import Rebuilder

    seed = ROOT / "tests" / "fixtures" / "seed"
    objs = [o for o in yaml.safe_load(seed.joinpath("cluster-inventory.yaml").read_text())["items"]]
    classes = [o for o in yaml.safe_load_all(seed.joinpath("deviceclasses.yaml").read_text()) if o]
    cache = ClusterCache(http=None, metrics=Metrics(), dra_version="v1", served=frozenset({"v1"}))

    def put(name: str, items: list[dict[str, Any]]) -> None:
        store = cache.reflectors[name].store
        store.clear()
        for i, o in enumerate(items):
            o.setdefault("metadata", {}).setdefault("resourceVersion", str(i + 1))
            meta = o["metadata"]
            store[(meta.get("namespace") or "", meta["name"])] = o

    put("resourceslices", objs)
    put("deviceclasses", classes)
    put(
        "namespaces",
        [{"metadata": {"name": "team-a", "labels": {"draguard.io/team": "vision"}, "resourceVersion": "1"}}],
    )
    put("resourceclaims", [claim("a", "team-a", "gpu.nvidia.com-a100", 2)])
    from webhook.policy.load import load_policies

    policies = load_policies(ROOT / "policies")
    rb = Rebuilder(cache, Metrics(), lambda v: None, lambda: policies)
    v1 = rb.build()
    assert len(v1.inventory.devices) > 0 and "gpu.nvidia.com-a100" in v1.inventory.classes
    assert v1.usage is not None and v1.usage.devices[("team:vision", "gpu.nvidia.com-a100")] == 2
    # Only a namespace label changed: the inventory (and what the engine memoised on it) is kept.
    put("namespaces", [{"metadata": {"name": "team-a", "labels": {}, "resourceVersion": "2"}}])
    v2 = rb.build()
    assert v2.inventory is v1.inventory
    assert v2.usage is not None and ("team:vision", "gpu.nvidia.com-a100") not in v2.usage.devices
    # A new claim: a new inventory that knows it.
    put(
        "resourceclaims",
        [claim("a", "team-a", "gpu.nvidia.com-a100", 2), claim("b", "team-a", "gpu.nvidia.com-a100", 1)],
    )
    v3 = rb.build()
    assert v3.inventory is not v1.inventory and ("team-a", "b") in v3.inventory.claims
    assert v3.usage is not None and v3.usage.devices[("team-a", "gpu.nvidia.com-a100")] == 3
