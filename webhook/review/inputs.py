"""Read review inputs: files, directories, stdin and kustomizations, keeping the line of every field.

Every object becomes a `SourceObject` whose `lines` maps JSON pointers to 1-based lines, so a
finding on `/spec/devices/requests/0` points at that line of the file the user wrote.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from webhook.core.source import SourceObject
from webhook.dra.yamlload import AliasExpansionError, IntegerTooLargeError, SafeLoader, check_aliases

# libyaml's safe loader (pure Python as the fallback), refusing alias bombs and oversized integers.
_Loader = SafeLoader

YAML_SUFFIXES = (".yaml", ".yml", ".json")
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
STDIN = "-"


class InputError(Exception):
    """An input that cannot be read; `str()` is one line naming the file and the reason."""

    def __init__(self, file: str, reason: str, line: int | None = None, column: int | None = None) -> None:
        self.file = file
        self.reason = reason
        self.line = line
        self.column = column
        where = file
        if line is not None:
            where += f":{line}"
            if column is not None:
                where += f":{column}"
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True, slots=True)
class Skipped:
    """A document that is not a Kubernetes object (no kind), counted but never reviewed."""

    file: str
    line: int | None
    reason: str


@dataclass(slots=True)
class Inputs:
    """Everything read from the paths given on the command line."""

    objects: list[SourceObject] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def extend(self, other: Inputs) -> None:
        self.objects.extend(other.objects)
        self.skipped.extend(other.skipped)
        self.files.extend(other.files)


def display_path(path: Path | str) -> str:
    """A path as the user should see it: relative to the working directory when below it."""
    p = Path(path)
    try:
        rel = p.resolve().relative_to(Path.cwd().resolve())
    except (ValueError, OSError):
        return str(path)
    return rel.as_posix() if str(rel) != "." else "."


# --------------------------------------------------------------------------- YAML with lines


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _walk_lines(node: yaml.Node, pointer: str, out: dict[str, int]) -> None:
    """Record the line of every value below `node` (a key's line for mapping values).

    An aliased node is walked once: its text sits at the anchor, and walking every alias would
    make a "billion laughs" document exponential. Iterative: libyaml accepts 1,000 levels of
    nesting, which a recursive walk would not survive below a deep call stack.
    """
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(node, pointer)]
    while stack:
        current, here = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        children: list[tuple[yaml.Node, str]] = []
        if isinstance(current, yaml.MappingNode):
            for key_node, value_node in current.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                child = f"{here}/{_escape(str(key_node.value))}"
                out[child] = key_node.start_mark.line + 1
                children.append((value_node, child))
        elif isinstance(current, yaml.SequenceNode):
            for i, item in enumerate(current.value):
                child = f"{here}/{i}"
                out[child] = item.start_mark.line + 1
                children.append((item, child))
        # Reversed: the first child's subtree is walked first, as a recursive walk would (a later
        # duplicate key's lines win, as its value does).
        stack.extend(reversed(children))


_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_SPECIAL_KEYS = frozenset({"tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"})


class _Unusual(Exception):
    """A document shape only PyYAML's own constructor handles."""


def _build(loader: SafeLoader, root: yaml.Node) -> tuple[Any, dict[str, int]] | None:
    """The document's data and its pointer -> line map in one iterative pass, or None.

    Same result as `construct_document` plus `_walk_lines` (shared nodes stay shared, lines come
    from the first path a depth-first walk reaches), at about half the cost: plain strings,
    mappings and sequences are built here, other scalars by the loader's constructor (so its
    guards apply). None for merge keys, non-scalar keys and tagged collections.
    """
    if loader.may_alias:
        check_aliases(root)
    made: dict[int, Any] = {}
    filled: set[int] = set()
    lines: dict[str, int] = {}

    def make(node: yaml.Node) -> Any:
        key = id(node)
        if key in made:
            return made[key]
        value: Any
        if isinstance(node, yaml.ScalarNode):
            value = node.value if node.tag == _STR else loader.construct_object(node)
        elif isinstance(node, yaml.MappingNode) and node.tag == _MAP:
            value = {}
        elif isinstance(node, yaml.SequenceNode) and node.tag == _SEQ:
            value = []
        else:
            raise _Unusual
        made[key] = value
        return value

    try:
        data = make(root)
        stack: list[tuple[yaml.Node, str]] = [(root, "")]
        while stack:
            node, here = stack.pop()
            if isinstance(node, yaml.ScalarNode) or id(node) in filled:
                continue
            filled.add(id(node))
            value = made[id(node)]
            children: list[tuple[yaml.Node, str]] = []
            if isinstance(node, yaml.MappingNode):
                for key_node, value_node in node.value:
                    if not isinstance(key_node, yaml.ScalarNode) or key_node.tag in _SPECIAL_KEYS:
                        raise _Unusual
                    key = key_node.value if key_node.tag == _STR else loader.construct_object(key_node)
                    value[key] = make(value_node)
                    child = f"{here}/{_escape(str(key_node.value))}"
                    lines[child] = key_node.start_mark.line + 1
                    children.append((value_node, child))
            else:
                for i, item in enumerate(node.value):
                    value.append(make(item))
                    child = f"{here}/{i}"
                    lines[child] = item.start_mark.line + 1
                    children.append((item, child))
            stack.extend(reversed(children))
    except _Unusual:
        return None
    finally:
        loader.constructed_objects = {}
    return data, lines


def _first_line(node: yaml.Node) -> int:
    """Line of the document's first key (what `SourceObject.line` promises)."""
    if isinstance(node, yaml.MappingNode) and node.value:
        return int(node.value[0][0].start_mark.line) + 1
    return int(node.start_mark.line) + 1


def _marked_error(exc: yaml.MarkedYAMLError, file: str) -> InputError:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or exc.context or "invalid YAML"
    if not isinstance(exc, AliasExpansionError | IntegerTooLargeError):
        problem = f"invalid YAML: {problem}"  # the guards' own messages say what is wrong
    if mark is not None:
        return InputError(file, problem, mark.line + 1, mark.column + 1)
    return InputError(file, problem)


@dataclass(frozen=True, slots=True)
class Document:
    """One parsed document: its data, first line and pointer -> line map."""

    data: Any
    line: int
    lines: dict[str, int]
    index: int


def parse_yaml_documents(text: str, file: str) -> list[Document]:
    """Parse a (multi-document) YAML or JSON stream, keeping lines; raise `InputError` with line:column."""
    loader = _Loader(text)
    docs: list[Document] = []
    try:
        index = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:  # pragma: no cover - check_node said there is one
                break
            built = _build(loader, node)
            if built is None:  # merge keys, complex keys, tagged collections: PyYAML's way
                data = loader.construct_document(node)
                lines: dict[str, int] = {}
                _walk_lines(node, "", lines)
            else:
                data, lines = built
            docs.append(Document(data, _first_line(node), lines, index))
            index += 1
    except yaml.MarkedYAMLError as exc:
        raise _marked_error(exc, file) from None
    except yaml.YAMLError as exc:
        # Reader errors (e.g. control characters) span lines; the first one says what is wrong.
        first = (str(exc).splitlines() or ["invalid YAML"])[0]
        raise InputError(file, f"invalid YAML: {first}") from None
    finally:
        loader.dispose()
    return docs


def load_data(text: str, file: str) -> list[Any]:
    """The documents' data only (no line maps): for large inputs such as inventories.

    JSON (`kubectl get -o json`) goes through the json module, many times faster than YAML.
    """
    if text.lstrip().startswith(("{", "[")):
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, ValueError, RecursionError):
            # e.g. a YAML flow mapping, or an integer too long to convert: the YAML parser below
            # reports real errors with their line.
            pass
        else:
            return data if isinstance(data, list) else [data]
    try:
        return [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.MarkedYAMLError as exc:
        raise _marked_error(exc, file) from None
    except yaml.YAMLError as exc:
        raise InputError(file, f"invalid YAML: {exc}") from None


def parse_text(text: str, file: str) -> list[Document]:
    """YAML first (it keeps lines, and JSON is YAML); JSON files YAML rejects fall back to `json`."""
    try:
        return parse_yaml_documents(text, file)
    except InputError as yaml_error:
        if not file.endswith(".json") and not text.lstrip().startswith(("{", "[")):
            raise
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(file, f"invalid JSON: {exc.msg}", exc.lineno, exc.colno) from None
        except (RecursionError, ValueError):  # too deep, or an integer too long: YAML said where
            raise yaml_error from None
        return [Document(data, 1, {}, 0)]


# --------------------------------------------------------------------------- documents -> objects


def _item_lines(lines: Mapping[str, int]) -> dict[int, dict[str, int]]:
    """The line maps of every `List` item, re-rooted so their pointers start at the item.

    One pass over the document's map: re-scanning it once per item made a 4,000-item List take
    half a minute.
    """
    out: dict[int, dict[str, int]] = {}
    for pointer, line in lines.items():
        if not pointer.startswith("/items/"):
            continue
        index, sep, rest = pointer[len("/items/"):].partition("/")
        if not sep or not index.isdigit():
            continue
        out.setdefault(int(index), {})["/" + rest] = line
    return out


def objects_of(
    docs: Iterable[Document], file: str, *, origin: str | None = None
) -> tuple[list[SourceObject], list[Skipped]]:
    """Turn parsed documents into objects, expanding `List` kinds; non-objects are skipped."""
    objects: list[SourceObject] = []
    skipped: list[Skipped] = []
    for doc in docs:
        data = doc.data
        if data is None:
            continue  # an empty document (e.g. a trailing `---`)
        if not isinstance(data, Mapping) or not isinstance(data.get("kind"), str):
            skipped.append(Skipped(file, doc.line, "not a Kubernetes object (no kind)"))
            continue
        kind = data["kind"]
        if kind.endswith("List") and isinstance(data.get("items"), list):
            item_lines = _item_lines(doc.lines)
            for i, item in enumerate(data["items"]):
                prefix = f"/items/{i}"
                if not isinstance(item, Mapping) or not isinstance(item.get("kind"), str):
                    skipped.append(Skipped(file, doc.lines.get(prefix, doc.line), "List item without kind"))
                    continue
                objects.append(
                    SourceObject(
                        obj=item,
                        file=file,
                        line=doc.lines.get(prefix + "/apiVersion", doc.lines.get(prefix, doc.line)),
                        doc_index=doc.index,
                        lines=item_lines.get(i, {}),
                    )
                )
            continue
        objects.append(SourceObject(obj=data, file=file, line=doc.line, doc_index=doc.index, lines=doc.lines))
    return objects, skipped


# --------------------------------------------------------------------------- files and directories


def read_text(path: Path, shown: str) -> str:
    """Read one file as UTF-8 text, with a one-line error for every way that can fail."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(shown, "no such file or directory") from None
    except IsADirectoryError:
        raise InputError(shown, "is a directory") from None
    except PermissionError:
        raise InputError(shown, "permission denied (cannot read the file)") from None
    except OSError as exc:
        raise InputError(shown, f"cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(shown, f"not UTF-8 text (byte {exc.start}); review reads YAML or JSON") from None


def read_file(path: Path, shown: str | None = None) -> Inputs:
    shown = shown or display_path(path)
    docs = parse_text(read_text(path, shown), shown)
    objs, skipped = objects_of(docs, shown)
    return Inputs(objs, skipped, [shown])


def read_stdin(stream: Any = None) -> Inputs:
    stream = stream if stream is not None else sys.stdin
    try:
        text = stream.read()
    except UnicodeDecodeError:
        raise InputError("<stdin>", "not UTF-8 text; review reads YAML or JSON") from None
    except OSError as exc:
        raise InputError("<stdin>", f"cannot read: {exc}") from None
    objs, skipped = objects_of(parse_text(text, "<stdin>"), "<stdin>")
    return Inputs(objs, skipped, ["<stdin>"])


def is_kustomization_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in KUSTOMIZATION_FILES)


def walk(root: Path, exclude: Sequence[Path] = ()) -> Iterator[Path]:
    """Files and kustomization directories under `root`, sorted, skipping hidden entries.

    A directory holding a kustomization is yielded itself and not descended into: its files are
    the kustomization's resources and patches, which only make sense once built.
    """
    excluded = {p.resolve() for p in exclude}
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except PermissionError:
        raise InputError(display_path(root), "permission denied (cannot list the directory)") from None
    except OSError as exc:
        raise InputError(display_path(root), f"cannot list: {exc.strerror or exc}") from None
    for entry in entries:
        if entry.name.startswith("."):
            continue
        path = Path(entry.path)
        if path.resolve() in excluded:
            continue
        if entry.is_dir():
            if is_kustomization_dir(path) or (path / "Chart.yaml").is_file():
                yield path  # built (kustomize) or rendered (helm) as a whole
            else:
                yield from walk(path, exclude)
        elif entry.name.endswith(YAML_SUFFIXES):
            yield path


def _referenced_kustomizations(dirs: Sequence[Path]) -> set[Path]:
    """Kustomization directories that another one in `dirs` lists as a resource or component."""
    found = {d.resolve() for d in dirs}
    referenced: set[Path] = set()
    for d in dirs:
        for name in KUSTOMIZATION_FILES:
            kfile = d / name
            if not kfile.is_file():
                continue
            try:
                data = yaml.load(kfile.read_text(encoding="utf-8"), Loader=_Loader)
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                break  # the build reports it properly
            if not isinstance(data, Mapping):
                break
            for key in ("resources", "bases", "components"):
                entries = data.get(key)
                if not isinstance(entries, list):
                    continue
                for entry in entries:
                    if isinstance(entry, str) and "://" not in entry:
                        target = (d / entry).resolve()
                        if target in found and target != d.resolve():
                            referenced.add(target)
            break
    return referenced


def read_paths(
    paths: Sequence[str],
    *,
    exclude: Sequence[Path] = (),
    stdin: Any = None,
) -> Inputs:
    """Read every path the user named; directories are walked, `-` is stdin.

    `exclude` lists paths skipped while walking directories (the policy directory and the
    inventory file), never when named explicitly.
    """
    from webhook.review import helm, kustomize  # local: both import this module

    result = Inputs()
    for raw in paths:
        if raw == STDIN:
            result.extend(read_stdin(stdin))
            continue
        path = Path(raw)
        if not path.exists():
            raise InputError(raw, "no such file or directory")
        if path.is_dir():
            if is_kustomization_dir(path):
                result.extend(kustomize.build(path))
                continue
            if helm.is_chart_dir(path):
                result.extend(helm.render(path))
                continue
            items = list(walk(path, exclude))
            referenced = _referenced_kustomizations([i for i in items if i.is_dir()])
            for item in items:
                if item.is_dir() and item.resolve() in referenced:
                    continue  # built as part of the overlay that uses it
                if item.is_dir() and helm.is_chart_dir(item) and not is_kustomization_dir(item):
                    result.extend(helm.render(item))
                elif item.is_dir():
                    result.extend(kustomize.build(item))
                else:
                    result.extend(read_file(item))
        else:
            result.extend(read_file(path, display_path(path)))
    return result
