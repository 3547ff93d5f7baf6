"""Objects checked against the Kubernetes API's own OpenAPI schema, before any rule reads them.

A type-malformed object (`replicas: "three"`, `resources.limits` as a list) is rejected by the API
server when it decodes the request, so no rule's verdict on it matters: `draguard review` says so
first, naming the field, as `structure/schema`. The schemas are those the pinned kube-apiserver
serves at /openapi/v3, trimmed to what validation reads and shipped in `schemas/k8s-<release>.json.gz`
(`scripts/gen-openapi.py` writes them; a test checks the file against the built API server).

Offline review only: in admission the API server has decoded and validated the object before the
webhook sees it. Pure (the schema file is read once per process) and bounded: depth, nodes visited
and problems reported per object all have limits, whatever the object holds.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import date
from importlib import resources
from typing import Any

from ..core.findings import Finding, Mode, ObjectRef, Severity
from ..core.source import SourceObject
from ..dra.quantity import Quantity

RULE = "structure/schema"
MAX_PROBLEMS = 20  # per object: enough to fix a file by, bounded for hostile input
MAX_DEPTH = 100  # the engine's own limit (structure/too-deep reports deeper objects)
MAX_NODES = 200_000  # values visited per object

QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"

# The kinds draguard reviews whose schema the file carries, by API group version.
ROOT_KINDS: dict[str, tuple[str, ...]] = {
    "v1": ("Pod", "Namespace"),
    "apps/v1": ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"),
    "batch/v1": ("Job", "CronJob"),
    **{
        f"resource.k8s.io/{v}": ("DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice")
        for v in ("v1", "v1beta1", "v1beta2")
    },
}

# Schema keywords validation reads; everything else (descriptions, defaults, patch strategies,
# list-map keys) is dropped when the file is generated.
_KEPT = frozenset({
    "type", "format", "items", "properties", "additionalProperties", "required", "enum", "oneOf", "anyOf",
    "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
})
_REF_PREFIX = "#/components/schemas/"
_SCHEMAS = f"{__package__}.schemas"  # the shipped schema files: webhook/review/schemas/
_INT_RANGE = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


# --------------------------------------------------------------------------- the data file


def _trim_node(node: Any) -> Any:
    if isinstance(node, list):
        return [_trim_node(v) for v in node]
    if not isinstance(node, Mapping):
        return node
    ref = node.get("$ref")
    all_of = node.get("allOf")
    # `allOf: [{$ref}]` is how the API server attaches a description or default to a reference.
    if ref is None and isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], Mapping):
        ref = all_of[0].get("$ref")
    if isinstance(ref, str):
        return {"$ref": ref.removeprefix(_REF_PREFIX)}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in _KEPT:
            continue
        if key == "properties" and isinstance(value, Mapping):
            out[key] = {k: _trim_node(v) for k, v in value.items()}
        elif key in ("required", "enum"):
            out[key] = sorted(value) if key == "required" else list(value)
        else:
            out[key] = _trim_node(value)
    return out


def _refs(node: Any) -> Iterator[str]:
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Mapping):
            if isinstance(n.get("$ref"), str):
                yield n["$ref"]
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)


def trim(documents: Mapping[str, Mapping[str, Any]], version: str) -> dict[str, Any]:
    """The shipped form of the API server's /openapi/v3 documents (group path -> document): the
    schemas of ROOT_KINDS and everything they reference, trimmed to what `validate` reads."""
    merged: dict[str, Any] = {}
    roots: dict[str, str] = {}
    for path in sorted(documents):
        schemas = documents[path].get("components", {}).get("schemas", {})
        for name, schema in schemas.items():
            trimmed = _trim_node(schema)
            if name in merged and merged[name] != trimmed:
                raise ValueError(f"{name}: two group documents disagree on its schema ({path})")
            merged[name] = trimmed
            for gvk in schema.get("x-kubernetes-group-version-kind", ()):
                api_version = f"{gvk['group']}/{gvk['version']}" if gvk.get("group") else gvk["version"]
                if gvk.get("kind") in ROOT_KINDS.get(api_version, ()):
                    roots[f"{api_version}/{gvk['kind']}"] = name
    wanted = {f"{av}/{k}" for av, kinds in ROOT_KINDS.items() for k in kinds}
    if missing := sorted(wanted - set(roots)):
        raise ValueError(
            f"the API server serves no schema for {', '.join(missing)} (is every version enabled?)"
        )
    keep: set[str] = set()
    stack = list(roots.values())
    while stack:
        name = stack.pop()
        if name in keep:
            continue
        if name not in merged:
            raise ValueError(f"schema {name} is referenced but not served")
        keep.add(name)
        stack.extend(_refs(merged[name]))
    return {
        "kubernetes": version,
        "roots": dict(sorted(roots.items())),
        "schemas": {n: merged[n] for n in sorted(keep)},
    }


def encode(data: Mapping[str, Any]) -> bytes:
    """The file's bytes: sorted, compact JSON, gzip without a timestamp (the same input, the same file)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return gzip.compress(text, compresslevel=9, mtime=0)


