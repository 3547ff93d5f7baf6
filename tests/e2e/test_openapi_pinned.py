"""The shipped Kubernetes schema (webhook/review/schemas/k8s-1.37.json.gz) is what the kube-apiserver
this project builds serves at /openapi/v3, trimmed the same way (regenerate it with
scripts/gen-openapi.py when the pinned release changes); and what structure/schema reports, the API
server refuses on a dry run as kubectl sends it (strict field validation), naming the same field."""

from __future__ import annotations

import copy
import gzip
import importlib.util
import json
import re
import urllib.error
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver import ApiServer, running
from webhook.review import openapi

SCRIPT = Path(__file__).parents[2] / "scripts" / "gen-openapi.py"


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_openapi", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.fixture(scope="module")
def server() -> Iterator[ApiServer]:
    with running("openapi", runtime_config=GEN.RUNTIME_CONFIG) as s:
        yield s


def test_shipped_schema_is_what_the_built_api_server_serves(server: ApiServer) -> None:
    served = GEN.fetch(lambda path: server.request("GET", path))
    release = ".".join(served["kubernetes"].split(".")[:2])
    raw = resources.files("webhook.review.schemas").joinpath(f"k8s-{release}.json.gz").read_bytes()
    shipped = json.loads(gzip.decompress(raw))
    assert shipped["kubernetes"] == served["kubernetes"]
    assert shipped["roots"] == served["roots"]
    names = served["schemas"].keys() | shipped["schemas"].keys()
    changed = sorted(n for n in names if served["schemas"].get(n) != shipped["schemas"].get(n))
    assert not changed, f"regenerate with scripts/gen-openapi.py; {len(changed)} differ: {changed[:10]}"


DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
    "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": {
        "metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx", "resources": {"limits": {"cpu": "1"}}}]}}},
}
CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "gpu"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.example.com", "count": 1,
        "selectors": [{"cel": {"expression": "true"}}]}}]}},
}


