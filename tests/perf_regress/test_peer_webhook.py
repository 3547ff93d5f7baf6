"""bench/peer.py --webhook without Kyverno's 35-minute build: what it refuses, and the parts it is built from.

The run itself, with draguard and the baseline only, is tests/e2e/test_peer_bench.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from bench import peer_webhook as pw

ROOT = Path(__file__).resolve().parents[2]


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DRAGUARD_KYVERNO_CONTROLLER"}
    return subprocess.run(
        [sys.executable, "bench/peer.py", "--webhook", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_missing_kyverno_is_a_clear_error_before_anything_starts(tmp_path: Path) -> None:
    missing = tmp_path / "no-such" / "kyverno"
    state = tmp_path / "state"
    proc = run_bench("--kyverno", str(missing), "--state-dir", str(state))
    assert proc.returncode == 3
    assert str(missing) in proc.stderr
    assert "scripts/build-peer.sh" in proc.stderr and "--arms none,null,draguard" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not state.exists()  # no control plane was started


def test_arms_must_include_the_baseline() -> None:
    proc = run_bench("--arms", "draguard,kyverno")
    assert proc.returncode == 2
    assert "--arms" in proc.stderr and "'none'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_kyverno_policy_allows_the_classes_draguard_ships_for_llm() -> None:
    tier = next(d for d in yaml.safe_load_all((ROOT / "policies" / "tier.yaml").read_text()) if d)
    llm = next(c for c in tier["spec"]["classes"] if c["name"] == "llm")
    rule = pw.KYVERNO_POLICY["spec"]["rules"][0]
    cond = rule["validate"]["foreach"][0]["deny"]["conditions"]["any"][0]
    assert cond["operator"] == "AnyNotIn"
    assert cond["value"] == llm["deviceClasses"]
    assert "vllm" in llm["match"]["imageWords"]
    assert rule["preconditions"]["any"][0]["value"] == ["*vllm*"]


def test_stream_is_the_same_in_every_namespace_and_forbids_one_llm_object_in_ten() -> None:
    n = 200
    for i in range(n):
        a_path, a, a_bad = pw.workload(i, "bench-none")
        b_path, b, b_bad = pw.workload(i, "bench-kyverno")
        assert a_bad == b_bad
        assert a_path.replace("bench-none", "bench-kyverno") == b_path
        b["metadata"]["namespace"] = "bench-none"
        assert a == b
    bad = [i for i in range(n) if pw.workload(i, "x")[2]]
    kinds = {pw.workload(i, "x")[1]["kind"] for i in bad}
    assert len(bad) == n // 10
    assert kinds == {"Pod", "Deployment"}
    for i in bad:
        _p, obj, _b = pw.workload(i, "x")
        spec = obj["spec"].get("template", {}).get("spec") or obj["spec"]
        assert "vllm" in spec["containers"][0]["image"]
        assert pw.TEMPLATES[spec["resourceClaims"][0]["resourceClaimTemplateName"]] not in pw.LLM_CLASSES


def test_arm_selector_keeps_the_shipped_exclusions_and_adds_the_arm() -> None:
    shipped = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
    hooks = [{"webhooks": [{"namespaceSelector": {"matchExpressions": [shipped]}}, {}]}]
    pw.set_arm_selector(hooks, "draguard")
    pw.set_arm_selector(hooks, "draguard")  # applying twice does not stack
    arm = {"key": pw.ARM_LABEL, "operator": "In", "values": ["draguard"]}
    assert hooks[0]["webhooks"][0]["namespaceSelector"]["matchExpressions"] == [shipped, arm]
    assert hooks[0]["webhooks"][1]["namespaceSelector"]["matchExpressions"] == [arm]


def test_review_counts_and_process_figures() -> None:
    text = (
        "# HELP kyverno_admission_requests_total x\n"
        'kyverno_admission_requests_total{resource_kind="Pod"} 7\n'
        'kyverno_admission_requests_total{resource_kind="Deployment"} 2.0\n'
        "kyverno_admission_requests_totalx 100\n"
        "kyverno_admission_requests_total 1\n"
    )
    assert pw.metric_sum(text, "kyverno_admission_requests_total") == 10.0
    before = pw.proc_cpu_s(os.getpid())
    x = 0
    while pw.proc_cpu_s(os.getpid()) - before < 0.05:
        x += sum(range(10_000))
    assert pw.proc_cpu_s(os.getpid()) - before >= 0.05
    rss, peak = pw.proc_rss_mib(os.getpid())
    assert 1 < rss <= peak


def test_kyverno_validating_policy_says_the_same_as_the_cluster_policy() -> None:
    # The CEL ValidatingPolicy (--kyverno-policy validating): the same vLLM match, the same classes
    # (a trailing * as a prefix), the templates read from the API server, Deployments by autogen.
    spec = pw.KYVERNO_VALIDATING_POLICY["spec"]
    assert spec["validationActions"] == ["Deny"]
    assert spec["autogen"]["podControllers"]["controllers"] == ["deployments"]
    assert "c.image.contains('vllm')" in spec["matchConditions"][0]["expression"]
    classes = {v["name"]: v["expression"] for v in spec["variables"]}["classes"]
    assert "resource.Get('resource.k8s.io/v1', 'resourceclaimtemplates'" in classes
    check = spec["validations"][0]["expression"]
    terms = check.removeprefix("variables.classes.all(l, l.all(c, ").removesuffix("))").split(" || ")
    want = [f"c.startsWith('{c[:-1]}')" if c.endswith("*") else f"c == '{c}'" for c in pw.LLM_CLASSES]
    assert terms == want
    deny = pw.KYVERNO_POLICY["spec"]["rules"][0]["validate"]["foreach"][0]["deny"]
    assert deny["conditions"]["any"][0]["value"] == pw.LLM_CLASSES
