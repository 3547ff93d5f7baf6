"""`draguard test`, `lint-cel`, `migrate`, `schema`, `explain`, and the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.review.conftest import FIXTURES, Run

SUITES = FIXTURES / "suites"
INVENTORY = str(FIXTURES / "inventory.yaml")
A100 = (
    "device.driver == 'gpu.nvidia.com' && "
    "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100 80GB PCIe'"
)


# --------------------------------------------------------------------------- test


def test_suites_report_pass_and_fail_per_case(draguard: Callable[..., Run], tmp_path: Path) -> None:
    junit = tmp_path / "suites.xml"
    run = draguard("test", str(SUITES), "--junit", str(junit))
    assert run.code == 1
    lines = run.out.splitlines()
    assert any(ln.startswith("PASS  review-fixtures: llm serving on a MIG slice is denied") for ln in lines)
    assert any(ln.startswith("PASS  review-fixtures: legacy job in a legacy namespace") for ln in lines)
    assert any(ln.startswith("PASS  review-fixtures: inline legacy pod") for ln in lines)
    assert any(ln.startswith("FAIL  review-fixtures: this case expects the wrong verdict") for ln in lines)
    assert "expected {rule: tier/gpu-tiers}, not found" in run.out
    assert "unexpected migrate/legacy-gpu (audit) on Job/legacy-batch/nightly-eval" in run.out
    assert lines[-1] == "3 passed, 1 failed (4 cases)"
    root = ET.parse(junit).getroot()
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == 4
    assert [c.get("name") for c in cases if c.find("failure") is not None] == [
        "this case expects the wrong verdict"
    ]


def test_suite_filter_and_success_exit(draguard: Callable[..., Run]) -> None:
    run = draguard("test", str(SUITES), "--run", "denied")
    assert run.code == 0
    assert run.out.splitlines()[-1] == "1 passed, 0 failed (1 cases)"


def test_the_repository_policy_suites_pass(draguard: Callable[..., Run]) -> None:
    root = Path(__file__).resolve().parents[2] / "policies" / "tests"
    if not any(root.glob("*/suite.yaml")):
        pytest.skip("no policy suites in policies/tests yet")
    run = draguard("test", str(root))
    assert run.code == 0, run.out
    assert "0 failed" in run.out.splitlines()[-1]


def test_broken_suite_is_a_usage_error(draguard: Callable[..., Run], tmp_path: Path) -> None:
    (tmp_path / "suite.yaml").write_text("cases:\n- name: x\n  inputs: [a.yaml]\n")
    (tmp_path / "a.yaml").write_text("kind: Pod\n")
    run = draguard("test", str(tmp_path), "--policies", str(FIXTURES / "policies"))
    assert run.code == 2
    assert "needs expect" in run.err and "suite.yaml:2" in run.err
    assert draguard("test", str(tmp_path / "none")).code == 2


# --------------------------------------------------------------------------- lint-cel


def test_lint_cel_counts_matching_devices_by_product(draguard: Callable[..., Run]) -> None:
    run = draguard("lint-cel", A100, "--inventory", INVENTORY)
    assert run.code == 0, run.err
    assert "matches 8 of 16 devices" in run.out
    assert "NVIDIA A100 80GB PCIe  (node1 x4)" in run.out
    assert "NVIDIA A100 80GB PCIe MIG 3g.20gb  (node3 x4)" in run.out


def test_lint_cel_errors_exit_1_with_position(draguard: Callable[..., Run]) -> None:
    run = draguard("lint-cel", "device.attributes['gpu.nvidia.com'].productName == ")
    assert run.code == 1
    assert "cel/syntax" in run.out
    run = draguard(
        "lint-cel", "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].memory > 3"
    )
    assert run.code == 1
    assert "cel/unknown-attribute" in run.out and "device.capacity" in run.out


# --------------------------------------------------------------------------- migrate

LEGACY = """\
# Nightly evaluation (legacy device-plugin form)
apiVersion: batch/v1
kind: Job
metadata:
  name: nightly-eval   # keep this name
  namespace: team-a
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: eval
          image: "registry.example.com/eval:1.2"
          resources:
            limits:
              memory: 16Gi
              nvidia.com/gpu: 1
