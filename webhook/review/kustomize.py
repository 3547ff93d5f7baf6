"""Build kustomization directories with the real `kustomize` (or `kubectl kustomize`).

Findings should point at the file the user edits, not at the build output. The build runs through
a throw-away kustomization (in a temporary directory) that lists the user's directory as its only
resource and turns on kustomize's origin annotations; each built object is then matched to its
document in the origin file, whose line map it borrows. When that wrapper cannot be built the
plain build is used and findings point at the kustomization file.

The tree under review may come from an untrusted branch, so a build reaches neither the network nor
files outside the tree: before it runs, every kustomization it will load (the directory and each
local base and component, transitively) is read and any remote reference (a URL, a git base) is
refused, as is a base outside the tree, a symbolic link leaving it or a special file; kustomize
then runs with `--load-restrictor LoadRestrictionsRootOnly` (no file outside a kustomization's
own root), without plugins or Helm inflation (their flags are never passed), in a network
namespace of its own where `unshare` can make one, and otherwise with every proxy variable
pointing at a closed local port and git limited to no protocol.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from ..core.source import SourceObject
from ..dra import yamlload
from .inputs import (
    KUSTOMIZATION_FILES,
    Document,
    InputError,
    Inputs,
    Tree,
    check_tree,
    display_path,
    objects_of,
    parse_text,
    read_text,
    resolve_in_tree,
)

ORIGIN_ANNOTATION = "config.kubernetes.io/origin"
BUILD_TIMEOUT_S = 120


def kustomize_command() -> list[str] | None:
    """`kustomize build` when the standalone binary is on PATH, else `kubectl kustomize`."""
    override = os.environ.get("DRAGUARD_KUSTOMIZE")  # e.g. "kubectl kustomize" to force the fallback
    if override:
        return override.split()
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


LOAD_RESTRICTOR = ["--load-restrictor", "LoadRestrictionsRootOnly"]
# A closed port (discard): a request that slips past the checks fails at once instead of leaving
# the runner.
_NO_PROXY_TARGET = "http://127.0.0.1:9"
_REMOTE = re.compile(r"://|^git@|^(github\.com|gitlab\.com|bitbucket\.org)/|\?(ref|version|submodules|timeout)=")
# Kustomization fields whose strings name files or directories kustomize loads.
_PATH_LISTS = ("resources", "bases", "components", "crds", "configurations", "generators", "transformers",
               "validators", "patchesStrategicMerge")  # fmt: skip
_PATH_ITEMS = ("patches", "patchesJson6902", "replacements")
_GENERATORS = ("configMapGenerator", "secretGenerator")


@functools.cache
def _can_unshare() -> bool:
    """Whether this machine lets an unprivileged process make its own network namespace."""
    if shutil.which("unshare") is None:
        return False
    try:
        proc = subprocess.run(
            ["unshare", "--net", "--map-root-user", "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def isolated(cmd: list[str]) -> list[str]:
    """`cmd` in a network namespace with no interface up, where the machine allows it."""
    return ["unshare", "--net", "--map-root-user", "--", *cmd] if _can_unshare() else cmd


def isolated_env() -> dict[str, str]:
    """The environment for kustomize and helm: no proxy that works, no git transport, no kubeconfig."""
    env = {k: v for k, v in os.environ.items() if k.upper() not in ("NO_PROXY", "KUBECONFIG")}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = _NO_PROXY_TARGET
    env["GIT_ALLOW_PROTOCOL"] = "none"  # git refuses every transport not listed
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["KUBECONFIG"] = os.devnull
    return env


def _strings(data: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(field, value) for every path-like string of a kustomization."""
    for key in _PATH_LISTS:
        entries = data.get(key)
        if isinstance(entries, list):
            yield from ((key, e) for e in entries if isinstance(e, str) and "\n" not in e)
    for key in _PATH_ITEMS:
        entries = data.get(key)
        if isinstance(entries, list):
            for e in entries:
                if isinstance(e, Mapping) and isinstance(e.get("path"), str):
                    yield key, e["path"]
    for key in _GENERATORS:
        entries = data.get(key)
        if not isinstance(entries, list):
            continue
        for gen in (e for e in entries if isinstance(e, Mapping)):
            for field_name in ("files", "envs"):
                values = gen.get(field_name)
                if isinstance(values, list):
                    yield from ((key, v.split("=", 1)[-1]) for v in values if isinstance(v, str))
            if isinstance(gen.get("env"), str):
                yield key, gen["env"]
    openapi = data.get("openapi")
    if isinstance(openapi, Mapping) and isinstance(openapi.get("path"), str):
        yield "openapi", openapi["path"]