@dataclass(frozen=True, slots=True)
class SchemaSet:
    """One release's schemas: `roots` maps `apiVersion/kind` to a schema name."""

    release: str
    roots: Mapping[str, str]
    schemas: Mapping[str, Mapping[str, Any]]


def shipped_releases() -> tuple[str, ...]:
    """Releases with a schema file in the package (`1.37`, ...), oldest first."""
    names = [p.name for p in resources.files(_SCHEMAS).iterdir()]
    found = [
        n.removeprefix("k8s-").removesuffix(".json.gz")
        for n in names
        if n.startswith("k8s-") and n.endswith(".json.gz")
    ]
    return tuple(sorted(found, key=_key))


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split(".") if p.isdigit())


def pick_release(release: str | None) -> tuple[str, str | None]:
    """The schema file to judge `release` by, and a note when it is another release's: the nearest
    newer one (the API only grows within v1; a field new in it is accepted offline, never refused),
    or the newest when `release` is newer than every file."""
    shipped = shipped_releases()
    if not shipped:
        raise RuntimeError("no Kubernetes schema file in webhook/review/schemas (a broken install)")
    if release is None or release in shipped:
        return (release or shipped[-1]), None
    newer = [r for r in shipped if _key(r) > _key(release)]
    chosen = newer[0] if newer else shipped[-1]
    return chosen, f"no Kubernetes {release} schema shipped: objects are checked against {chosen}'s"


@functools.lru_cache(maxsize=4)
def load(release: str) -> SchemaSet:
    raw = resources.files(_SCHEMAS).joinpath(f"k8s-{release}.json.gz").read_bytes()
    data = json.loads(gzip.decompress(raw))
    return SchemaSet(release, data["roots"], data["schemas"])


