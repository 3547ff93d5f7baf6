"""Read review inputs: files, directories, stdin and kustomizations, keeping the line of every field.

Every object becomes a `SourceObject` whose `lines` maps JSON pointers to 1-based lines, so a
finding on `/spec/devices/requests/0` points at that line of the file the user wrote.
"""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..core.source import SourceObject
from ..dra.yamlload import AliasExpansionError, IntegerTooLargeError, SafeLoader, check_aliases

# libyaml's safe loader (pure Python as the fallback), refusing alias bombs and oversized integers.
_Loader = SafeLoader

YAML_SUFFIXES = (".yaml", ".yml", ".json")
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
STDIN = "-"
STDIN_NAME = "<stdin>"
# A manifest larger than this is refused before it is read: the reviewed tree may come from an
# untrusted branch, and the whole file is held in memory while parsed.
MAX_FILE_BYTES = 128 * 1024 * 1024


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


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping names the same key twice: kubectl and the API server refuse it, and the YAML spec
    forbids it; PyYAML would silently keep the last value."""


def _duplicate(first: yaml.Node, again: yaml.Node) -> DuplicateKeyError:
    return DuplicateKeyError(
        problem=f"duplicate key {again.value!r} (first on line {first.start_mark.line + 1}, again on line "
        f"{again.start_mark.line + 1}); kubectl refuses it: keep one",
        problem_mark=again.start_mark,
    )


def _check_duplicates(root: yaml.Node) -> None:
    """Raise `DuplicateKeyError` for a key repeated in one mapping (merge keys `<<` excepted: they
    are how YAML shares values, and an explicit key overriding a merged one is allowed)."""
    seen_nodes: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: dict[tuple[str, str], yaml.Node] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag not in _SPECIAL_KEYS:
                    ident = (key_node.tag, key_node.value)
                    if ident in keys:
                        raise _duplicate(keys[ident], key_node)
                    keys[ident] = key_node
                stack.append(key_node)
                stack.append(value_node)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


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
                key_nodes: dict[Any, yaml.Node] = {}
                for key_node, value_node in node.value:
                    if not isinstance(key_node, yaml.ScalarNode) or key_node.tag in _SPECIAL_KEYS:
                        raise _Unusual
                    key = key_node.value if key_node.tag == _STR else loader.construct_object(key_node)
                    if key in value:
                        raise _duplicate(key_nodes.get(key, key_node), key_node)
                    key_nodes[key] = key_node
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
    if not isinstance(exc, AliasExpansionError | IntegerTooLargeError | DuplicateKeyError):
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


def iter_yaml_documents(stream: Any, file: str) -> Iterator[Document]:
    """Parse a (multi-document) YAML or JSON stream one document at a time, keeping lines; raise
    `InputError` with line:column. `stream` is text or a text stream (read in chunks: only the
    document being built is held)."""
    loader = _Loader(stream)
    try:
        index = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:  # pragma: no cover - check_node said there is one
                break
            built = _build(loader, node)
            if built is None:  # merge keys, complex keys, tagged collections: PyYAML's way
                _check_duplicates(node)
                data = loader.construct_document(node)
                lines: dict[str, int] = {}
                _walk_lines(node, "", lines)
            else:
                data, lines = built
            line = _first_line(node)
            del node, built  # the node graph is several times the data's size: drop it first
            yield Document(data, line, lines, index)
            index += 1
    except yaml.MarkedYAMLError as exc:
        raise _marked_error(exc, file) from None
    except yaml.YAMLError as exc:
        # Reader errors (e.g. control characters) span lines; the first one says what is wrong.
        first = (str(exc).splitlines() or ["invalid YAML"])[0]
        raise InputError(file, f"invalid YAML: {first}") from None
    finally:
        loader.dispose()


def parse_yaml_documents(text: str, file: str) -> list[Document]:
    """Every document of `text` (see `iter_yaml_documents`)."""
    return list(iter_yaml_documents(text, file))


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


def _kind_of(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def _too_large(shown: str, size: int) -> InputError:
    return InputError(
        shown,
        f"is larger than {_size(MAX_FILE_BYTES)} ({size} bytes or more); review reads "
        "manifests of at most that size: split it into smaller files",
    )


def _open_regular(path: Path, shown: str) -> Any:
    """Open one regular file for reading (binary), refusing devices, FIFOs, sockets and files over
    `MAX_FILE_BYTES` before reading a byte (a link to /dev/zero would never end, a FIFO would
    block). OSErrors are the caller's to word."""
    before = os.stat(path)
    if stat.S_ISDIR(before.st_mode):
        raise IsADirectoryError
    if not stat.S_ISREG(before.st_mode):
        kind = _kind_of(before.st_mode)
        raise InputError(shown, f"is {kind}; review reads only regular files: remove it")
    if before.st_size > MAX_FILE_BYTES:
        raise _too_large(shown, before.st_size)
    # O_NONBLOCK: should the path have become a FIFO since the stat, opening it cannot hang;
    # the fstat below then refuses it.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
        fh.close()
        raise InputError(shown, "is not a regular file; review reads only regular files: remove it")
    return fh