---
apiVersion: v1
kind: ConfigMap
metadata: {name: untouched, namespace: team-a}
data: {z: "1", a: "2"}
"""


def test_migrate_prints_a_diff_and_writes_in_place(draguard: Callable[..., Run], tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(LEGACY)
    policies = ("--policies", str(FIXTURES / "policies"))
    run = draguard("migrate", str(f), *policies)
    assert run.code == 1, run.err
    assert run.out.startswith(f"--- {f}\n+++ {f}\n")
    assert "-              nvidia.com/gpu: 1" in run.out
    assert "+kind: ResourceClaimTemplate" in run.out
    assert f.read_text() == LEGACY  # a diff only

    run = draguard("migrate", str(f), *policies, "--write")
    assert run.code == 0 and f"migrated {f}" in run.out
    text = f.read_text()
    # Comments, quoting, key order and the untouched document survive the rewrite.
    assert text.startswith("# Nightly evaluation (legacy device-plugin form)\n")
    assert "name: nightly-eval   # keep this name" in text
    assert 'image: "registry.example.com/eval:1.2"' in text
    assert 'data: {z: "1", a: "2"}' in text
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert [d["kind"] for d in docs] == ["Job", "ResourceClaimTemplate", "ConfigMap"]
    job, template = docs[0], docs[1]
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {
        "limits": {"memory": "16Gi"},
        "claims": [{"name": "eval-gpu"}],
    }
    assert pod["resourceClaims"] == [
        {"name": "eval-gpu", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    assert template["metadata"]["namespace"] == "team-a"
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com-a100"
    # Idempotent: a second run has nothing left to do.
    assert draguard("migrate", str(f), *policies).code == 0


def test_migrate_write_over_many_files_writes_each_template_once(
    draguard: Callable[..., Run], tmp_path: Path
) -> None:
    # Two Jobs in two files need the same template; kustomize refuses a resource defined twice.
    second = LEGACY.replace("nightly-eval", "weekly-eval").split("---\napiVersion: v1\nkind: ConfigMap")[0]
    (tmp_path / "a.yaml").write_text(LEGACY)
    (tmp_path / "b.yaml").write_text(second)
    run = draguard("migrate", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml"),
                   "--policies", str(FIXTURES / "policies"), "--write")  # fmt: skip
    assert run.code == 0, run.err
    ids = [
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
        for f in ("a.yaml", "b.yaml")
        for d in yaml.safe_load_all((tmp_path / f).read_text())
        if d
    ]
    assert len(ids) == len(set(ids)), ids  # what `kustomize build` would reject
    assert sum(k == "ResourceClaimTemplate" for k, _ns, _n in ids) == 1
    assert "kept in" in run.err or "kept in" in run.out


def test_migrate_picks_the_class_the_tier_policy_allows(draguard: Callable[..., Run], tmp_path: Path) -> None:
    f = tmp_path / "chat.yaml"
    f.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: chat, namespace: ml}\nspec:\n"
        "  selector: {matchLabels: {app: chat}}\n  template:\n    metadata: {labels: {app: chat}}\n"
        "    spec:\n      containers:\n      - name: vllm\n        image: vllm/vllm-openai:v0.6.0\n"
        "        resources: {limits: {nvidia.com/gpu: 1}}\n"
    )
    shipped = str(Path(__file__).resolve().parents[2] / "policies")
    assert draguard("migrate", str(f), "--policies", shipped, "--write").code == 0
    (tmpl,) = [d for d in yaml.safe_load_all(f.read_text()) if d and d["kind"] == "ResourceClaimTemplate"]
    # The shipped MigrationPolicy maps nvidia.com/gpu to A100 by default; LLMs may use only H100.
    request = tmpl["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com-h100"
    review = draguard("review", str(f), "--policies", shipped, "-f", "json")
    assert not [x for x in json.loads(review.out)["findings"] if x["rule"].startswith("tier/")]


def test_migrated_manifest_passes_review_of_the_migration_rule(
    draguard: Callable[..., Run], tmp_path: Path
) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(LEGACY)
    common = ("--policies", str(FIXTURES / "policies"), "--inventory", INVENTORY, "-f", "json")
    before = json.loads(draguard("review", str(f), *common).out)["findings"]
    assert "migrate/legacy-gpu" in {x["rule"] for x in before}
    draguard("migrate", str(f), "--policies", str(FIXTURES / "policies"), "--write")
    after = json.loads(draguard("review", str(f), *common).out)["findings"]
    assert "migrate/legacy-gpu" not in {x["rule"] for x in after}


def test_migrate_extended_resource_sets_the_class_name(draguard: Callable[..., Run], tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(LEGACY)
    classes = tmp_path / "classes.yaml"
    classes.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: gpu.nvidia.com-a100\n"
        "spec:\n  selectors:\n  - cel:\n      expression: device.driver == 'gpu.nvidia.com'  # all\n"
    )
    run = draguard(
        "migrate",
        str(tmp_path),
        "--policies",
        str(FIXTURES / "policies"),
        "--strategy",
        "extended-resource",
        "-w",
    )
    assert run.code == 0, run.err
    assert "extendedResourceName: nvidia.com/gpu" in classes.read_text()
    assert "# all" in classes.read_text()
    assert "nvidia.com/gpu: 1" in (tmp_path / "job.yaml").read_text()  # pods keep their limits
    assert "DRAExtendedResource" in run.err


def test_migrate_bad_input(draguard: Callable[..., Run], tmp_path: Path) -> None:
    run = draguard("migrate", str(tmp_path / "missing.yaml"))
    assert run.code == 2 and "no such file" in run.err


# --------------------------------------------------------------------------- schema, explain


def test_schema_prints_the_policy_json_schema(draguard: Callable[..., Run]) -> None:
    run = draguard("schema")
    assert run.code == 0
    schema = json.loads(run.out)
    assert schema["$schema"].startswith("https://json-schema.org/draft/2020-12")
    assert "GpuTierPolicy" in json.dumps(schema)


def test_explain_says_why_nothing_would_match(draguard: Callable[..., Run]) -> None:
    claim = str(FIXTURES / "manifests/team-ml/training-claim.yaml")
    run = draguard("explain", claim, "--inventory", INVENTORY)
    # A request that cannot be allocated is exit 1, like an enforce-mode finding in review.
    assert run.code == 1, run.err
    assert "DeviceClass gpu.nvidia.com-a100 does not exist" in run.out
    # With the DeviceClasses among the inputs the class resolves and its devices are listed.
    run = draguard("explain", claim, str(FIXTURES / "manifests/deviceclasses.yaml"), "--inventory", INVENTORY)
    assert run.code == 1, run.err
    assert "ResourceClaim/ml-workloads/training-gpu-claim" in run.out
    assert "CANNOT be allocated" in run.out
    assert "nvlinkInterconnect is published by no device" in run.out
    assert "node1: 4 x NVIDIA A100 80GB PCIe" in run.out
    ok = draguard("explain", str(FIXTURES / "manifests/team-ml/notebook.yaml"), "--inventory", INVENTORY,
                  "-f", "json")  # fmt: skip
    doc = json.loads(ok.out)
    assert {e["object"]["kind"] for e in doc} == {"ResourceClaimTemplate", "Pod"}
    assert ok.code == 1  # its class is not among the inputs: CANNOT be allocated


def test_explain_exits_0_when_every_request_can_be_allocated(
    draguard: Callable[..., Run], tmp_path: Path
) -> None:
    f = tmp_path / "ok.yaml"
    f.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: any-gpu}\n"
        "spec: {selectors: [{cel: {expression: \"device.driver == 'gpu.nvidia.com'\"}}]}\n---\n"
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: one, namespace: ml}\n"
        "spec: {devices: {requests: [{name: g, exactly: {deviceClassName: any-gpu, count: 1}}]}}\n"
    )
    run = draguard("explain", str(f), "--inventory", INVENTORY)
    assert run.code == 0, run.out
    assert "can be allocated" in run.out and "CANNOT" not in run.out
    bad = draguard("explain", str(FIXTURES / "nope.yaml"))
    assert bad.code == 2 and "no such file" in bad.err


# --------------------------------------------------------------------------- console script


def test_console_script_in_a_subprocess(tmp_path: Path) -> None:
    exe = shutil.which("draguard", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the draguard console script is not installed in this environment")
    proc = subprocess.run(
        [exe, "review", "manifests", "--policies", "policies", "--inventory", "inventory.yaml", "-f", "json"],
        cwd=FIXTURES,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["summary"]["errors"] == 4
    bad = subprocess.run(
        [exe, "review", str(tmp_path / "nope.yaml")], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().endswith("nope.yaml: no such file or directory")
    assert "Traceback" not in bad.stderr


# --------------------------------------------------------------------------- namespace labels

LEGACY_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: old, namespace: strict}
spec:
  containers:
  - name: c
    image: nvcr.io/nvidia/pytorch:24.01-py3
    resources: {limits: {nvidia.com/gpu: 1}}
"""
STRICT_NS = """\
apiVersion: v1
kind: Namespace
metadata:
  name: strict
  labels: {draguard.io/migration-mode: enforce}
"""


