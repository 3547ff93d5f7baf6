"""The peer benchmark's harness (`bench/peer.py --webhook`) and the peers' policies, on local control planes.

The quick run (baseline, null webhook, draguard) checks that the side-by-side harness runs end to end:
the namespaces' selectors route each create to its arm's webhook alone, draguard denies exactly the
objects the policy forbids, and the figures come from the server's own process and metrics. Kyverno
(a 35-minute build) and Gatekeeper (`scripts/build-gatekeeper.sh`, about 5 minutes) are not built in
CI; where Gatekeeper is built, its ConstraintTemplate is checked for what it denies and allows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import peer_gatekeeper as gk
from bench import peer_webhook as pw
from bench.apiserver import Api
from webhook.dev.cluster import ClusterError, LocalCluster, find_bin_dir, free_port

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_without_kyverno(tmp_path: Path) -> None:
    try:
        find_bin_dir()
    except ClusterError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"control-plane binaries missing under CI: {exc}")
        pytest.skip(str(exc))
    out = tmp_path / "peer.json"
    # Short: the drivers' unix sockets live under the state directory (107-byte limit).
    short = Path(tempfile.mkdtemp(prefix="dgp-"))
    state = short / "s"
    try:
        proc = subprocess.run(
            [sys.executable, "bench/peer.py", "--webhook", "--quick", "--arms", "none,null,draguard",
             "--state-dir", str(state), "--json", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        state_left = state.exists()
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    n = res["objects_per_arm"]
    forbidden = sorted(i for i in range(n) if pw.workload(i, "x")[2])
    assert forbidden and res["denied"] == {"none": [], "null": [], "draguard": forbidden}
    assert res["other_errors"] == {"none": 0, "null": 0, "draguard": 0}
    assert res["probes"]["none"]["a100"] == 201 and res["probes"]["null"]["a100"] == 201
    assert res["probes"]["draguard"]["a100"] == 403
    assert res["rows"]["null"]["server"]["reviews"] == n  # one call per create in its namespace
    server = res["rows"]["draguard"]["server"]
    assert server["reviews"] >= n  # every create in its namespace was reviewed
    assert server["cpu_s"] > 0 and server["rss_mib"] > 0
    row = res["rows"]["draguard"]["all"]
    assert row["n"] == n - len(forbidden)
    lo, hi = row["added_p50_ci90_ms"]
    assert lo <= hi
    assert "draguard: denied" in proc.stdout and "agrees" in proc.stdout
    assert not state_left  # the bench took its control plane down


# ---- Gatekeeper ---------------------------------------------------------------------------------


def _vllm_pod(ns: str, name: str, template: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    path, body, _ = pw.workload(0, ns)
    body["metadata"]["name"] = name
    body["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template
    body["spec"].update(extra)
    return path, body


@pytest.fixture(scope="module")
def gatekeeper() -> Iterator[tuple[Api, str]]:
    """Gatekeeper's webhook (scripts/build-gatekeeper.sh; not built in CI, so skipped there) with the
    bench's ConstraintTemplate, on a bare local control plane: (API client, the judged namespace)."""
    binary = gk.gatekeeper_manager(None)
    manifest = gk.gatekeeper_manifest(binary) if binary else None
    if binary is None or manifest is None:
        pytest.skip("Gatekeeper's manager is not built (scripts/build-gatekeeper.sh; not part of CI)")
    try:
        find_bin_dir()
    except ClusterError as exc:
        pytest.skip(str(exc))
    short = Path(tempfile.mkdtemp(prefix="dgk-"))
    cluster = LocalCluster(short / "s", None, tie_to_parent=True)
    try:
        cluster.up(nodes=(), with_driver=False, with_webhook=False)
        api = Api(cluster.server, cluster.paths.certs)
        ns = "bench-gatekeeper"
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {pw.ARM_LABEL: "gatekeeper"}},
        }
        assert api.call("POST", "/api/v1/namespaces", body)[0] == 201
        cluster.wait_default_sa(ns)
        for name, cls in pw.TEMPLATES.items():
            path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates"
            assert api.call("POST", path, pw.claim_template(ns, name, cls))[0] == 201
        port, metrics_port, health_port = free_port(), free_port(), free_port()
        gk.start_gatekeeper(cluster, binary, manifest, port, metrics_port, health_port, pw.ARM_LABEL)
        gk.apply_policy(cluster)
        # Ready when the constraint is loaded and the templates are in its synced data.
        cluster.wait("gatekeeper", lambda: _dry_run(api, *_vllm_pod(ns, "ready", "one-a100"))[0] == 403, 180)
        yield api, ns
    except ClusterError as exc:
        pytest.fail(f"{exc}\n{cluster.all_logs(40)}")
    finally:
        cluster.down(keep_logs=False)
        shutil.rmtree(short, ignore_errors=True)


def _dry_run(api: Api, path: str, body: dict[str, Any]) -> tuple[int, str]:
    status, msg, _ = pw.create(api, f"{path}?dryRun=All", body)
    return status, msg


def test_gatekeeper_denies_llm_on_a100_and_allows_h100(gatekeeper: tuple[Api, str]) -> None:
    api, ns = gatekeeper
    status, msg = _dry_run(api, *_vllm_pod(ns, "llm-a100", "one-a100"))
    assert status == 403, msg
    assert "validation.gatekeeper.sh" in msg and "asks for gpu.nvidia.com-a100" in msg
    status, msg = _dry_run(api, *_vllm_pod(ns, "llm-h100", "one-h100"))
    assert status == 201, msg


def test_gatekeeper_judges_what_its_own_means_reach(gatekeeper: tuple[Api, str]) -> None:
    """LLM by label as well as by image; Deployments through their pod template; a batch image on
    A100 allowed; a template missing from its synced data denied, with the reason."""
    api, ns = gatekeeper
    path, body = _vllm_pod(ns, "labelled", "one-a100")
    body["spec"]["containers"][0]["image"] = pw.BATCH_IMAGE
    body["metadata"]["labels"] = {"app": "chat-llm"}
    status, msg = _dry_run(api, path, body)
    assert status == 403, msg
    body["metadata"]["labels"] = {"app": "allminilm-embedder"}  # not the whole word `llm`
    assert _dry_run(api, path, body)[0] == 201
    dpath, dep, bad = pw.workload(12, ns)  # a vLLM Deployment on an A100 template
    assert dep["kind"] == "Deployment" and bad
    status, msg = _dry_run(api, dpath, dep)
    assert status == 403 and "asks for gpu.nvidia.com-a100" in msg, msg
    status, msg = _dry_run(api, *_vllm_pod(ns, "unknown", "no-such-template"))
    assert status == 403 and "not in Gatekeeper's synced data" in msg, msg
