"""`.draguard.yaml`: a repository's defaults for `draguard review`.

Found in the working directory, else at the repository root (git top-level); `--config PATH` names
one, `--no-config` ignores it. Options given on the command line win over the file. Paths in the
file are relative to the directory that holds it, so a run from any subdirectory reads the same
files. Every mistake (unknown key, wrong type, bad value) is one line naming the file, the line and
the key, and what to write instead.

    review:
      paths: [deploy/, clusters/prod/]
      policies: policies/
      inventory: cluster/inventory.yaml
      format: [text, sarif=draguard.sarif]
      fail-on: warning
      exclude: [deploy/vendor/, "**/*-test.yaml"]
      allow-empty: false
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_NAME = ".draguard.yaml"
MAX_CONFIG_BYTES = 256 * 1024  # a settings file, not a manifest: anything larger is a mistake
MAX_LIST = 1_000  # entries of one list option
MAX_GLOB_MATCHES = 100_000  # paths one `exclude` pattern may name


class ConfigError(Exception):
    """A config file that cannot be used; `str()` is one line: file:line: key: problem; fix."""


@dataclass(frozen=True, slots=True)
class Option:
    """One `review:` key: its kind, and how a value is checked (None: any value of the kind)."""

    kind: str  # "str", "path", "paths", "strs", "bool"
    help: str
    check: Callable[[str], str | None] | None = None  # a message when the value is wrong


def _choice(*allowed: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in allowed else f"{value!r} is not one of {', '.join(allowed)}"

    return check


def _format(value: str) -> str | None:
    import argparse

    from .commands import format_spec

    try:
        format_spec(value)
    except argparse.ArgumentTypeError as exc:
        return str(exc)
    return None


def _version(value: str) -> str | None:
    from ..cel import versions

    try:
        versions.parse_version(value)
    except ValueError as exc:
        return str(exc)
    return None


OPTIONS: dict[str, Option] = {
    "paths": Option("paths", "what to review when no PATH is given (files, directories, -)"),
    "policies": Option("path", "policy directory or file"),
    "inventory": Option("path", "ResourceSlices and DeviceClasses, as kubectl get -o yaml"),
    "cluster-state": Option("path", "namespace labels: kubectl get namespaces -o yaml"),
    "namespace": Option("str", "namespace for objects that set none"),
    "format": Option("strs", "report formats, FMT or FMT=FILE", _format),
    "output": Option("path", "the file of every format given without one"),
    "fail-on": Option("str", "exit 1 on findings of this level or above",
                      _choice("error", "warning", "info", "never")),
    "allow-empty": Option("bool", "exit 0 when the paths hold no Kubernetes object"),
    "exclude": Option("strs", "paths or glob patterns skipped when directories are walked"),
    "kubernetes-version": Option("str", "the cluster's Kubernetes release (X.Y)", _version),
    "driver": Option("str", "the DRA driver serving gpu.nvidia.com", _choice("draguard", "nvidia")),
    "rules-url": Option("str", "where docs/rules.md is published, for SARIF help links"),
    "root": Option("path", "repository root: report paths are relative to it"),
}
TOP_LEVEL = ("review",)


@dataclass(slots=True)
class ReviewConfig:
    """The `review:` settings of one file, paths made absolute; `values` holds only keys set."""

    path: Path | None = None
    values: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def find_config(cwd: Path, repo_root: Path | None) -> Path | None:
    """`.draguard.yaml` of the working directory, else of the repository root."""
    for directory in (cwd, repo_root):
        if directory is None:
            continue
        candidate = directory / CONFIG_NAME
        if candidate.is_file():
            return candidate
    return None


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def load_config(path: Path, shown: str | None = None) -> ReviewConfig:
    """Read and check one config file; `ConfigError` for anything wrong with it."""
    from .inputs import InputError, parse_text, read_text

    shown = shown or str(path)
    try:
        if path.is_file() and path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{shown}: larger than {MAX_CONFIG_BYTES // 1024} KiB; a config file holds "
                              "a few settings: check that --config names the right file")
        docs = parse_text(read_text(path, shown), shown)
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    docs = [d for d in docs if d.data is not None]
    if not docs:
        return ReviewConfig(path, {})
    if len(docs) > 1:
        raise ConfigError(
            f"{shown}:{docs[1].line}: more than one YAML document; fix: keep one (remove the ---)"
        )
    doc = docs[0]

    def where(pointer: str) -> str:
        line = doc.lines.get(pointer) if pointer else doc.line
        return f"{shown}:{line}" if line else shown

    data = doc.data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where('')}: expected a mapping with a 'review:' section, got "
                          f"{_kind(data)}; fix: start the file with 'review:'")
    for key in data:
        if key not in TOP_LEVEL:
            raise ConfigError(
                f"{where('/' + str(key))}: unknown key {str(key)!r}; {_suggest(str(key), list(TOP_LEVEL))}"
                f"fix: put review's settings under 'review:' (known: {', '.join(TOP_LEVEL)})"
            )
    section = data.get("review")
    if section is None:
        return ReviewConfig(path, {})
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"{where('/review')}: review: expected a mapping of settings, got {_kind(section)}; "
            "fix: indent the settings below it, e.g. 'fail-on: warning'"
        )
    base = path.resolve().parent
    values: dict[str, Any] = {}
    for key, value in section.items():
        pointer = f"/review/{_escape(str(key))}"
        option = OPTIONS.get(key) if isinstance(key, str) else None
        if option is None:
            raise ConfigError(
                f"{where(pointer)}: review.{key}: unknown setting; {_suggest(str(key), list(OPTIONS))}"
                f"fix: use one of {', '.join(OPTIONS)} (see docs/ci.md)"
            )
        values[key] = _value(key, option, value, base, functools.partial(where, pointer))
    return ReviewConfig(path, values)


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return type(value).__name__


def _value(key: str, option: Option, value: Any, base: Path, where: Callable[[], str]) -> Any:
    """`value` checked against `option`; paths made absolute against `base`."""

    def wrong(expected: str, example: str) -> ConfigError:
        return ConfigError(f"{where()}: review.{key}: expected {expected}, got {_kind(value)}; "
                           f"fix: e.g. '{key}: {example}'")

    if option.kind == "bool":
        if not isinstance(value, bool):
            raise wrong("true or false", "true")
        return value
    if option.kind in ("str", "path"):
        # YAML reads `1.35` as a number: a version written unquoted is taken as the text it shows.
        if key == "kubernetes-version" and isinstance(value, float | int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not value:
            raise wrong("a non-empty string", "policies/" if option.kind == "path" else "value")
        _checked(key, option, value, where)
        return str(base / value) if option.kind == "path" and value != "-" else value
    # Lists: one string is taken as a list of one.
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) and v for v in items):
        raise wrong("a list of strings", "[a, b]")
    if len(items) > MAX_LIST:
        raise ConfigError(f"{where()}: review.{key}: {len(items)} entries (at most {MAX_LIST}); fix: "
                          "name directories instead of files")
    for item in items:
        _checked(key, option, item, where)
    if option.kind == "paths":
        return [item if item == "-" else str(base / item) for item in items]
    if key == "exclude":
        return _expand(items, base, where)
    if key == "format":
        # FMT=FILE: the file is relative to the config file's directory, as every path here.
        out = []
        for item in items:
            fmt, sep, file = item.partition("=")
            out.append(f"{fmt}={base / file}" if sep and file != "-" else item)
        return out
    return list(items)


def _checked(key: str, option: Option, value: str, where: Callable[[], str]) -> None:
    if option.check is None:
        return
    problem = option.check(value)
    if problem is not None:
        raise ConfigError(f"{where()}: review.{key}: {problem}")


def _expand(patterns: list[str], base: Path, where: Callable[[], str]) -> list[str]:
    """Exclusions as paths: each entry is a path or a glob pattern below the config's directory."""
    out: list[str] = []
    for pattern in patterns:
        if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
            raise ConfigError(f"{where()}: review.exclude: {pattern!r} leaves the repository; fix: name "
                              "paths below the directory of the config file")
        if any(ch in pattern for ch in "*?["):
            for matches, match in enumerate(base.glob(pattern), 1):
                if matches > MAX_GLOB_MATCHES:
                    raise ConfigError(f"{where()}: review.exclude: {pattern!r} matches over "
                                      f"{MAX_GLOB_MATCHES:,} paths; fix: exclude their directory")
                out.append(str(match))
        else:
            out.append(str(base / pattern))
    return out


__all__ = ["CONFIG_NAME", "OPTIONS", "ConfigError", "ReviewConfig", "find_config", "load_config"]