# --------------------------------------------------------------------------- validation


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing the API server would refuse: the field as it names it, a JSON pointer for the
    line, and what it would say. `unknown` marks a field the schema lacks (strict field validation)."""

    field: str
    pointer: str
    message: str
    fix: str
    unknown: bool = False
    decode: bool = False  # refused when the request is decoded, before validation


class _Walk:
    def __init__(self, schemas: SchemaSet) -> None:
        self.schemas = schemas.schemas
        self.problems: list[Problem] = []
        self.more = 0
        self.nodes = 0

    def report(
        self, path: list[str], message: str, fix: str, unknown: bool = False, decode: bool = False
    ) -> None:
        if len(self.problems) >= MAX_PROBLEMS:
            self.more += 1
            return
        self.problems.append(Problem(_field(path), _pointer(path), message, fix, unknown, decode))

    def check(self, schema: Mapping[str, Any], value: Any, path: list[str], status: bool) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES or len(path) > MAX_DEPTH:
            return
        ref = schema.get("$ref")
        if isinstance(ref, str):
            if ref == QUANTITY:
                self._quantity(value, path)
                return
            if ref == INT_OR_STRING:
                self._int_or_string(value, path)
                return
            target = self.schemas.get(ref)
            if target is None:
                return
            schema = target
        if value is None:
            return  # JSON null decodes to the field's zero value
        if schema.get("x-kubernetes-int-or-string") or schema.get("format") == "int-or-string":
            self._int_or_string(value, path)
            return
        alternatives = schema.get("oneOf") or schema.get("anyOf")
        if isinstance(alternatives, list) and "type" not in schema:
            types = [a.get("type") for a in alternatives if isinstance(a, Mapping)]
            if types and not any(_is_type(value, t, None) for t in types):
                self.report(path, f"expected one of {', '.join(map(str, types))}, got {_shown(value)}",
                            f"write {_field(path)} as one of: {', '.join(map(str, types))}", decode=True)
            return
        typ = schema.get("type")
        fmt = schema.get("format")
        if typ == "object" or (typ is None and ("properties" in schema or "additionalProperties" in schema)):
            if not isinstance(value, Mapping):
                self._wrong(path, "an object (a map of fields)", value)
                return
            self._object(schema, value, path, status)
            return
        if typ == "array":
            if not isinstance(value, list):
                self._wrong(path, "a list", value)
                return
            items = schema.get("items")
            if isinstance(items, Mapping):
                for i, v in enumerate(value):
                    self.check(items, v, [*path, f"[{i}]"], status)
            return
        if isinstance(typ, str) and not _is_type(value, typ, fmt):
            if typ == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
                fmt = fmt if fmt in _INT_RANGE else "int64"
                low, high = _INT_RANGE[fmt]
                if isinstance(value, float) and not value.is_integer():
                    self.report(path, f"{value!r} is not a whole number ({fmt} field)",
                                f"write {_field(path)} as a whole number", decode=True)
                else:
                    self.report(path, f"{value!r} is out of range for an {fmt} field ({low} to {high})",
                                f"set {_field(path)} to a value between {low} and {high}", decode=True)
                return
            self._wrong(path, _expected(typ, fmt), value)
            return
        enum = schema.get("enum")
        if isinstance(enum, list) and isinstance(value, str) and value and value not in enum:
            allowed = ", ".join(f'"{e}"' for e in enum)
            self.report(path, f'Unsupported value: "{value}": supported values: {allowed}',
                        f"set {_field(path)} to one of {allowed} (the case matters)")

    def _object(
        self, schema: Mapping[str, Any], value: Mapping[Any, Any], path: list[str], status: bool
    ) -> None:
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        extra = schema.get("additionalProperties")
        # No properties and no additionalProperties: an opaque object (RawExtension, FieldsV1).
        preserve = schema.get("x-kubernetes-preserve-unknown-fields")
        open_ended = preserve or extra is True or (not props and extra is None)
        for key, v in value.items():
            if not isinstance(key, str):
                # kubectl turns YAML's number and boolean keys into strings before it sends the object.
                key = ("true" if key else "false") if isinstance(key, bool) else str(key)
            child = [*path, key]
            sub = props.get(key)
            if isinstance(sub, Mapping):
                self.check(sub, v, child, status or (not path and key == "status"))
            elif isinstance(extra, Mapping):
                self.check(extra, v, child, status)
            elif not open_ended:
                self.report(child, f'unknown field "{_field(child)}"',
                            f"remove {_field(child)} or correct its name (check spelling and indentation)",
                            unknown=True)
        required = schema.get("required")
        if isinstance(required, list) and not status:
            for key in required:
                # Missing or null alike decode to the zero value. A number's or boolean's may be
                # valid (a preStop sleep of 0 seconds is): the API server's validation decides.
                if value.get(key) is None and not self._scalar(props.get(key)):
                    child = [*path, key]
                    self.report(child, "Required value", f"add {_field(child)}")

    def _scalar(self, schema: Any) -> bool:
        if isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
            schema = self.schemas.get(schema["$ref"])
        return isinstance(schema, Mapping) and schema.get("type") in ("integer", "number", "boolean")

    def _quantity(self, value: Any, path: list[str]) -> None:
        if isinstance(value, bool) or not isinstance(value, str | int | float | type(None)):
            self._wrong(path, "a quantity (a string such as 80Gi or 500m, or a number)", value)
            return
        if isinstance(value, float) and not math.isfinite(value):
            self._wrong(path, "a finite quantity", value)
            return
        if isinstance(value, str):
            try:
                Quantity.parse(value)
            except ValueError:
                self.report(path, f"{_shown(value)}: quantities must match the regular expression "
                            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                            f"write {_field(path)} as a number with an optional suffix, e.g. 1, 500m or 80Gi",
                            decode=True)

    def _int_or_string(self, value: Any, path: list[str]) -> None:
        if value is None or isinstance(value, str):
            return
        if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not value.is_integer()
        ):
            self._wrong(path, "an integer or a string (e.g. 1 or \"25%\")", value)

    def _wrong(self, path: list[str], expected: str, value: Any) -> None:
        self.report(path, f"expected {expected}, got {_shown(value)}", f"write {_field(path)} as {expected}",
                    decode=True)


def _is_type(value: Any, typ: Any, fmt: Any) -> bool:
    if typ == "string":
        # YAML turns unquoted timestamps into dates; kubectl writes them back as RFC 3339 strings.
        return isinstance(value, str) or (fmt == "date-time" and isinstance(value, date))
    if typ == "boolean":
        return isinstance(value, bool)
    if typ == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if typ == "integer":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        # YAML `3.0` reaches the API server as JSON 3, which decodes into an integer field.
        if isinstance(value, float) and not value.is_integer():
            return False
        low, high = _INT_RANGE.get(str(fmt), _INT_RANGE["int64"])
        return low <= value <= high
    if typ == "object":
        return isinstance(value, Mapping)
    if typ == "array":
        return isinstance(value, list)
    return True


def _expected(typ: str, fmt: Any) -> str:
    base = {"string": "a string", "boolean": "true or false", "number": "a number", "integer": "an integer"}
    text = base.get(typ, typ)
    return f"{text} ({fmt})" if fmt and typ == "integer" else text


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {'true' if value else 'false'}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {json.dumps(shown)}"
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _field(path: list[str]) -> str:
    out = ""
    for p in path:
        out += p if p.startswith("[") or not out else f".{p}"
    return out or "<object>"


def _pointer(path: list[str]) -> str:
    return "".join(
        "/" + (p[1:-1] if p.startswith("[") else p.replace("~", "~0").replace("/", "~1")) for p in path
    )


def validate(obj: Mapping[str, Any], schemas: SchemaSet) -> tuple[list[Problem], int] | None:
    """The problems the API server would report decoding and validating `obj` (at most MAX_PROBLEMS,
    and how many more there were), or None when the schema set has no schema for its kind (CRDs)."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return None
    name = schemas.roots.get(f"{api_version}/{kind}")
    if name is None:
        return None
    walk = _Walk(schemas)
    walk.check({"$ref": name}, obj, [], False)
    return walk.problems, walk.more