def check_kustomization(directory: Path, tree: Tree) -> None:
    """Refuse, before kustomize runs, anything that would make it reach the network or leave `tree`:
    remote resources and bases, local bases outside the tree, links out of it, special files."""
    pending = [directory]
    done: set[Path] = set()
    walked: list[Path] = []
    while pending:
        here = resolve_in_tree(pending.pop(), tree)
        if here in done:
            continue
        done.add(here)
        if not any(here == w or w in here.parents for w in walked):
            check_tree(here, tree)
            walked.append(here)
        kfile = _kustomization_file(here)
        if kfile == here:
            continue  # not a kustomization: a plain directory of resources, already checked
        shown = display_path(kfile)
        try:
            data = yamlload.load(read_text(kfile, shown))
        except (InputError, yaml.YAMLError):
            continue  # kustomize reports it with its own words
        if not isinstance(data, Mapping):
            continue
        if data.get("helmCharts") or data.get("helmChartInflationGenerator"):
            raise InputError(
                shown,
                "uses helmCharts, which kustomize inflates by downloading charts; review builds "
                "without network: render the chart into the tree, or review the chart directory itself",
            )
        for key, value in _strings(data):
            if _REMOTE.search(value.strip()):
                raise InputError(
                    shown,
                    f"{key} names a remote location ({value}); review builds kustomizations without "
                    "network access: vendor it into the repository and refer to the local copy",
                )
            target = Path(os.path.normpath(here / value))
            if not tree.holds(target.resolve()):
                raise InputError(
                    shown,
                    f"{key} names {value}, outside the reviewed tree ({tree}); review builds only "
                    "what lies in the tree: review from the directory that holds every base",
                )
            if key in ("resources", "bases", "components") and target.is_dir():
                pending.append(target)


def _error_line(stderr: str) -> str:
    """Kustomize's error as one line: the `Error:` line when there is one, else the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("Error:"):
            return ln[len("Error:") :].strip()
    for ln in lines:
        if "err=" in ln:  # kubectl's klog form: ... "command failed" err="..."
            return ln.split("err=", 1)[1].strip().strip('"')
    return lines[-1] if lines else "build failed"


def run_build(directory: Path, shown: str) -> str:
    """Run the build; raise `InputError` with kustomize's own message on failure."""
    cmd = kustomize_command()
    if cmd is None:
        raise InputError(shown, "is a kustomization; install kustomize or kubectl to build it")
    try:
        proc = subprocess.run(
            isolated([*cmd, str(directory), *LOAD_RESTRICTOR]),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
            env=isolated_env(),
        )
    except subprocess.TimeoutExpired:
        raise InputError(shown, f"kustomize build did not finish in {BUILD_TIMEOUT_S}s") from None
    except OSError as exc:
        raise InputError(shown, f"cannot run {cmd[0]}: {exc}") from None
    if proc.returncode != 0:
        raise InputError(shown, f"kustomize build failed: {_error_line(proc.stderr)}")
    return proc.stdout


def _build_with_origins(directory: Path) -> tuple[str, Path] | None:
    """Build through a wrapper that adds origin annotations; None when the wrapper fails.

    Returns the output and the wrapper's directory, which origin paths are relative to (the
    directory is gone by then; only its name is needed to resolve them).
    """
    cmd = kustomize_command()
    if cmd is None:
        return None
    with tempfile.TemporaryDirectory(prefix="draguard-kustomize-") as tmp:
        base = Path(tmp).resolve()
        rel = os.path.relpath(directory.resolve(), base)
        (base / "kustomization.yaml").write_text(
            yaml.safe_dump({"resources": [rel], "buildMetadata": ["originAnnotations"]})
        )
        try:
            proc = subprocess.run(
                isolated([*cmd, str(base), *LOAD_RESTRICTOR]), capture_output=True, text=True,
                timeout=BUILD_TIMEOUT_S, check=False, env=isolated_env(),
            )  # fmt: skip
        except (subprocess.TimeoutExpired, OSError):
            return None
        if proc.returncode != 0:
            return None
        return proc.stdout, base


