"""structure/schema: objects the Kubernetes API server cannot decode or validate, reported by offline
review before any rule runs, from the kube-apiserver 1.37.2 OpenAPI schema shipped in the package."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.review.conftest import Run
from webhook.core.findings import Finding, ObjectRef
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.policy.model import PolicySet
from webhook.review import openapi
from webhook.review.inputs import Inputs, iter_file
from webhook.review.pipeline import evaluate_inputs, review

RULE = "structure/schema"
CORPUS = Path(__file__).parents[1] / "corpus"
EXPECTED = yaml.safe_load((CORPUS / "expected.yaml").read_text())["files"]

DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "team-a", "labels": {"app": "web"}},
    "spec": {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "web"}},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {
                "containers": [{
                    "name": "app",
                    "image": "nginx:1.27",
                    "imagePullPolicy": "IfNotPresent",
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}, "requests": {"cpu": 0.5}},
                    "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 5},
                }],
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
        },
    },
}

CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "gpu", "namespace": "team-a"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": 2,
        "selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}],
    }}]}},
}


def _with(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `base` with the field at the dotted `path` (list indexes as numbers) set to `value`."""
    obj = copy.deepcopy(base)
    node: Any = obj
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    return obj


def _schema_findings(tmp_path: Path, *objects: dict[str, Any], version: str | None = None) -> list[Finding]:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    result = review([str(path)], policies=None, kubernetes_version=version).result
    return [f for f in result.report.findings if f.rule == RULE]


@pytest.mark.parametrize(
    ("base", "path", "value", "field", "said"),
    [
        (DEPLOYMENT, "spec.replicas", "three", "spec.replicas",
         'expected an integer (int32), got string "three"'),
        (DEPLOYMENT, "spec.template.spec.containers.0.resources.limits", [{"nvidia.com/gpu": 1}],
         "spec.template.spec.containers[0].resources.limits",
         "expected an object (a map of fields), got a list"),
        (CLAIM, "spec.devices.requests.0.exactly.count", "lots", "spec.devices.requests[0].exactly.count",
         'expected an integer (int64), got string "lots"'),
        (CLAIM, "spec.devices.requests.0.exactly.selectors.0.cel", {"expression": 42},
         "spec.devices.requests[0].exactly.selectors[0].cel.expression", "expected a string, got number 42"),
    ],
    ids=["replicas-string", "limits-list", "count-string", "cel-expression-number"],
)
def test_type_errors_get_one_finding_naming_the_field(
    tmp_path: Path, base: dict[str, Any], path: str, value: Any, field: str, said: str
) -> None:
    found = _schema_findings(tmp_path, _with(base, path, value))
    assert len(found) == 1, [f.message for f in found]
    f = found[0]
    assert f.message.startswith(f"{field}: {said} ("), f.message
    assert "Kubernetes 1.37 API server cannot decode" in f.message
    assert f.mode.value == "enforce" and f.severity.value == "error"
    assert field in f.fix
    assert f.file is not None and f.file.endswith("objects.yaml")
    # The line is the field's own (found from the document's line map), not the object's first line.
    text = (tmp_path / "objects.yaml").read_text().splitlines()
    assert f.line is not None and f.line > 1
    assert field.rsplit(".", 1)[-1].split("[")[0] + ":" in text[f.line - 1], (f.line, text[f.line - 1])


def test_the_rules_still_run_on_a_malformed_object(tmp_path: Path) -> None:
    """A claim with a type error still gets the engine's verdicts on what it can read."""
    obj = _with(CLAIM, "spec.devices.requests.0.exactly.count", "lots")
    obj = _with(obj, "spec.devices.requests.0.name", "Bad_Name")
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(obj))
    rules = {f.rule for f in review([str(path)], policies=None).result.report.findings}
    assert RULE in rules and "structure/invalid" in rules, rules


def test_valid_objects_get_no_finding(tmp_path: Path) -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "creationTimestamp": None}}
    assert _schema_findings(tmp_path, DEPLOYMENT, CLAIM, ns) == []


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        ("spec.replicas", 2**31, "out of range for an int32 field"),
        ("spec.replicas", 2.5, "not a whole number"),
        ("spec.template.spec.containers.0.resources.limits.cpu", "lots", "quantities must match"),
        ("spec.template.spec.containers.0.resources.limits.cpu", True, "expected a quantity"),
        ("spec.strategy.rollingUpdate.maxSurge", [1], "expected an integer or a string"),
        ("spec.template.spec.containers.0.imagePullPolicy", "always", 'Unsupported value: "always"'),
        ("metadata.labels.app", 7, "expected a string, got number 7"),
        ("spec.template.spec.containers.0.stdin", "yes", "expected true or false"),
    ],
)
def test_values_the_api_server_refuses(tmp_path: Path, path: str, value: Any, said: str) -> None:
    found = _schema_findings(tmp_path, _with(DEPLOYMENT, path, value))
    assert len(found) == 1 and said in found[0].message, [f.message for f in found]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.replicas", 3.0),  # YAML 3.0 reaches the API server as JSON 3
        ("spec.replicas", None),  # null decodes to the zero value
        ("spec.strategy.rollingUpdate.maxSurge", 2),
        ("spec.template.spec.containers.0.resources.limits.cpu", 2),
        ("spec.template.spec.containers.0.imagePullPolicy", ""),  # defaulted
        ("metadata.annotations", {"a": "b"}),
    ],
)
def test_values_the_api_server_accepts(tmp_path: Path, path: str, value: Any) -> None:
    assert _schema_findings(tmp_path, _with(DEPLOYMENT, path, value)) == []


