"""Multi-GPU rewrites and draguard's own interconnect advice, on real manifests from tests/corpus.

A claim for several GPUs without an interconnect constraint draws `structure/interconnect`; the
rewrite must not produce what draguard itself would then warn about. Without an inventory that
proves every node joins the GPUs by NVLink, the template asks for joined GPUs first and any GPUs
second (what the device plugin gave), so the workload stays schedulable everywhere it was.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from webhook.core.findings import Finding
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import load_policies
from webhook.review.inputs import parse_yaml_documents
from webhook.review.rewrite import migrate_paths

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus"
POLICIES = load_policies(ROOT / "policies")
RULE = "migrate/legacy-gpu"
INTERCONNECT = "structure/interconnect"


def _workload(rel: str, kind: str) -> dict[str, Any]:
    path = CORPUS / rel
    docs = [d.data for d in parse_yaml_documents(path.read_text(), str(path))]
    (obj,) = [d for d in docs if isinstance(d, dict) and d.get("kind") == kind]
    return copy.deepcopy(obj)


def _migrated(
    obj: dict[str, Any], inventory: Inventory | None = None, **ctx: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The object as review in migrate mode rewrites it (no inventory unless given), and the
    templates it writes."""
    ns = obj["metadata"].get("namespace") or "default"
    labels = {ns: {"draguard.io/migration-mode": "migrate"}}
    report = evaluate([SourceObject(obj)], POLICIES, inventory or Inventory.empty(),
                      Context(namespace_labels=labels, **ctx), rule_modules=("migrate",))
    found = [f for f in report.findings if f.rule == RULE]
    assert found and all(f.patch for f in found), [f.message for f in found]
    # One finding per pod template (LeaderWorkerSet: leader and workers), each patching its own.
    rewritten, templates = obj, {}
    for f in found:
        rewritten = jsonpatch.apply_patch(rewritten, f.patch)
        templates.update({t["metadata"]["name"]: t for t in f.generated})
    return rewritten, list(templates.values())


def _review(objs: list[dict[str, Any]], **ctx: Any) -> list[Finding]:
    report = evaluate([SourceObject(o) for o in objs], POLICIES, Inventory.empty(), Context(**ctx))
    return list(report.findings)