def _set(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(base)
    node: Any = obj
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    return obj


SHAPES = [
    ("valid-deployment", DEPLOYMENT, None),
    ("valid-claim", CLAIM, None),
    ("replicas-string", _set(DEPLOYMENT, "spec.replicas", "three"), "spec.replicas"),
    ("limits-list", _set(DEPLOYMENT, "spec.template.spec.containers.0.resources.limits", [{"cpu": "1"}]),
     "spec.template.spec.containers[0].resources.limits"),
    ("count-string", _set(CLAIM, "spec.devices.requests.0.exactly.count", "lots"),
     "spec.devices.requests[0].exactly.count"),
    ("cel-expression-number", _set(CLAIM, "spec.devices.requests.0.exactly.selectors.0.cel.expression", 42),
     "spec.devices.requests[0].exactly.selectors[0].cel.expression"),
    ("unknown-field", _set(DEPLOYMENT, "spec.template.spec.containers.0.resource", {}),
     "spec.template.spec.containers[0].resource"),
    ("bad-quantity", _set(DEPLOYMENT, "spec.template.spec.containers.0.resources.limits.cpu", "lots"),
     "spec.template.spec.containers[0].resources.limits"),
]


@pytest.mark.parametrize(("obj", "field"), [(o, f) for _, o, f in SHAPES], ids=[n for n, _, _ in SHAPES])
def test_the_api_server_refuses_what_review_reports(
    server: ApiServer, obj: dict[str, Any], field: str | None
) -> None:
    plural = "deployments" if obj["kind"] == "Deployment" else "resourceclaims"
    group = "/apis/" + obj["apiVersion"]
    try:
        server.request("POST", f"{group}/namespaces/default/{plural}?dryRun=All&fieldValidation=Strict", obj)
        said = None
    except urllib.error.HTTPError as exc:
        said = exc.read().decode()
    found = openapi.validate(obj, openapi.load("1.37"))
    assert found is not None
    problems = [p.field for p in found[0]]
    if field is None:
        assert said is None and problems == []
    else:
        assert said is not None, field
        # Type errors name the field without list indexes, unknown fields with them (as review
        # does); a bad quantity's error names none at all.
        names = (field, re.sub(r"\[\d+\]", "", field), "quantities must match")
        assert any(n in said for n in names), said
        assert problems == [field] or problems == [f"{field}.cpu"], problems


CORPUS = Path(__file__).parents[1] / "corpus"
PLURALS = {"Pod": "pods", "Namespace": "namespaces", "Deployment": "deployments",
           "StatefulSet": "statefulsets", "DaemonSet": "daemonsets", "ReplicaSet": "replicasets",
           "Job": "jobs", "CronJob": "cronjobs",
           "DeviceClass": "deviceclasses", "ResourceClaim": "resourceclaims",
           "ResourceClaimTemplate": "resourceclaimtemplates", "ResourceSlice": "resourceslices"}
CLUSTER_SCOPED = {"Namespace", "DeviceClass", "ResourceSlice"}


def _dry_run(server: ApiServer, obj: dict[str, Any]) -> str | None:
    base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    ns = "" if obj["kind"] in CLUSTER_SCOPED else "/namespaces/default"
    try:
        server.request("POST", f"{base}{ns}/{PLURALS[obj['kind']]}?dryRun=All&fieldValidation=Strict", obj)
        return None
    except urllib.error.HTTPError as exc:
        return str(exc.read().decode())


def _present(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield (*prefix, k)
            yield from _present(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _present(v, (*prefix, i))


def test_every_missing_field_review_reports_is_refused(server: ApiServer) -> None:
    """Each corpus object the API server accepts, with one field removed at a time: whenever review
    reports a missing required field, the API server refuses the object too (each field once per kind)."""
    from webhook.review.inputs import iter_file

    schemas = openapi.load("1.37")
    seen: set[tuple[Any, ...]] = set()
    refused, accepted = 0, []
    for path in sorted(p for p in CORPUS.rglob("*.yaml") if p.parent != CORPUS):
        for objs, _ in iter_file(path):
            for item in objs:
                obj = json.loads(json.dumps(item.obj, default=str))
                if f"{obj.get('apiVersion')}/{obj.get('kind')}" not in schemas.roots:
                    continue
                obj.setdefault("metadata", {}).pop("namespace", None)
                if _dry_run(server, obj) is not None:
                    continue  # refused as it is (a corpus file expected to be denied)
                for field in _present(obj):
                    key = (obj["kind"], *(k for k in field if not isinstance(k, int)))
                    if key in seen or field[0] in ("status", "metadata"):
                        continue
                    cut = copy.deepcopy(obj)
                    node: Any = cut
                    for k in field[:-1]:
                        node = node[k]
                    del node[field[-1]]
                    found = openapi.validate(cut, schemas)
                    if not found or not any(p.message == "Required value" for p in found[0]):
                        continue
                    seen.add(key)
                    if _dry_run(server, cut) is None:
                        accepted.append(key)
                    else:
                        refused += 1
    assert accepted == []
    assert refused > 50


def test_every_value_outside_an_enum_review_reports_is_refused(server: ApiServer) -> None:
    """Each corpus object the API server accepts, with one enum field (imagePullPolicy, protocol,
    operator, ...) set to a value outside its enum at a time: review's `Unsupported value` is the API
    server's too (each field once per kind)."""
    from webhook.review.inputs import iter_file

    schemas = openapi.load("1.37")
    seen: set[tuple[Any, ...]] = set()
    refused, accepted = 0, []
    for path in sorted(p for p in CORPUS.rglob("*.yaml") if p.parent != CORPUS):
        for objs, _ in iter_file(path):
            for item in objs:
                obj = json.loads(json.dumps(item.obj, default=str))
                if f"{obj.get('apiVersion')}/{obj.get('kind')}" not in schemas.roots:
                    continue
                obj.setdefault("metadata", {}).pop("namespace", None)
                if _dry_run(server, obj) is not None:
                    continue
                for field in _present(obj):
                    key = (obj["kind"], *(k for k in field if not isinstance(k, int)))
                    if key in seen or field[0] == "status":
                        continue
                    changed = copy.deepcopy(obj)
                    node: Any = changed
                    for k in field[:-1]:
                        node = node[k]
                    if not isinstance(node[field[-1]], str):
                        continue
                    node[field[-1]] = "NotAValue"
                    found = openapi.validate(changed, schemas)
                    if not found or not any(p.message.startswith("Unsupported value") for p in found[0]):
                        continue
                    seen.add(key)
                    if _dry_run(server, changed) is None:
                        accepted.append(key)
                    else:
                        refused += 1
    assert accepted == []
    assert refused > 5