def test_unknown_and_missing_fields(tmp_path: Path) -> None:
    obj = _with(DEPLOYMENT, "spec.template.spec.containers.0.resource", {"limits": {"cpu": 1}})
    del obj["spec"]["selector"]
    found = {f.message.split(":")[0] if "unknown" not in f.message else "unknown": f for f in
             _schema_findings(tmp_path, obj)}
    assert set(found) == {"unknown", "spec.selector"}, list(found)
    assert 'unknown field "spec.template.spec.containers[0].resource"' in found["unknown"].message
    assert "strict field validation" in found["unknown"].message
    assert "Required value" in found["spec.selector"].message


def test_a_null_required_field_is_missing(tmp_path: Path) -> None:
    """`selector:` with its map indented beside it instead of under it: `selector` is null."""
    obj = _with(DEPLOYMENT, "spec.selector", None)
    obj["spec"]["matchLabels"] = {"app": "web"}
    found = sorted(f.message for f in _schema_findings(tmp_path, obj))
    assert len(found) == 2, found
    assert found[0].startswith("spec.selector: Required value"), found
    assert found[1].startswith('unknown field "spec.matchLabels"'), found


def test_number_keys_are_strings_as_kubectl_sends_them(tmp_path: Path) -> None:
    assert _schema_findings(tmp_path, _with(DEPLOYMENT, "metadata.annotations", {2: "a", False: "b"})) == []


def test_opaque_fields_accept_anything(tmp_path: Path) -> None:
    """RawExtension (opaque driver parameters) and the inline-source field a rule reports are left alone."""
    claim = _with(CLAIM, "spec.devices.config", [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "anything": [1, {"x": None}]}}}])
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "i"}],
        "resourceClaims": [{"name": "gpu", "source": {"resourceClaimName": "gpu"}}]}}
    assert _schema_findings(tmp_path, claim, pod) == []


def test_crds_and_unknown_kinds_are_skipped(tmp_path: Path) -> None:
    isvc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "m"},
            "spec": {"predictor": {"replicas": "three", "model": [1, 2]}}}
    ray = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r"}, "spec": 42}
    odd = {"apiVersion": 7, "kind": ["Deployment"], "spec": "x"}
    assert _schema_findings(tmp_path, isvc, ray, odd) == []


def test_problems_per_object_are_bounded(tmp_path: Path) -> None:
    obj = copy.deepcopy(DEPLOYMENT)
    containers = [{"name": "c", "image": 1, "tty": "no"} for _ in range(500)]
    obj["spec"]["template"]["spec"]["containers"] = containers
    found = _schema_findings(tmp_path, obj)
    assert len(found) == openapi.MAX_PROBLEMS
    assert "(980 more schema problems in this object)" in found[-1].message


def test_an_object_too_deep_for_the_engine_gets_its_finding_alone(tmp_path: Path) -> None:
    deep: Any = "leaf"
    for _ in range(300):
        deep = {"x": deep}
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(_with(DEPLOYMENT, "spec.template.metadata.annotations", {"a": deep})))
    rules = [f.rule for f in review([str(path)], policies=None).result.report.findings]
    assert rules == ["structure/too-deep"]


def test_deep_objects_do_not_crash() -> None:
    deep: Any = "leaf"
    for _ in range(5000):
        deep = {"x": deep}
    obj = _with(DEPLOYMENT, "spec.template.metadata.annotations", deep)
    problems = openapi.validate(obj, openapi.load("1.37"))
    assert problems is not None and len(problems[0]) == 1
    assert problems[0][0].field == "spec.template.metadata.annotations.x"


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


