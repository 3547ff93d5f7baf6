"""A small reader for the checked CEL AST (`cel.expr.CheckedExpr`) that the native runtime serialises.

The runtime does not expose its AST to Python, but `Expression.serialize()` returns the checked
expression as protobuf bytes. Decoding the handful of messages we need straight from the wire format
keeps us free of generated code, and gives the linter and the matcher real syntax trees with source
positions instead of guesses from the text.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field as _field

# Expression kinds (the oneof of cel.expr.Expr).
CONST = "const"
IDENT = "ident"
SELECT = "select"
CALL = "call"
LIST = "list"
STRUCT = "struct"
COMPREHENSION = "comprehension"

ConstValue = None | bool | int | float | str | bytes


@dataclass(slots=True)
class Entry:
    """One entry of a map or message literal."""

    key: Expr | None
    field_key: str
    value: Expr | None


@dataclass(slots=True)
class Expr:
    """One node of the expression tree (a flattened view of cel.expr.Expr)."""

    id: int = 0
    kind: str = ""
    # const
    value: ConstValue = None
    has_value: bool = False
    # ident
    name: str = ""
    # select (operand, field, test_only) / call (target, function, args)
    operand: Expr | None = None
    field: str = ""
    test_only: bool = False
    target: Expr | None = None
    function: str = ""
    args: list[Expr] = _field(default_factory=list)
    # list
    elements: list[Expr] = _field(default_factory=list)
    # struct / map literal
    entries: list[Entry] = _field(default_factory=list)
    # comprehension
    iter_var: str = ""
    iter_var2: str = ""
    iter_range: Expr | None = None
    accu_var: str = ""
    accu_init: Expr | None = None
    loop_condition: Expr | None = None
    loop_step: Expr | None = None
    result: Expr | None = None

    def children(self) -> Iterator[Expr]:
        for child in (self.operand, self.target, self.iter_range, self.accu_init, self.loop_condition,
                      self.loop_step, self.result):
            if child is not None:
                yield child
        yield from self.args
        yield from self.elements
        for entry in self.entries:
            if entry.key is not None:
                yield entry.key
            if entry.value is not None:
                yield entry.value

    def walk(self) -> Iterator[Expr]:
        """All nodes, depth first, this one included."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children())


@dataclass(slots=True)
class CheckedAst:
    """The root expression, source positions and the checker's type for each node id."""

    expr: Expr
    positions: dict[int, int]
    line_offsets: list[int]
    # Primitive type names by node id where the checker knew them ("bool", "int", "string", "dyn", ...).
    types: dict[int, str]
    _nodes: list[Expr] | None = _field(default=None, repr=False, compare=False)

    def nodes(self) -> list[Expr]:
        """Every node, depth first (computed once: several checks walk the same tree)."""
        if self._nodes is None:
            self._nodes = list(self.expr.walk())
        return self._nodes

    def location(self, node_id: int) -> tuple[int | None, int | None]:
        """1-based (line, column) of a node, as cel-go prints them."""
        offset = self.positions.get(node_id)
        if offset is None:
            return None, None
        return offset_to_line_col(offset, self.line_offsets)


def offset_to_line_col(offset: int, line_offsets: list[int]) -> tuple[int, int]:
    """Map a code-point offset to a 1-based line and column.

    `line_offsets` holds the offset just past each newline, as cel.expr.SourceInfo does.
    """
    line = bisect.bisect_right(line_offsets, offset)
    start = line_offsets[line - 1] if line > 0 else 0
    return line + 1, offset - start + 1


class _Reader:
    __slots__ = ("data", "end", "pos")

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def varint(self) -> int:
        result = 0
        shift = 0
        while True:
            if self.pos >= self.end:
                raise ValueError("truncated varint in serialised CEL expression")
            byte = self.data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def fields(self) -> Iterator[tuple[int, int, int | _Reader]]:
        """(field number, wire type, varint value or sub-reader) for each field in this message."""
        while self.pos < self.end:
            key = self.varint()
            number, wire = key >> 3, key & 7
            if wire == 0:
                yield number, wire, self.varint()
            elif wire == 2:
                length = self.varint()
                sub = _Reader(self.data, self.pos, self.pos + length)
                self.pos += length
                yield number, wire, sub
            elif wire == 1:
                yield number, wire, int.from_bytes(self.data[self.pos:self.pos + 8], "little")
                self.pos += 8
            elif wire == 5:
                yield number, wire, int.from_bytes(self.data[self.pos:self.pos + 4], "little")
                self.pos += 4
            else:
                raise ValueError(f"unsupported wire type {wire} in serialised CEL expression")

    def bytes(self) -> bytes:
        return self.data[self.pos:self.end]

    def text(self) -> str:
        return self.bytes().decode("utf-8", errors="replace")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _sub(value: int | _Reader) -> _Reader:
    if not isinstance(value, _Reader):
        raise ValueError("expected a length-delimited field in serialised CEL expression")
    return value


def _num(value: int | _Reader) -> int:
    if isinstance(value, _Reader):
        raise ValueError("expected a numeric field in serialised CEL expression")
    return value


