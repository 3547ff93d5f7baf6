"""Every built object checked against the Kubernetes API schema, as generated into the `kubernetes`
client's models (no hand-written schemas): unknown fields, wrong types, missing required fields.

Custom resources (cert-manager, Prometheus Operator, Karpenter) have no model in the client; they are
listed in CRD_KINDS and left to the server-side dry run of the e2e suite.
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes.client as k8s
import pytest
from kbundle import OVERLAYS, build

CRD_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
}


def model_name(api_version: str, kind: str) -> str:
    version = api_version.split("/")[-1]
    return version[0].upper() + version[1:] + kind


def strict_errors(data: Any, type_name: str, path: str) -> list[str]:
    """Walk `data` along the client's openapi_types; report each field the API would not accept."""
    if type_name == "object":  # free-form (IntOrString, opaque parameters, ...)
        return []
    if m := re.fullmatch(r"List\[(.+)\]", type_name):
        if not isinstance(data, list):
            return [f"{path}: expected a list, got {type(data).__name__}"]
        return [e for i, item in enumerate(data) for e in strict_errors(item, m.group(1), f"{path}[{i}]")]
    if m := re.fullmatch(r"Dict\[str, (.+)\]", type_name):
        if not isinstance(data, dict):
            return [f"{path}: expected a map, got {type(data).__name__}"]
        return [e for k, v in data.items() for e in strict_errors(v, m.group(1), f"{path}.{k}")]
    if type_name in _PRIMITIVES:
        ok = isinstance(data, _PRIMITIVES[type_name]) and not (type_name != "bool" and isinstance(data, bool))
        return [] if ok else [f"{path}: expected {type_name}, got {type(data).__name__} {data!r}"]
    model = getattr(k8s, type_name)
    if not isinstance(data, dict):
        return [f"{path}: expected an object ({type_name}), got {type(data).__name__}"]
    by_json = {v: k for k, v in model.attribute_map.items()}
    errs = []
    for key, value in data.items():
        if key not in by_json:
            errs.append(f"{path}.{key}: unknown field for {type_name}")
            continue
        errs += strict_errors(value, model.openapi_types[by_json[key]], f"{path}.{key}")
    return errs


def schema_errors(obj: dict[str, Any]) -> list[str]:
    name = model_name(obj["apiVersion"], obj["kind"])
    if not hasattr(k8s, name):
        return [f"no schema model {name} for {obj['apiVersion']} {obj['kind']}"]
    errs = strict_errors(obj, name, obj["kind"])
    if not errs:
        # Required fields and enum values are enforced by the models' constructors.
        try:
            k8s.ApiClient()._ApiClient__deserialize(obj, name)
        except (ValueError, TypeError) as exc:
            errs.append(f"{obj['kind']}: {exc}")
    return errs


VARIANTS = [(o, ()) for o in OVERLAYS] + [
    ("aks", ("cert-manager", "monitoring", "fail-open-validation")),
    ("aks", ("apiserver-client-auth", "network-policy")),
    ("eks", ("eks-host-network",)),
]


@pytest.mark.parametrize(
    ("overlay", "components"), VARIANTS, ids=lambda v: "+".join(v) if isinstance(v, tuple) else v
)
def test_every_built_object_matches_the_kubernetes_schema(overlay: str, components: tuple[str, ...]) -> None:
    checked = 0
    for obj in build(overlay, components):
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        errs = schema_errors(obj)
        assert not errs, f"{obj['kind']}/{obj['metadata']['name']}:\n" + "\n".join(errs)
        checked += 1
    assert checked >= 20


def test_schema_check_catches_typos_wrong_types_and_missing_fields() -> None:
    """The checker itself can fail: each mistake below is one a reviewer could miss."""
    dep = next(o for o in build("base") if o["kind"] == "Deployment")
    import copy

    typo = copy.deepcopy(dep)
    typo["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["schema"] = "HTTPS"
    assert any("httpGet.schema: unknown field" in e for e in schema_errors(typo))
    wrong = copy.deepcopy(dep)
    wrong["spec"]["replicas"] = "3"
    assert any("spec.replicas: expected int" in e for e in schema_errors(wrong))
    missing = copy.deepcopy(dep)
    del missing["spec"]["selector"]
    assert any("selector" in e for e in schema_errors(missing))
    dc = next(o for o in build("base") if o["kind"] == "DeviceClass")
    bad = copy.deepcopy(dc)
    bad["spec"]["selectors"][0]["cel"]["expr"] = bad["spec"]["selectors"][0]["cel"].pop("expression")
    assert schema_errors(bad)


def test_only_the_listed_custom_resources_skip_the_model_check() -> None:
    kinds = {
        (o["apiVersion"], o["kind"])
        for o in build("aks", ("cert-manager", "monitoring", "fail-open-validation"))
    }
    assert kinds & CRD_KINDS == CRD_KINDS
    for api_version, kind in kinds - CRD_KINDS:
        assert hasattr(k8s, model_name(api_version, kind)), (api_version, kind)