def test_random_type_swaps_never_crash() -> None:
    """Fields of a valid Deployment swapped for values of other types (the metadata, kind and
    apiVersion too): review completes without an internal error, and every integer field given a
    string, boolean, list or map is reported."""
    rng = random.Random(20261203)
    values: list[Callable[[], Any]] = [
        lambda: "three", lambda: rng.randint(-(2**70), 2**70), lambda: [rng.random()], lambda: {"k": []},
        lambda: True, lambda: None, lambda: float("nan"), lambda: {1: "int key"}, lambda: "",
    ]
    paths = list(_paths(DEPLOYMENT))
    objects: list[SourceObject] = []
    changed: list[tuple[int, str]] = []
    for i in range(400):
        path = rng.choice(paths)
        value = rng.choice(values)()
        obj = copy.deepcopy(DEPLOYMENT)
        obj["metadata"]["name"] = f"web-{i}"
        node: Any = obj
        for k in path[:-1]:
            node = node[k]
        old = node[path[-1]]
        node[path[-1]] = value
        objects.append(SourceObject(obj, file="fuzz.yaml", line=1))
        # An integer field (int-or-string ones aside) given a string, boolean, list or map.
        if type(old) is int and isinstance(value, str | bool | list | dict) and path[-1] != "maxUnavailable":
            changed.append((i, ".".join(str(p) for p in path)))
    assert len(changed) > 10
    result = evaluate_inputs(Inputs(objects, [], ["fuzz.yaml"]), PolicySet.empty(), Inventory.empty())
    by_name: dict[str, list[Finding]] = {}
    for f in result.report.findings:
        by_name.setdefault(f.object.name, []).append(f)
    assert not [f for f in result.report.findings if f.rule.startswith("internal/")]
    for i, path in changed:
        assert any(f.rule == RULE for f in by_name.get(f"web-{i}", [])), (path, objects[i].obj)


def test_every_valid_corpus_manifest_passes() -> None:
    """The 196 real-world corpus files: no finding on any file the corpus expects to be admitted,
    and on a file expected to be denied only what the API server rejects (the corpus records why)."""
    schemas = openapi.load("1.37")
    files = sorted(p for p in CORPUS.rglob("*") if p.suffix in (".yaml", ".yml", ".json")
                   and p.parent != CORPUS)
    assert len(files) == 196
    checked = 0
    flagged: dict[str, list[str]] = {}
    for p in files:
        rel = p.relative_to(CORPUS).as_posix()
        for objs, _ in iter_file(p):
            for item in objs:
                checked += openapi.validate(item.obj, schemas) is not None
                for f in openapi.findings(item, ObjectRef("", "", None, ""), schemas):
                    flagged.setdefault(rel, []).append(f.message)
    assert checked > 250  # Kubernetes kinds among them (the rest are CRDs, skipped)
    admitted = {rel: msgs for rel, msgs in flagged.items() if EXPECTED[rel]["verdict"] != "deny"}
    assert admitted == {}, json.dumps(admitted, indent=1)
    # The one denied file flagged: its selector's `expression` sits beside `cel:` (expected.yaml).
    assert list(flagged) == ["kubernetes/website-dra-resourceclaim.yaml"], flagged


def test_release_without_a_schema_file_uses_the_nearest_newer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert openapi.pick_release("1.37") == ("1.37", None)
    release, note = openapi.pick_release("1.35")
    assert release == "1.37" and note is not None and "no Kubernetes 1.35 schema" in note
    found = _schema_findings(tmp_path, _with(DEPLOYMENT, "spec.replicas", "three"), version="1.35")
    assert len(found) == 1 and "Kubernetes 1.37" in found[0].message
    assert "no Kubernetes 1.35 schema shipped: objects are checked against 1.37's" in capsys.readouterr().err


def test_cli_denies_a_malformed_object(tmp_path: Path, draguard: Callable[..., Run]) -> None:
    path = tmp_path / "d.yaml"
    (tmp_path / "policies").mkdir()
    path.write_text(yaml.safe_dump(_with(DEPLOYMENT, "spec.replicas", "three"), sort_keys=False))
    run = draguard("review", "--policies", str(tmp_path / "policies"), "-f", "json", str(path))
    assert run.code == 1, run.err
    findings = json.loads(run.out)["findings"]
    assert [f["rule"] for f in findings] == [RULE]
    line = path.read_text().splitlines().index("  replicas: three") + 1
    assert findings[0]["line"] == line
    assert findings[0]["message"].startswith("spec.replicas: expected an integer")


def test_shipped_file_is_trimmed_and_stable() -> None:
    """What the generator writes is what `encode` makes of the data again (sorted, no timestamp), and
    it carries no prose: only what validation reads."""
    from importlib import resources

    raw = resources.files("webhook.review.schemas").joinpath("k8s-1.37.json.gz").read_bytes()
    import gzip

    data = json.loads(gzip.decompress(raw))
    assert openapi.encode(data) == raw
    assert data["kubernetes"] == "1.37.2"
    assert "description" not in gzip.decompress(raw).decode()
    assert len(data["roots"]) == 20