def _migrate_modes(run: Run) -> set[str]:
    return {f["mode"] for f in json.loads(run.out)["findings"] if f["rule"] == "migrate/legacy-gpu"}


def test_review_reads_namespace_labels_like_admission(draguard: Callable[..., Run], tmp_path: Path) -> None:
    shipped = str(Path(__file__).resolve().parents[2] / "policies")
    pod = tmp_path / "pod.yaml"
    pod.write_text(LEGACY_POD)
    alone = draguard("review", str(pod), "--policies", shipped, "-f", "json")
    assert alone.code == 0 and _migrate_modes(alone) == {"warn"}
    # The Namespace in the same change: its migration-mode label applies, as in admission.
    both = tmp_path / "with-ns"
    both.mkdir()
    (both / "ns.yaml").write_text(STRICT_NS)
    (both / "pod.yaml").write_text(LEGACY_POD)
    run = draguard("review", str(both), "--policies", shipped, "-f", "json")
    assert run.code == 1 and _migrate_modes(run) == {"enforce"}
    # Or from a cluster snapshot: `kubectl get namespaces -o yaml` is a List of Namespaces.
    state = tmp_path / "cluster.yaml"
    listed = {"apiVersion": "v1", "kind": "List", "items": [yaml.safe_load(STRICT_NS)]}
    state.write_text(yaml.safe_dump(listed))
    run = draguard("review", str(pod), "--policies", shipped, "--cluster-state", str(state), "-f", "json")
    assert run.code == 1 and _migrate_modes(run) == {"enforce"}