def _os_error(shown: str, exc: OSError) -> InputError:
    if isinstance(exc, FileNotFoundError):
        return InputError(shown, "no such file or directory")
    if isinstance(exc, IsADirectoryError):
        return InputError(shown, "is a directory")
    if isinstance(exc, PermissionError):
        return InputError(shown, "permission denied (cannot read the file)")
    return InputError(shown, f"cannot read: {exc.strerror or exc}")


def read_text(path: Path, shown: str) -> str:
    """Read one regular file as UTF-8 text, with a one-line error for every way that can fail.

    Devices, FIFOs and sockets are refused before they are opened for reading, and no more than
    `MAX_FILE_BYTES` is read.
    """
    try:
        with _open_regular(path, shown) as fh:
            # Sized by the file, not the limit: `read(n)` sets aside n bytes before it reads.
            size = os.fstat(fh.fileno()).st_size
            data = fh.read(min(size, MAX_FILE_BYTES) + 1)
            if len(data) > size:  # it grew since: read on, still no further than the limit
                data += fh.read(MAX_FILE_BYTES + 1 - len(data))
    except OSError as exc:
        raise _os_error(shown, exc) from None
    if len(data) > MAX_FILE_BYTES:
        raise _too_large(shown, len(data))
    try:
        return str(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise InputError(shown, f"not UTF-8 text (byte {exc.start}); review reads YAML or JSON") from None


class _Limited:
    """A text stream that refuses to give more than `MAX_FILE_BYTES` characters (a file that grows
    while it is read)."""

    __slots__ = ("_left", "_shown", "_stream")

    def __init__(self, stream: Any, shown: str) -> None:
        self._stream = stream
        self._shown = shown
        self._left = MAX_FILE_BYTES

    def read(self, size: int = -1) -> str:
        chunk: str = self._stream.read(size if size >= 0 else self._left + 1)
        self._left -= len(chunk)
        if self._left < 0:
            raise _too_large(self._shown, MAX_FILE_BYTES + 1)
        return chunk


def iter_file(path: Path, shown: str | None = None) -> Iterator[tuple[list[SourceObject], list[Skipped]]]:
    """The objects of one file, one document at a time: memory holds the document being read, not
    the file. JSON (one document, often a `kubectl get -o json` List) is read whole, as before.
    Errors are the same one-line `InputError`s `read_file` raises."""
    shown = shown or display_path(path)
    if path.name.endswith(".json"):
        yield from _whole_file(path, shown)
        return
    try:
        fh = _open_regular(path, shown)
    except OSError as exc:
        raise _os_error(shown, exc) from None
    with fh:
        try:
            head = fh.peek(256)[:256].lstrip(b"\xef\xbb\xbf \t\r\n")
        except OSError as exc:
            raise _os_error(shown, exc) from None
        if head.startswith((b"{", b"[")):
            yield from _whole_file(path, shown)
            return
        text = io.TextIOWrapper(fh, encoding="utf-8-sig", newline="")
        try:
            for doc in iter_yaml_documents(_Limited(text, shown), shown):
                yield objects_of([doc], shown)
        except UnicodeDecodeError:
            read_text(path, shown)  # raises the error naming the byte
            raise InputError(shown, "not UTF-8 text; review reads YAML or JSON") from None
        except OSError as exc:
            raise _os_error(shown, exc) from None


def _whole_file(path: Path, shown: str) -> Iterator[tuple[list[SourceObject], list[Skipped]]]:
    yield objects_of(parse_text(read_text(path, shown), shown), shown)


def read_file(path: Path, shown: str | None = None) -> Inputs:
    shown = shown or display_path(path)
    docs = parse_text(read_text(path, shown), shown)
    objs, skipped = objects_of(docs, shown)
    return Inputs(objs, skipped, [shown])


def read_stdin(stream: Any = None) -> Inputs:
    stream = stream if stream is not None else sys.stdin
    try:
        text = stream.read(MAX_FILE_BYTES + 1)
        if len(text) > MAX_FILE_BYTES:
            raise _too_large("<stdin>", len(text))
    except UnicodeDecodeError:
        raise InputError("<stdin>", "not UTF-8 text; review reads YAML or JSON") from None
    except OSError as exc:
        raise InputError("<stdin>", f"cannot read: {exc}") from None
    objs, skipped = objects_of(parse_text(text, "<stdin>"), "<stdin>")
    return Inputs(objs, skipped, ["<stdin>"])


def spool_stdin(into: Any, stream: Any = None) -> None:
    """Copy stdin into `into` (a binary file) a chunk at a time, so it can be read one document at
    a time like a file, and read again; the bounds and errors of `read_stdin`."""
    stream = stream if stream is not None else sys.stdin
    total = 0
    try:
        while True:
            chunk = stream.read(1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_FILE_BYTES:
                raise _too_large("<stdin>", total)
            # surrogateescape: bytes a lenient stdin could not decode come back as they were, and
            # the reader names the first one.
            into.write(chunk if isinstance(chunk, bytes) else chunk.encode("utf-8", "surrogateescape"))
    except UnicodeDecodeError:
        raise InputError("<stdin>", "not UTF-8 text; review reads YAML or JSON") from None
    except OSError as exc:
        raise InputError("<stdin>", f"cannot read: {exc}") from None
    into.flush()


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


@dataclass(frozen=True, slots=True)
class Tree:
    """The directories review may read below (resolved): the repository root, and a path named on
    the command line that lies outside it."""

    roots: tuple[Path, ...]

    @classmethod
    def of(cls, *roots: Path) -> Tree:
        return cls(tuple(dict.fromkeys(r.resolve() for r in roots)))

    def holds(self, path: Path) -> bool:
        return any(_inside(path, root) for root in self.roots)

    def __str__(self) -> str:
        return " or ".join(str(r) for r in self.roots)


def resolve_in_tree(path: Path, tree: Tree, shown: str | None = None) -> Path:
    """`path` with every symbolic link resolved; `InputError` when that leaves `tree`.

    The reviewed tree may come from an untrusted branch: a link to /dev/zero, a secret on the
    runner or another checkout must never be read or written through.
    """
    shown = shown or display_path(path)
    try:
        real = path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a link loop, before Python 3.13
        raise InputError(shown, "is a symbolic link loop: remove the link") from None
    if not tree.holds(real):
        raise InputError(
            shown,
            f"is a symbolic link to {real}, outside the reviewed tree ({tree}); review never follows "
            f"links out of the tree: replace the link with a copy, or review {real} itself",
        )
    return real


def tree_for(path: Path, root: Path | str | None = None) -> Tree:
    """The tree a path named on the command line may reach: the repository root (`root`, default
    the working directory), plus the path itself (its directory for a file) when it lies outside
    the root. Only the last component is left unresolved, so a link named on the command line that
    points out of the tree is still caught."""
    top = Path(root or Path.cwd()).resolve()
    absolute = Path(os.path.abspath(path))
    lexical = absolute.parent.resolve() / absolute.name if absolute.name else absolute.resolve()
    if _inside(lexical, top):
        return Tree.of(top)
    return Tree.of(top, lexical if lexical.is_dir() else lexical.parent)


def check_tree(directory: Path, tree: Tree) -> None:
    """Refuse a directory handed to an external tool (kustomize, helm) that holds a link out of
    `tree` or a special file: those tools would follow or read them."""
    for base, dirs, files in os.walk(directory, followlinks=False):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in [*dirs, *files]:
            entry = Path(base) / name
            try:
                mode = entry.lstat().st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                resolve_in_tree(entry, tree)
                try:
                    mode = entry.stat().st_mode
                except OSError:
                    continue  # a dangling link: the tool reports it if it needs the file
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise InputError(
                    display_path(entry), f"is {_kind_of(mode)}; review reads only regular files: remove it"
                )


def is_kustomization_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in KUSTOMIZATION_FILES)


def walk(root: Path, exclude: Sequence[Path] = (), tree: Tree | None = None) -> Iterator[Path]:
    """Files and kustomization directories under `root`, sorted, skipping hidden entries.

    A directory holding a kustomization is yielded itself and not descended into: its files are
    the kustomization's resources and patches, which only make sense once built. Links are
    followed only within `tree` (default: `root`), and each directory is walked once, so a link to
    an ancestor cannot loop.
    """
    tree = tree or Tree.of(root)
    excluded = {p.resolve() for p in exclude}
    seen: set[Path] = set()

    def visit(directory: Path) -> Iterator[Path]:
        real_dir = resolve_in_tree(directory, tree)
        if real_dir in seen:
            return
        seen.add(real_dir)
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except PermissionError:
            raise InputError(display_path(directory), "permission denied (cannot list it)") from None
        except OSError as exc:
            raise InputError(display_path(directory), f"cannot list: {exc.strerror or exc}") from None
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            if not entry.is_dir() and not entry.name.endswith(YAML_SUFFIXES):
                continue
            real = resolve_in_tree(path, tree) if entry.is_symlink() else path.resolve()
            if real in excluded:
                continue
            if entry.is_dir():
                if is_kustomization_dir(path) or (path / "Chart.yaml").is_file():
                    yield path  # built (kustomize) or rendered (helm) as a whole
                else:
                    yield from visit(path)
            else:
                yield path

    yield from visit(root)


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


@dataclass(frozen=True, slots=True)
class FileSource:
    """A manifest file to read (lazily: `iter_file` streams it)."""

    path: Path
    shown: str


def sources(
    paths: Sequence[str],
    *,
    exclude: Sequence[Path] = (),
    stdin: Any = None,
    root: Path | str | None = None,
    stdin_file: Path | None = None,
) -> Iterator[FileSource | Inputs]:
    """What the paths the user named hold, in order: files still to read, and inputs read already
    (stdin, kustomize builds, helm renders). Directories are walked, `-` is stdin.

    `exclude` lists paths skipped while walking directories (the policy directory and the
    inventory file), never when named explicitly. `root` is the reviewed tree (default: the
    working directory): no symbolic link is followed out of it (see `tree_for`). `stdin_file`:
    where stdin was copied (`spool_stdin`), to be streamed like a file.
    """
    from . import helm, kustomize  # local: both import this module

    stdin_read = False
    for raw in paths:
        if raw == STDIN:
            if stdin_file is not None:
                # Named twice, stdin is read once, as a stream is: the second time it is empty.
                yield Inputs(files=[STDIN_NAME]) if stdin_read else FileSource(stdin_file, STDIN_NAME)
                stdin_read = True
            else:
                yield read_stdin(stdin)
            continue
        path = Path(raw)
        if not path.exists() and not path.is_symlink():
            raise InputError(raw, "no such file or directory")
        tree = tree_for(path, root)
        resolve_in_tree(path, tree, raw)
        if path.is_dir():
            if is_kustomization_dir(path):
                yield kustomize.build(path, tree=tree)
                continue
            if helm.is_chart_dir(path):
                yield helm.render(path, tree=tree)
                continue
            items = list(walk(path, exclude, tree))
            referenced = _referenced_kustomizations([i for i in items if i.is_dir()])
            for item in items:
                if item.is_dir() and item.resolve() in referenced:
                    continue  # built as part of the overlay that uses it
                if item.is_dir() and helm.is_chart_dir(item) and not is_kustomization_dir(item):
                    yield helm.render(item, tree=tree)
                elif item.is_dir():
                    yield kustomize.build(item, tree=tree)
                else:
                    yield FileSource(item, display_path(item))
        else:
            yield FileSource(path, display_path(path))


def read_paths(
    paths: Sequence[str],
    *,
    exclude: Sequence[Path] = (),
    stdin: Any = None,
    root: Path | str | None = None,
) -> Inputs:
    """Read every path the user named, all at once (see `sources`)."""
    result = Inputs()
    for src in sources(paths, exclude=exclude, stdin=stdin, root=root):
        result.extend(src if isinstance(src, Inputs) else read_file(src.path, src.shown))
    return result