def _strip_origin(obj: Mapping[str, Any], base: Path) -> tuple[dict[str, Any], str | None]:
    """The object without the origin annotation we added, and the origin file path."""
    data = dict(obj)
    meta = dict(data.get("metadata") or {})
    annotations = dict(meta.get("annotations") or {})
    origin_text = annotations.pop(ORIGIN_ANNOTATION, None)
    path: str | None = None
    if isinstance(origin_text, str):
        try:
            origin = yamlload.load(origin_text)
        except yaml.YAMLError:
            origin = None
        # Remote resources carry `repo`; their paths are not files here.
        if isinstance(origin, Mapping) and isinstance(origin.get("path"), str) and not origin.get("repo"):
            path = os.path.normpath(base / origin["path"])
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    data["metadata"] = meta
    return data, path


class _SourceIndex:
    """Parsed origin files, cached, to find the document an object was built from."""

    def __init__(self) -> None:
        self._docs: dict[str, list[Document]] = {}

    def docs(self, path: str) -> list[Document]:
        if path not in self._docs:
            try:
                self._docs[path] = parse_text(read_text(Path(path), path), path)
            except InputError:
                self._docs[path] = []
        return self._docs[path]

    def find(self, path: str, obj: Mapping[str, Any]) -> Document | None:
        kind = obj.get("kind")
        name = str((obj.get("metadata") or {}).get("name", ""))
        candidates = [
            d for d in self.docs(path) if isinstance(d.data, Mapping) and d.data.get("kind") == kind
        ]
        if not candidates:
            return None
        best: Document | None = None
        best_len = -1
        for d in candidates:
            src_name = str((d.data.get("metadata") or {}).get("name", ""))
            if src_name == name:
                return d
            # namePrefix / nameSuffix keep the original name inside the built one.
            if src_name and src_name in name and len(src_name) > best_len:
                best, best_len = d, len(src_name)
        if best is None and len(candidates) == 1:
            return candidates[0]
        return best


def _kustomization_file(directory: Path) -> Path:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    return directory


def build(directory: Path, *, tree: Tree | None = None) -> Inputs:
    """Build one kustomization directory into review inputs; nothing outside `tree` (default: the
    working directory) is read, nothing on the network fetched."""
    tree = tree or Tree.of(Path.cwd())
    check_kustomization(directory, tree)
    shown_dir = display_path(directory)
    kfile = display_path(_kustomization_file(directory))
    built = _build_with_origins(directory)
    if built is None:
        # Either the wrapper is unsupported or the kustomization itself is broken: the plain
        # build gives the user kustomize's own error message about their own files.
        plain = run_build(directory, shown_dir)
        objs, skipped = objects_of(parse_text(plain, kfile), kfile)
        return Inputs(
            [SourceObject(obj=o.obj, file=kfile, line=1, doc_index=o.doc_index) for o in objs],
            skipped,
            [kfile],
        )
    text, base = built
    built_docs = parse_text(text, kfile)
    index = _SourceIndex()
    objects: list[SourceObject] = []
    skipped_all = []
    files: list[str] = [kfile]
    for doc in built_docs:
        objs, skipped = objects_of([doc], kfile)
        skipped_all.extend(skipped)
        for o in objs:
            data, origin = _strip_origin(o.obj, base)
            if origin and not tree.holds(Path(origin).resolve()):
                # An origin annotation the object carried itself: never a reason to read a file
                # outside the tree.
                origin = None
            src = index.find(origin, data) if origin else None
            if origin and src is not None:
                shown = display_path(origin)
                if shown not in files:
                    files.append(shown)
                objects.append(
                    SourceObject(obj=data, file=shown, line=src.line, doc_index=src.index, lines=src.lines)
                )
            else:
                # Generated objects (configMapGenerator, ...) have no file of their own.
                objects.append(SourceObject(obj=data, file=kfile, line=1, doc_index=o.doc_index))
    return Inputs(objects, skipped_all, files)