def _constant(reader: _Reader, node: Expr) -> None:
    import struct

    node.kind = CONST
    node.has_value = True
    for number, wire, value in reader.fields():
        if number == 1:
            node.value = None
        elif number == 2:
            node.value = bool(_num(value))
        elif number in (3, 4):
            node.value = _signed(_num(value)) if number == 3 else _num(value)
        elif number == 5 and wire == 1:
            node.value = struct.unpack("<d", _num(value).to_bytes(8, "little"))[0]
        elif number == 6:
            node.value = _sub(value).text()
        elif number == 7:
            node.value = _sub(value).bytes()


def _expr(reader: _Reader) -> Expr:
    node = Expr()
    for number, _wire, value in reader.fields():
        if number == 2:
            node.id = _num(value)
        elif number == 3:
            _constant(_sub(value), node)
        elif number == 4:
            node.kind = IDENT
            for n, _w, v in _sub(value).fields():
                if n == 1:
                    node.name = _sub(v).text()
        elif number == 5:
            node.kind = SELECT
            for n, _w, v in _sub(value).fields():
                if n == 1:
                    node.operand = _expr(_sub(v))
                elif n == 2:
                    node.field = _sub(v).text()
                elif n == 3:
                    node.test_only = bool(_num(v))
        elif number == 6:
            node.kind = CALL
            for n, _w, v in _sub(value).fields():
                if n == 1:
                    node.target = _expr(_sub(v))
                elif n == 2:
                    node.function = _sub(v).text()
                elif n == 3:
                    node.args.append(_expr(_sub(v)))
        elif number == 7:
            node.kind = LIST
            for n, _w, v in _sub(value).fields():
                if n == 1:
                    node.elements.append(_expr(_sub(v)))
        elif number == 8:
            node.kind = STRUCT
            for n, _w, v in _sub(value).fields():
                if n == 2:
                    node.entries.append(_entry(_sub(v)))
        elif number == 9:
            node.kind = COMPREHENSION
            _comprehension(_sub(value), node)
    return node


def _entry(reader: _Reader) -> Entry:
    entry = Entry(None, "", None)
    for number, _wire, value in reader.fields():
        if number == 2:
            entry.field_key = _sub(value).text()
        elif number == 3:
            entry.key = _expr(_sub(value))
        elif number == 4:
            entry.value = _expr(_sub(value))
    return entry


def _comprehension(reader: _Reader, node: Expr) -> None:
    for number, _wire, value in reader.fields():
        if number == 1:
            node.iter_var = _sub(value).text()
        elif number == 2:
            node.iter_range = _expr(_sub(value))
        elif number == 3:
            node.accu_var = _sub(value).text()
        elif number == 4:
            node.accu_init = _expr(_sub(value))
        elif number == 5:
            node.loop_condition = _expr(_sub(value))
        elif number == 6:
            node.loop_step = _expr(_sub(value))
        elif number == 7:
            node.result = _expr(_sub(value))
        elif number == 8:
            node.iter_var2 = _sub(value).text()


_PRIMITIVES = {1: "bool", 2: "int", 3: "uint", 4: "double", 5: "string", 6: "bytes"}


def _type_name(reader: _Reader) -> str:
    """A short name for a cel.expr.Type: primitives by name, everything else by its kind."""
    for number, _wire, value in reader.fields():
        if number == 1:
            return "dyn"
        if number == 2:
            return "null"
        if number == 3:
            return _PRIMITIVES.get(_num(value), "dyn")
        if number == 6:
            return "list"
        if number == 7:
            return "map"
        if number == 9:
            return "message"
        if number == 12:
            return "error"
    return "dyn"


def _source_info(reader: _Reader, positions: dict[int, int], line_offsets: list[int]) -> None:
    for number, wire, value in reader.fields():
        if number == 3:
            if wire == 2:  # packed
                sub = _sub(value)
                while sub.pos < sub.end:
                    line_offsets.append(sub.varint())
            else:
                line_offsets.append(_num(value))
        elif number == 4:
            key = offset = 0
            for n, _w, v in _sub(value).fields():
                if n == 1:
                    key = _num(v)
                elif n == 2:
                    offset = _num(v)
            positions[key] = offset


def decode_checked(serialized: bytes) -> CheckedAst:
    """Decode `Expression.serialize()` output (a google.protobuf.Any wrapping cel.expr.CheckedExpr)."""
    payload: _Reader | None = None
    for number, _wire, value in _Reader(serialized).fields():
        if number == 2:
            payload = _sub(value)
    if payload is None:
        raise ValueError("serialised CEL expression carries no CheckedExpr")
    expr: Expr | None = None
    positions: dict[int, int] = {}
    line_offsets: list[int] = []
    types: dict[int, str] = {}
    for number, _wire, value in payload.fields():
        if number == 4:
            expr = _expr(_sub(value))
        elif number == 5:
            _source_info(_sub(value), positions, line_offsets)
        elif number == 3:
            key = 0
            name = "dyn"
            for n, _w, v in _sub(value).fields():
                if n == 1:
                    key = _num(v)
                elif n == 2:
                    name = _type_name(_sub(v))
            types[key] = name
    if expr is None:
        raise ValueError("serialised CEL expression carries no expression tree")
    return CheckedAst(expr, positions, line_offsets, types)
