"""Read and validate policy documents. File reading is the edge; parsing and validation are pure.

Every error names the file, the line and the field path, and says what to do.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ..core.findings import Mode
from ..core.source import SourceObject
from ..dra import yamlload
from ..dra.objects import DRA_KINDS
from ..dra.workloads import POD_SPEC_PATHS, TemplatePath
from . import schema_text
from .model import (
    API_VERSION,
    TEAM_LABEL,
    CelCheckSetting,
    CelLintPolicy,
    GpuQuotaPolicy,
    GpuTierPolicy,
    MigrationMode,
    MigrationPolicy,
    MigrationStrategy,
    NamespaceScope,
    ObjectSelector,
    Policy,
    PolicyException,
    PolicySet,
    QuotaBudget,
    ResourceMapping,
    TierClass,
    WorkloadKind,
    WorkloadKindPolicy,
    WorkloadMatch,
)

POLICY_SUFFIXES = (".yaml", ".yml", ".json")


class PolicyError(ValueError):
    """A policy document that cannot be used: where (file, line, field path), what, and the fix."""

    def __init__(
        self, file: str | None, line: int | None, field_path: str, message: str, fix: str = ""
    ) -> None:
        self.file = file
        self.line = line
        self.field_path = field_path
        self.message = message
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.file or "<policies>"
        if self.line is not None:
            where += f":{self.line}"
        field = f" {self.field_path}:" if self.field_path else ""
        fix = f" (fix: {self.fix})" if self.fix else ""
        return f"{where}:{field} {self.message}{fix}"


@cache
def policy_schema() -> dict[str, Any]:
    """The JSON Schema of policy documents (draft 2020-12)."""
    data: dict[str, Any] = json.loads(schema_text())
    return data


@cache
def _validator() -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(policy_schema())
    validator: jsonschema.protocols.Validator = cls(policy_schema(), format_checker=cls.FORMAT_CHECKER)
    return validator


# -- YAML with line numbers ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class YamlDoc:
    """One YAML document as plain data, with the line (1-based) of every JSON pointer in it."""

    data: Any
    lines: dict[str, int]
    line: int


def _esc(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


_constructor = yaml.constructor.SafeConstructor()


def _construct(node: yaml.Node) -> Any:
    try:
        return _constructor.construct_object(node, deep=True)
    except (ValueError, TypeError, yaml.constructor.ConstructorError):
        # e.g. 2026-13-45 looks like a timestamp but is not a date: keep the text, the schema reports it.
        return node.value if isinstance(node, yaml.ScalarNode) else None


def _to_data(node: yaml.Node, pointer: str, lines: dict[str, int], depth: int = 0) -> Any:
    if depth > 200:
        raise ValueError("document nested too deeply")
    lines.setdefault(pointer, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        _constructor.flatten_mapping(node)
        out: dict[str, Any] = {}
        for k_node, v_node in node.value:
            key = _construct(k_node)
            key = key if isinstance(key, str) else str(key)
            p = f"{pointer}/{_esc(key)}"
            lines[p] = k_node.start_mark.line + 1
            out[key] = _to_data(v_node, p, lines, depth + 1)
            lines[p] = k_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_data(v, f"{pointer}/{i}", lines, depth + 1) for i, v in enumerate(node.value)]
    value = _construct(node)
    # Dates stay text: the schema and the object model read ISO strings.
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return value


def parse_yaml_documents(text: str, source: str | None = None) -> list[YamlDoc]:
    """Every non-empty document of a (multi-document) YAML or JSON text, with pointer -> line maps.

    Raises PolicyError (file and line) on YAML syntax errors; callers outside policies may catch it
    as ValueError.
    """
    out: list[YamlDoc] = []
    try:
        # Alias-checked: _to_data expands aliases, so a "billion laughs" must be refused first.
        for node in yamlload.compose_all(text):
            if node is None:
                continue
            lines: dict[str, int] = {}
            data = _to_data(node, "", lines)
            out.append(YamlDoc(data, lines, node.start_mark.line + 1))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise PolicyError(
            source,
            mark.line + 1 if mark is not None else None,
            "",
            f"invalid YAML: {problem}",
            "fix the YAML syntax at that line",
        ) from None
    except ValueError as e:
        raise PolicyError(source, None, "", f"invalid YAML: {e}") from None
    return out


# -- validation and construction -----------------------------------------------------------------


def _field_path(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _pointer(path: Iterable[Any]) -> str:
    return "".join(f"/{_esc(str(p))}" for p in path)


def _line_for(lines: Mapping[str, int] | None, base: int | None, path: Iterable[Any]) -> int | None:
    if not lines:
        return base
    p = _pointer(path)
    while p:
        if p in lines:
            return lines[p]
        p = p.rsplit("/", 1)[0]
    return base


def _schema_error_text(err: jsonschema.ValidationError) -> tuple[str, str]:
    v = err.validator
    if v == "required":
        return err.message, "add the missing field"
    if v == "additionalProperties":
        return err.message, "remove or rename the field (see `draguard schema`)"
    if v in ("enum", "const"):
        allowed = err.validator_value if v == "enum" else [err.validator_value]
        return f"{err.instance!r} is not one of {allowed}", "use one of the allowed values"
    if v == "oneOf":
        return "must set exactly one of the alternatives (e.g. `namespace` or `team`)", "keep exactly one"
    if v == "anyOf":
        return "must set at least one of the listed fields", "add one of them"
    return err.message, "see `draguard schema` for the expected shape"


def validate_document(
    doc: Any, file: str | None = None, lines: Mapping[str, int] | None = None, line: int | None = None
) -> None:
    """Schema-check one document; PolicyError on the most relevant violation."""
    if not isinstance(doc, Mapping):
        raise PolicyError(
            file,
            line,
            "",
            f"a policy document must be a mapping, got {type(doc).__name__}",
            f"start the document with `apiVersion: {API_VERSION}`",
        )
    errors = list(_validator().iter_errors(doc))
    if not errors:
        return
    best = jsonschema.exceptions.best_match(errors)
    # `if/then` errors point into spec; report the deepest one under the best branch.
    path = list(best.absolute_path)
    msg, fix = _schema_error_text(best)
    kind = doc.get("kind")
    prefix = f"{kind} " if isinstance(kind, str) else ""
    raise PolicyError(
        file, _line_for(lines, line, path), _field_path(path) or "(document)", prefix + msg, fix
    )


def _mode(value: Any, default: Mode) -> Mode:
    return Mode(value) if isinstance(value, str) else default


def _scope(spec: Mapping[str, Any]) -> NamespaceScope:
    return NamespaceScope(
        namespaces=tuple(spec.get("namespaces", ())),
        exclude=tuple(spec.get("excludeNamespaces", ())),
        match_labels=dict((spec.get("namespaceSelector") or {}).get("matchLabels") or {}),
    )


def _build(
    doc: Mapping[str, Any], file: str | None, line: int | None, lines: Mapping[str, int] | None
) -> Policy:
    kind = doc["kind"]
    name: str = doc["metadata"]["name"]
    spec: Mapping[str, Any] = doc["spec"]
    if kind == "GpuTierPolicy":
        classes = tuple(
            TierClass(
                name=c["name"],
                match=WorkloadMatch(
                    labels=dict(c["match"].get("labels", {})),
                    annotations=dict(c["match"].get("annotations", {})),
                    images=tuple(c["match"].get("images", ())),
                    commands=tuple(c["match"].get("commands", ())),
                    label_words={k: tuple(v) for k, v in c["match"].get("labelWords", {}).items()},
                    image_words=tuple(c["match"].get("imageWords", ())),
                    modules=tuple(c["match"].get("modules", ())),
                ),
                device_classes=tuple(c["deviceClasses"]),
                relabel_to=tuple(c.get("relabelTo", ())),
            )
            for c in spec["classes"]
        )
        seen: set[str] = set()
        for i, c in enumerate(classes):
            if c.name in seen:
                raise PolicyError(
                    file,
                    _line_for(lines, line, ["spec", "classes", i, "name"]),
                    f"spec.classes[{i}].name",
                    f"duplicate class name {c.name!r}",
                    "give every class a distinct name",
                )
            seen.add(c.name)
        for i, c in enumerate(classes):
            for j, target in enumerate(c.relabel_to):
                if target not in seen:
                    raise PolicyError(
                        file,
                        _line_for(lines, line, ["spec", "classes", i, "relabelTo", j]),
                        f"spec.classes[{i}].relabelTo[{j}]",
                        f"unknown class {target!r}",
                        "name a class of this policy: " + ", ".join(sorted(seen)),
                    )
        return GpuTierPolicy(name, classes, _mode(spec.get("mode"), Mode.ENFORCE), _scope(spec), file, line)
    if kind == "GpuQuotaPolicy":
        budgets = tuple(
            QuotaBudget(
                scope="namespace" if "namespace" in b else "team" if "team" in b else "default",
                name=b.get("namespace") or b.get("team") or "*",
                device_classes=dict(b.get("deviceClasses", {})),
                gpu_equivalents=float(b["gpuEquivalents"]) if "gpuEquivalents" in b else None,
                claims=b.get("claims"),
            )
            for b in spec["budgets"]
        )
        return GpuQuotaPolicy(
            name,
            budgets,
            _mode(spec.get("mode"), Mode.ENFORCE),
            spec.get("teamLabel", TEAM_LABEL),
            file,
            line,
        )
    if kind == "CelLintPolicy":
        checks = {
            k: CelCheckSetting(
                enabled=v.get("enabled", True),
                mode=Mode(v["mode"]) if "mode" in v else None,
                severity=v.get("severity"),
            )
            for k, v in (spec.get("checks") or {}).items()
        }
        return CelLintPolicy(name, _mode(spec.get("mode"), Mode.WARN), checks, _scope(spec), file, line)
    if kind == "MigrationPolicy":
        mappings = tuple(
            ResourceMapping(
                resource=m["resource"],
                device_class=m["deviceClass"],
                node_selector=dict(m.get("nodeSelector", {})),
                selectors=tuple(m.get("selectors", ())),
            )
            for m in spec["mappings"]
        )
        return MigrationPolicy(
            name=name,
            mappings=mappings,
            default_mode=MigrationMode(spec.get("defaultMode", "warn")),
            namespaces={e["namespace"]: MigrationMode(e["mode"]) for e in spec.get("namespaceModes", ())},
            label_modes={e["label"]: MigrationMode(e["mode"]) for e in spec.get("labelModes", ())},
            strategy=MigrationStrategy(spec.get("strategy", "claim-template")),
            claim_api_version=spec.get("claimApiVersion", "resource.k8s.io/v1"),
            scope=_scope(spec),
            source=file,
            line=line,
        )
    if kind == "WorkloadKindPolicy":
        return WorkloadKindPolicy(name, _workload_kinds(spec, file, line, lines), file, line)
    # PolicyException (the schema admits nothing else)
    try:
        expires = dt.date.fromisoformat(spec["expires"])
    except ValueError:
        raise PolicyError(
            file,
            _line_for(lines, line, ["spec", "expires"]),
            "spec.expires",
            f"{spec['expires']!r} is not a calendar date",
            "write it as YYYY-MM-DD",
        ) from None
    return PolicyException(
        name=name,
        expires=expires,
        rules=tuple(spec.get("rules", ())),
        namespaces=tuple(spec.get("namespaces", ())),
        objects=tuple(
            ObjectSelector(o.get("kind", "*"), o.get("name", "*"), o.get("namespace", "*"))
            for o in spec.get("objects", ())
        ),
        reason=spec.get("reason", ""),
        source=file,
        line=line,
    )


def _workload_kinds(
    spec: Mapping[str, Any], file: str | None, line: int | None, lines: Mapping[str, int] | None
) -> tuple[WorkloadKind, ...]:
    out: list[WorkloadKind] = []
    seen: set[tuple[str, str]] = set()

    def error(path: list[Any], msg: str, fix: str) -> PolicyError:
        full = ["spec", *path]
        return PolicyError(file, _line_for(lines, line, full), _field_path(full), msg, fix)

    for i, k in enumerate(spec["kinds"]):
        group, kind = k["apiGroup"], k["kind"]
        if kind in POD_SPEC_PATHS or kind in DRA_KINDS:
            raise error(
                ["kinds", i, "kind"],
                f"WorkloadKindPolicy kind {kind!r} is a built-in kind name: draguard reads objects of that "
                "kind as the built-in one, whatever their group",
                "only CRDs can be added; built-in workload kinds are read already",
            )
        if group.endswith((".k8s.io", ".kubernetes.io")) and not group.endswith(".x-k8s.io"):
            raise error(
                ["kinds", i, "apiGroup"],
                f"WorkloadKindPolicy apiGroup {group!r} is reserved for Kubernetes' own APIs",
                "name the CRD's own group (as in its apiVersion, without the version)",
            )
        if (group, kind) in seen:
            raise error(
                ["kinds", i],
                f"WorkloadKindPolicy lists {group}/{kind} twice",
                "give each CRD one entry, with all its templates",
            )
        seen.add((group, kind))
        templates: list[TemplatePath] = []
        for j, t in enumerate(k["templates"]):
            path: str = t["path"]
            for n, rep in enumerate(t.get("replicas", ())):
                if rep.startswith("./") and "*" not in path.split("/"):
                    raise error(
                        ["kinds", i, "templates", j, "replicas", n],
                        f"WorkloadKindPolicy replicas path {rep!r} is relative (./) but the template path "
                        f"{path!r} has no `*` element to be relative to",
                        "write the path from the object root (no leading ./)",
                    )
            replicas = tuple(t.get("replicas", ()))
            templates.append(TemplatePath(path, replicas, bool(t.get("container", False))))
        out.append(WorkloadKind(group, kind, tuple(templates), k.get("resource")))
    return tuple(out)


def parse_policy_documents(
    docs: Iterable[tuple[Mapping[str, Any], str | None, int | None]],
    lines: Mapping[int, Mapping[str, int]] | None = None,
) -> PolicySet:
    """Validate and build policies from (document, file, line) triples.

    `lines` optionally maps a document's position in `docs` to its pointer -> line map, so schema
    errors point at the offending field rather than the document start. Names must be unique per kind.
    """
    policies: list[Policy] = []
    seen: dict[tuple[str, str], str] = {}
    crds: dict[tuple[str, str], str] = {}
    for i, (doc, file, line) in enumerate(docs):
        doc_lines = lines.get(i) if lines else None
        validate_document(doc, file, doc_lines, line)
        pol = _build(doc, file, line, doc_lines)
        key = (str(doc["kind"]), pol.name)
        if key in seen:
            raise PolicyError(
                file,
                line,
                "metadata.name",
                f"{key[0]} {pol.name!r} is defined twice (first in {seen[key]})",
                "rename one of them",
            )
        seen[key] = f"{file or '<policies>'}:{line}" if line else (file or "<policies>")
        if isinstance(pol, WorkloadKindPolicy):
            for wk in pol.kinds:
                other = crds.get((wk.group, wk.kind))
                if other is not None:
                    raise PolicyError(
                        file,
                        line,
                        "spec.kinds",
                        f"WorkloadKindPolicy {pol.name!r} lists {wk.group}/{wk.kind}, which "
                        f"WorkloadKindPolicy {other} lists already",
                        "keep one entry per CRD",
                    )
                crds[(wk.group, wk.kind)] = repr(pol.name)
        policies.append(pol)
    return PolicySet.of(policies)


def parse_policy_text(text: str, source: str | None = None) -> PolicySet:
    """Policies from one YAML/JSON text (multi-document)."""
    ydocs = parse_yaml_documents(text, source)
    return parse_policy_documents(
        [(d.data, source, d.line) for d in ydocs], {i: d.lines for i, d in enumerate(ydocs)}
    )


def policy_files(path: str | Path) -> list[Path]:
    """The policy files `load_policies` reads: the file itself, or *.yaml/*.yml/*.json in a directory
    (not recursive: `tests/` subdirectories hold suites, not policies), sorted by name."""
    p = Path(path)
    if p.is_dir():
        return sorted(f for f in p.iterdir() if f.is_file() and f.suffix in POLICY_SUFFIXES)
    return [p]


def load_policies(path: str | Path) -> PolicySet:
    """Read a policy file or directory. PolicyError names file, line and field on any problem."""
    p = Path(path)
    if not p.exists():
        raise PolicyError(str(p), None, "", "no such file or directory", "check the --policies path")
    docs: list[tuple[Mapping[str, Any], str | None, int | None]] = []
    lines: dict[int, Mapping[str, int]] = {}
    for f in policy_files(p):
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise PolicyError(str(f), None, "", f"cannot read file ({e})") from None
        for d in parse_yaml_documents(text, str(f)):
            lines[len(docs)] = d.lines
            docs.append((d.data, str(f), d.line))
    return parse_policy_documents(docs, lines)


def source_objects(text: str, file: str | None = None) -> list[SourceObject]:
    """Kubernetes objects from a YAML/JSON text as engine inputs, with per-field lines.

    Empty documents are skipped; a document that is not a mapping is kept (the engine ignores it).
    Raises PolicyError (a ValueError) with file and line on YAML syntax errors.
    """
    return [
        SourceObject(
            obj=d.data if isinstance(d.data, Mapping) else {},
            file=file,
            line=d.line,
            doc_index=i,
            lines=d.lines,
        )
        for i, d in enumerate(parse_yaml_documents(text, file))
    ]