# Fields a rule of the engine reports with a better fix than "unknown field" (the pre-1.31 inline
# claim source: structure/inline-source); reported once, by the rule.
_RULE_FIELDS = re.compile(r"(^|\.)resourceClaims\[\d+\]\.source$")


def findings(item: SourceObject, ref: ObjectRef, schemas: SchemaSet) -> list[Finding]:
    """`structure/schema` findings for one object (none for kinds without a schema: CRDs, and none
    for an object nested past the engine's limit, which structure/too-deep denies on its own)."""
    from ..dra.objects import claim_problems
    from ..engine.evaluate import MAX_DEPTH as ENGINE_DEPTH
    from ..engine.evaluate import too_deep

    found = validate(item.obj, schemas)
    if found is None or too_deep(item.obj, ENGINE_DEPTH) is not None:
        return []
    problems, more = found
    # A claim shape structure/invalid already reports (a missing deviceClassName, a bad count) is
    # one problem, reported once, by the rule a PolicyException for it names.
    covered = [sp.pointer for sp in claim_problems(item.obj)]
    out: list[Finding] = []
    for p in problems:
        if p.unknown and _RULE_FIELDS.search(p.field):
            continue
        if any(p.pointer == c or p.pointer.startswith(c + "/") for c in covered):
            continue
        server = f"the Kubernetes {schemas.release} API server"
        if p.unknown:
            said = (f"{p.message}: {server} has no such field, and rejects it under strict field validation "
                    "(kubectl apply's default; server-side apply always)")
        elif p.decode:
            said = f"{p.field}: {p.message} ({server} cannot decode the {ref.kind})"
        else:
            said = f"{p.field}: {p.message} ({server} rejects the {ref.kind})"
        out.append(Finding(
            rule=RULE, severity=Severity.ERROR, mode=Mode.ENFORCE, object=ref,
            message=said,
            fix=p.fix[:1].upper() + p.fix[1:] + ".", file=item.file, line=item.line_of(p.pointer),
        ))
    if more and out:
        last = out[-1]
        out[-1] = replace(last, message=f"{last.message} ({more} more schema problems in this object)")
    return out