@pytest.mark.parametrize(
    ("rel", "kind", "count"),
    [
        # TGI with 8 GPUs pinned to GKE's H100 nodes.
        ("gke-samples/tgi-gemma-2b-it-h100-80gb.yaml", "Deployment", 8),
        # HAMi's plain example: two whole GPUs, no vGPU extras.
        ("hami/default_use_legacy.yaml", "Pod", 2),
        # vLLM on LeaderWorkerSet: leader and worker templates of 8 GPUs each.
        ("lws/GPU-lws.yaml", "LeaderWorkerSet", 8),
    ],
)
def test_a_multi_gpu_rewrite_prefers_nvlink_and_draws_no_interconnect_warning(
    rel: str, kind: str, count: int
) -> None:
    obj = _workload(rel, kind)
    rewritten, templates = _migrated(obj)
    assert templates
    for tmpl in templates:
        devices = tmpl["spec"]["spec"]["devices"]
        (request,) = devices["requests"]
        choices = request["firstAvailable"]
        assert [c["name"] for c in choices] == ["nvlink", "any"]
        assert {c["count"] for c in choices} == {count}
        assert len({c["deviceClassName"] for c in choices}) == 1
        # Only the first choice is constrained: the second is what the device plugin gave.
        assert devices["constraints"] == [
            {"requests": [f"{request['name']}/nvlink"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}
        ]
    findings = _review([rewritten, *templates])
    assert not [f for f in findings if f.rule == INTERCONNECT], [f.message for f in findings]
    assert not [f for f in findings if f.rule == RULE], [f.message for f in findings]


def test_the_same_template_without_the_preference_draws_the_warning() -> None:
    # The control: the check above can fail. A plain template of 8 GPUs is what draguard warns about.
    _rewritten, (tmpl,) = _migrated(_workload("gke-samples/tgi-gemma-2b-it-h100-80gb.yaml", "Deployment"))
    request = tmpl["spec"]["spec"]["devices"]["requests"][0]
    first = request["firstAvailable"][0]
    plain = copy.deepcopy(tmpl)
    plain["spec"]["spec"]["devices"] = {"requests": [
        {"name": request["name"], "exactly": {"deviceClassName": first["deviceClassName"], "count": 8}}
    ]}  # fmt: skip
    assert [f.rule for f in _review([plain]) if f.rule == INTERCONNECT] == [INTERCONNECT]


def test_one_gpu_and_mig_slices_get_a_plain_request() -> None:
    # Ollama's Deployment asks for one GPU: nothing to join.
    _rewritten, (tmpl,) = _migrated(_workload("ollama/kubernetes-gpu.yaml", "Deployment"))
    devices = tmpl["spec"]["spec"]["devices"]
    assert "constraints" not in devices
    assert devices["requests"][0]["exactly"]["count"] == 1
    # Two MIG slices never share NVLink: a plain request for both.
    pod = _workload("hami/mig_example.yaml", "Pod")
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/mig-3g.20gb": 2}
    _rewritten, (tmpl,) = _migrated(pod)
    devices = tmpl["spec"]["spec"]["devices"]
    assert "constraints" not in devices
    assert devices["requests"][0]["exactly"]["count"] == 2


def test_a_cluster_without_firstavailable_gets_the_plain_request() -> None:
    # resource.k8s.io/v1beta1 only (Kubernetes 1.32): the prioritized list may be off, and a request
    # the API server strips of firstAvailable has no class. The plain request keeps the pod working.
    obj = _workload("hami/default_use_legacy.yaml", "Pod")
    _rewritten, (tmpl,) = _migrated(obj, served_versions=frozenset({"v1beta1"}))
    assert tmpl["apiVersion"] == "resource.k8s.io/v1beta1"
    devices = tmpl["spec"]["spec"]["devices"]
    assert "constraints" not in devices and "firstAvailable" not in devices["requests"][0]
    assert devices["requests"][0]["count"] == 2


def test_admission_and_a_known_inventory_get_what_the_cluster_shows() -> None:
    # The webhook bounds the templates it creates by their exact counts (no node has more devices):
    # in admission the request stays plain.
    obj = _workload("gke-samples/tgi-gemma-2b-it-h100-80gb.yaml", "Deployment")
    _rewritten, (tmpl,) = _migrated(obj, admission=True)
    devices = tmpl["spec"]["spec"]["devices"]
    assert devices["requests"][0]["exactly"]["count"] == 8 and "constraints" not in devices
    # With an inventory the cluster decides. The example inventory's H100 node has its 8 GPUs in one
    # NVLink domain: the constraint is required, not merely preferred.
    inventory = Inventory.from_objects(
        [d.data for d in parse_yaml_documents((ROOT / "examples" / "inventory.yaml").read_text(), "inventory")
         if isinstance(d.data, dict)]
    )  # fmt: skip
    _rewritten, (tmpl,) = _migrated(obj, inventory)
    assert tmpl["metadata"]["name"].endswith("-nvlink")
    assert tmpl["spec"]["spec"]["devices"] == {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-h100", "count": 8}}],
        "constraints": [{"requests": ["gpu"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}],
    }
    # No node there has 16 H100s: no preference list hides that; the request stays plain (and
    # structure/unsatisfiable says why it cannot be placed).
    container = obj["spec"]["template"]["spec"]["containers"][0]["resources"]
    container["limits"]["nvidia.com/gpu"] = container["requests"]["nvidia.com/gpu"] = "16"
    _rewritten, (tmpl,) = _migrated(obj, inventory)
    devices = tmpl["spec"]["spec"]["devices"]
    assert devices["requests"][0]["exactly"]["count"] == 16 and "constraints" not in devices


def test_under_nvidias_driver_the_preference_names_its_fabric_partition() -> None:
    # NVIDIA's driver publishes no nvlinkDomain; GPUs joined through NVSwitch share a Fabric
    # Manager partition of that many GPUs, the attribute structure/interconnect asks for there.
    obj = _workload("gke-samples/tgi-gemma-2b-it-h100-80gb.yaml", "Deployment")
    rewritten, (tmpl,) = _migrated(obj, driver_schema="nvidia")
    (link,) = tmpl["spec"]["spec"]["devices"]["constraints"]
    assert link["matchAttribute"] == "gpu.nvidia.com/partition8"
    findings = _review([rewritten, tmpl], driver_schema="nvidia")
    assert not [f for f in findings if f.rule == INTERCONNECT], [f.message for f in findings]


def test_draguard_migrate_writes_the_preference_and_review_is_clean(tmp_path: Path) -> None:
    src = CORPUS / "kai-scheduler" / "two-queue-oscillation-jobs.yaml"
    copy_ = tmp_path / src.name
    copy_.write_bytes(src.read_bytes())
    out = migrate_paths([str(copy_)], policies=str(ROOT / "policies"), policies_required=True,
                        strategy=None, write=True)
    assert out.changed, out.notes
    docs = [d.data for d in parse_yaml_documents(copy_.read_text(), str(copy_)) if isinstance(d.data, dict)]
    templates = [d for d in docs if d.get("kind") == "ResourceClaimTemplate"]
    assert templates
    assert all("firstAvailable" in t["spec"]["spec"]["devices"]["requests"][0] for t in templates)
    findings = _review(docs)
    assert not [f for f in findings if f.rule in (INTERCONNECT, RULE)], [f.message for f in findings]