def test_review_cluster_state_team_label_applies_the_team_budget(
    draguard: Callable[..., Run], tmp_path: Path
) -> None:
    shipped = str(Path(__file__).resolve().parents[2] / "policies")
    claim = tmp_path / "claim.yaml"
    claim.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: big, namespace: vision}\n"
        "spec: {devices: {requests: [{name: g,\n"
        "  exactly: {deviceClassName: gpu.nvidia.com-h100, count: 20}}]}}\n"
    )
    state = tmp_path / "ns.yaml"
    state.write_text(STRICT_NS.replace("strict", "vision").replace("draguard.io/migration-mode: enforce",
                                                                    "draguard.io/team: cv"))  # fmt: skip
    # Unlabelled, the default budget (8 GPU-equivalents) denies it; as team cv's (32) it fits.
    assert draguard("review", str(claim), "--policies", shipped).code == 1
    assert draguard("review", str(claim), "--policies", shipped, "--cluster-state", str(state)).code == 0


def test_review_cluster_state_errors_name_the_file(draguard: Callable[..., Run], tmp_path: Path) -> None:
    missing = draguard("review", str(tmp_path), "--cluster-state", str(tmp_path / "nope.yaml"))
    assert missing.code == 2 and "nope.yaml: cluster state file not found" in missing.err
    odd = tmp_path / "odd.yaml"
    odd.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    run = draguard("review", str(odd), "--cluster-state", str(odd))
    assert run.code == 2 and "no Namespace objects" in run.err
