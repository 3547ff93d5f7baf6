"""Constant folding past the native runtime's fixed limits.

cel-expr-python stops at 32 levels of nesting and at an iteration budget of a few thousand
comprehension steps per evaluation; Kubernetes allows 249 levels and whatever its cost limit
admits. Both limits are hit in practice only by sub-expressions that read nothing from the device
(long `+` chains, nested literals, comprehensions over literal lists), and such a sub-expression
has the same value wherever it appears. This module finds those sub-expressions with a small
parser that records source spans, lets the runtime evaluate each on its own (in pieces small
enough for it: nested comprehensions are unrolled one level at a time), and splices the value
back in as a literal. What cannot be folded exactly (a value with no literal form, an error, too
many pieces) is left as it was, so the caller reports the selector as unsupported rather than
guess.

Pure: the runtime is reached only through `webhook.cel._native`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from . import _native, library, typecheck
from .ast import decode_checked
from .phantom import RESERVED

FOLD_DEPTH = 12
"""A constant sub-expression this deep (or deeper) is folded when the whole does not compile."""
MAX_PIECES = 1024
"""Native evaluations one fold may run (each stops within the runtime's iteration budget, about a
millisecond; pieces of one comprehension share one compile)."""
MAX_PARSE_DEPTH = 400
"""Nesting the parser follows (the API server refuses 250; deeper text is refused elsewhere)."""

_NAMESPACES = frozenset({"lists", "sets", "strings", "math", "optional", "cel", "base64"})
_MACROS_1 = frozenset({"all", "exists", "exists_one", "existsOne", "map", "filter"})
_MACROS_2 = frozenset({"all", "exists", "existsOne", "transformList", "transformMap", "transformMapEntry"})
_UNROLLABLE = frozenset({"all", "exists", "exists_one", "existsOne"})


class _Unfoldable(Exception):
    """The text is outside what this parser reads (the caller leaves it to the runtime)."""


# ---- tokens ----------------------------------------------------------------------------------------

_PUNCT = ("==", "!=", "<=", ">=", "&&", "||", "[?", ".?", "(", ")", "[", "]", "{", "}", ".", ",", ":",
          "?", "!", "-", "+", "*", "/", "%", "<", ">")


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # "num", "str", "id", "op", "end"
    text: str
    start: int
    end: int


def _string_end(text: str, at: int) -> int:
    """End offset of the string literal starting at `at` (after any r/b prefix)."""
    i = at
    raw = False
    while i < len(text) and text[i] in "rRbB":
        raw = raw or text[i] in "rR"
        i += 1
    quote = text[i]
    triple = text.startswith(quote * 3, i)
    closing = quote * 3 if triple else quote
    i += len(closing)
    while i < len(text):
        if not raw and text[i] == "\\":
            i += 2
            continue
        if text.startswith(closing, i):
            return i + len(closing)
        if not triple and text[i] == "\n":
            break
        i += 1
    raise _Unfoldable("unterminated string")


def _string_prefix(text: str, at: int) -> bool:
    """A raw/bytes prefix (r, b, rb, br in any case) directly followed by a quote."""
    j = at
    while j < len(text) and j - at < 2 and text[j] in "rRbB":
        j += 1
    return j > at and j < len(text) and text[j] in "'\""


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if text.startswith("//", i):
            nl = text.find("\n", i)
            i = n if nl < 0 else nl
            continue
        if c in "'\"" or _string_prefix(text, i):
            end = _string_end(text, i)
            out.append(_Tok("str", text[i:end], i, end))
            i = end
            continue
        if c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            j = i
            if text.startswith(("0x", "0X"), i):
                j += 2
                while j < n and text[j] in "0123456789abcdefABCDEF":
                    j += 1
            else:
                while j < n and (text[j].isdigit() or text[j] == "."):
                    j += 1
                if j < n and text[j] in "eE":
                    j += 1
                    if j < n and text[j] in "+-":
                        j += 1
                    while j < n and text[j].isdigit():
                        j += 1
            if j < n and text[j] in "uU":
                j += 1
            out.append(_Tok("num", text[i:j], i, j))
            i = j
            continue
        if c.isalpha() or c == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            out.append(_Tok("id", text[i:j], i, j))
            i = j
            continue
        if c == "`":
            raise _Unfoldable("quoted field names")
        for p in _PUNCT:
            if text.startswith(p, i):
                out.append(_Tok("op", p, i, i + len(p)))
                i += len(p)
                break
        else:
            raise _Unfoldable(f"unexpected character {c!r}")
    out.append(_Tok("end", "", n, n))
    return out


# ---- parse tree with spans ---------------------------------------------------------------------------

@dataclass(slots=True)
class Node:
    """A sub-expression: its source span, its children and the identifiers it reads unbound."""

    start: int
    end: int
    kind: str  # "lit", "ident", "select", "call", "index", "list", "map", "unary", "binary", "ternary"
    name: str = ""
    children: list[Node] = field(default_factory=list)
    free: frozenset[str] = frozenset()
    foldable: bool = True  # False for has()'s argument, whose form (a field selection) matters
    macro: str = ""  # comprehension macro name when this is one
    iter_vars: tuple[str, ...] = ()

    @property
    def constant(self) -> bool:
        return not self.free

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            yield from child.walk()


_BINARY = (("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=", "in"), ("+", "-"), ("*", "/", "%"))


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self, text: str | None = None) -> _Tok:
        tok = self.toks[self.i]
        if text is not None and tok.text != text:
            raise _Unfoldable(f"expected {text!r} at {tok.start}")
        self.i += 1
        return tok

    def at(self, *texts: str) -> bool:
        tok = self.peek()
        return tok.kind in ("op", "id") and tok.text in texts

    def parse(self) -> Node:
        node = self.expr()
        if self.peek().kind != "end":
            raise _Unfoldable("trailing text")
        return node

    def expr(self) -> Node:
        self.depth += 1
        if self.depth > MAX_PARSE_DEPTH:
            raise _Unfoldable("too deep")
        try:
            cond = self.binary(0)
            if not self.at("?"):
                return cond
            self.take("?")
            yes = self.binary(0)
            self.take(":")
            no = self.expr()
            return _node(cond.start, no.end, "ternary", "?:", [cond, yes, no])
        finally:
            self.depth -= 1

    def binary(self, level: int) -> Node:
        if level == len(_BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while self.at(*_BINARY[level]):
            op = self.take().text
            right = self.binary(level + 1)
            left = _node(left.start, right.end, "binary", op, [left, right])
        return left

    def unary(self) -> Node:
        if self.at("!", "-"):
            tok = self.take()
            operand = self.unary()
            return _node(tok.start, operand.end, "unary", tok.text, [operand])
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.at("."):
                self.take()
                name = self.take()
                if name.kind != "id":
                    raise _Unfoldable("expected a field name")
                if self.at("("):
                    args, end = self.arguments()
                    node = self.call(node, name.text, args, end)
                else:
                    node = _node(node.start, name.end, "select", name.text, [node])
            elif self.at("["):
                self.take()
                index = self.expr()
                end = self.take("]").end
                node = _node(node.start, end, "index", "[]", [node, index])
            elif self.at(".?", "[?"):
                raise _Unfoldable("optional selection")
            else:
                return node

    def arguments(self) -> tuple[list[Node], int]:
        self.take("(")
        args: list[Node] = []
        while not self.at(")"):
            args.append(self.expr())
            if not self.at(")"):
                self.take(",")
        return args, self.take(")").end

    def call(self, target: Node | None, name: str, args: list[Node], end: int) -> Node:
        if target is not None and target.kind == "ident" and target.name in _NAMESPACES:
            start = target.start
            qualified = f"{target.name}.{name}"
            if qualified == "cel.bind" and len(args) == 3 and args[0].kind == "ident":
                node = _node(start, end, "call", qualified, args)
                node.free = args[1].free | (args[2].free - {args[0].name})
                return node
            return _node(start, end, "call", qualified, args)
        if target is None:
            node = _node(0, end, "call", name, args)  # the caller sets the start
            if name == "has":
                for arg in args:
                    arg.foldable = False
            return node
        two = name in _MACROS_2 and (len(args) == 3 or (len(args) == 4 and name.startswith("transform")))
        var_count = 2 if two else 1
        if (name in _MACROS_1 or name in _MACROS_2) and len(args) >= 2 and all(
                a.kind == "ident" for a in args[:var_count]):
            loop = {a.name for a in args[:var_count]}
            body = args[var_count:]
            node = _node(target.start, end, "call", name, [target, *args])
            node.free = target.free | frozenset().union(*(b.free for b in body)) - loop
            node.macro = name
            node.iter_vars = tuple(a.name for a in args[:var_count])
            return node
        return _node(target.start, end, "call", name, [target, *args])

    def primary(self) -> Node:
        tok = self.peek()
        if tok.kind in ("num", "str"):
            self.take()
            return Node(tok.start, tok.end, "lit")
        if tok.kind == "id":
            self.take()
            if tok.text in ("true", "false", "null"):
                return Node(tok.start, tok.end, "lit")
            if self.at("("):
                args, end = self.arguments()
                node = self.call(None, tok.text, args, end)
                node.start = tok.start
                return node
            return Node(tok.start, tok.end, "ident", tok.text, free=frozenset({tok.text}))
        if self.at("("):
            start = self.take().start
            inner = self.expr()
            end = self.take(")").end
            # Parentheses only widen the span: what is folded is the bracketed text as a whole.
            inner.start, inner.end = start, end
            return inner
        if self.at("["):
            start = self.take().start
            items: list[Node] = []
            while not self.at("]"):
                items.append(self.expr())
                if not self.at("]"):
                    self.take(",")
            return _node(start, self.take("]").end, "list", "", items)
        if self.at("{"):
            start = self.take().start
            entries: list[Node] = []
            while not self.at("}"):
                entries.append(self.expr())
                self.take(":")
                entries.append(self.expr())
                if not self.at("}"):
                    self.take(",")
            return _node(start, self.take("}").end, "map", "", entries)
        if self.at("."):
            raise _Unfoldable("leading-dot names")
        raise _Unfoldable(f"unexpected {tok.text!r} at {tok.start}")


def _node(start: int, end: int, kind: str, name: str, children: list[Node]) -> Node:
    free = frozenset().union(*(c.free for c in children)) if children else frozenset()
    return Node(start, end, kind, name, children, free)


def parse(text: str) -> Node | None:
    """The span tree of `text`, or None when it is outside this parser."""
    try:
        return _Parser(text).parse()
    except (_Unfoldable, IndexError, RecursionError):
        return None


# ---- literals --------------------------------------------------------------------------------------

def string_literal(value: str) -> str:
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def literal(kind: str, value: object) -> str | None:
    """CEL text for a scalar runtime value of type `kind` (the runtime's type name), or None."""
    if kind == "BOOL" and isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bool):
        return None
    if kind == "INT" and isinstance(value, int):
        return str(value) if value >= 0 else f"({value})" if value > -(2**63) else None
    if kind == "UINT" and isinstance(value, int):
        return f"{value}u"
    if kind == "DOUBLE" and isinstance(value, float) and math.isfinite(value):
        text = repr(abs(value))
        if "e" not in text and "." not in text:
            text += ".0"
        return f"(-{text})" if math.copysign(1.0, value) < 0 else text
    if kind == "STRING" and isinstance(value, str):
        return string_literal(value)
    if kind == "NULL" and value is None:
        return "null"
    return None


# ---- evaluation of pieces ----------------------------------------------------------------------------

Outcome = tuple[str, str]
"""("value", literal text) / ("error", runtime message) / ("aborted", why)."""


class _Pieces:
    """Counts native evaluations against MAX_PIECES."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = MAX_PIECES if limit is None else min(limit, MAX_PIECES)
        self.left = self.limit
        self.compiled: dict[str, _native.NativeExpression] = {}

    @property
    def used(self) -> int:
        return self.limit - max(self.left, 0)

    def compile(self, text: str) -> _native.NativeExpression:
        hit = self.compiled.get(text)
        if hit is None:
            hit = self.compiled[text] = _native.compile_expression(text)
        return hit

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _Unfoldable("too many pieces")


def _rebuild(text: str, node: Node, visit: Callable[[Node], str]) -> str:
    """`node`'s source with each child's text replaced by `visit(child)`."""
    out: list[str] = []
    at = node.start
    for child in node.children:
        out.append(text[at:child.start])
        out.append(visit(child))
        at = child.end
    out.append(text[at:node.end])
    return "".join(out)


def _scope(source: str, free: frozenset[str], env: dict[str, object]) -> tuple[str, dict[str, object]]:
    """`source` with the enclosing comprehensions' variables bound (cel.bind to slots of the data)."""
    names = [name for name in env if name in free]
    data = {f"@b{slot}": env[name] for slot, name in enumerate(names)}
    for slot in reversed(range(len(names))):
        source = f"cel.bind({names[slot]}, device['@b{slot}'], {source})"
    return source, data


def _evaluate(source: str, pieces: _Pieces, env: dict[str, object] | None = None,
              free: frozenset[str] = frozenset(), *, checked: bool = False) -> tuple[str, object]:
    """Compile and evaluate one piece: ("value", Typed) / ("error", message) / ("aborted", why)."""
    pieces.spend()
    text, data = _scope(source, free, env or {})
    try:
        expression = pieces.compile(text)
    except _native.CompileFailure as exc:
        if "recursion" in exc.message.lower():
            return "aborted", exc.message
        raise _Unfoldable(exc.message) from None
    if checked:
        ast = decode_checked(expression.serialized)
        if typecheck.type_error(ast) or typecheck.regex_error(ast) or typecheck.unbounded_cost(ast):
            raise _Unfoldable("the piece is not valid on its own")
    try:
        ok, value = expression.evaluate_typed({"device": data})
    except _native.EvaluationAborted as exc:
        return "aborted", exc.message
    return ("value", value) if ok else ("error", str(value))


def _scalar(value: object) -> str:
    assert isinstance(value, _native.Typed)
    text = literal(value.kind, value.plain)
    if text is None:
        raise _Unfoldable(f"no literal for a {value.kind}")
    return text


# ---- deep constants ------------------------------------------------------------------------------------

_CHEAP = frozenset({"lit", "list", "map", "index", "unary", "binary", "ternary", "select"})


@dataclass(slots=True)
class Unrolled:
    """What `unroll_constants` did: the new text (None: nothing changed), the pieces it evaluated,
    and whether it stopped for lack of pieces (a larger allowance might have succeeded)."""

    text: str | None
    pieces: int
    exhausted: bool


def fold_deep(text: str, limit: int | None = None) -> Unrolled:
    """`text` with its deep constant sub-expressions replaced by their values (`.text`, None when
    nothing could be folded), within `limit` pieces (at most MAX_PIECES).

    For a selector the runtime refuses as too deeply nested. Only call-free pieces are folded, so
    the API server's cost estimate of the whole stays what draguard computes for the folded text
    (plus a few units per literal); each piece is compiled, type-checked and evaluated on its own.
    """
    root = parse(text)
    if root is None:
        return Unrolled(None, 0, exhausted=False)
    pieces = _Pieces(limit)
    depth: dict[int, int] = {}
    cheap: dict[int, bool] = {}

    def visit(node: Node) -> str:
        inner = _rebuild(text, node, visit)
        depth[id(node)] = 1 + max((depth[id(c)] for c in node.children), default=0)
        cheap[id(node)] = node.kind in _CHEAP and all(cheap[id(c)] for c in node.children)
        if not (node.constant and node.foldable and cheap[id(node)] and node.kind != "lit"
                and depth[id(node)] >= FOLD_DEPTH):
            return inner
        kind, value = _evaluate(inner, pieces, checked=True)
        if kind != "value":
            return inner
        try:
            folded = _scalar(value)
        except _Unfoldable:
            return inner
        depth[id(node)] = 1
        return f"({folded})" if not folded.startswith("(") else folded

    try:
        out = visit(root)
    except (_Unfoldable, RecursionError):
        return Unrolled(None, pieces.used, exhausted=pieces.left < 0)
    return Unrolled(out if out != text else None, pieces.used, exhausted=False)


# ---- comprehensions over the iteration budget ------------------------------------------------------------

def unroll_constants(text: str, limit: int | None = None) -> Unrolled:
    """`text` with each constant comprehension that exceeds the runtime's iteration budget replaced
    by its value, computed one element at a time, within `limit` pieces (at most MAX_PIECES)."""
    root = parse(text)
    if root is None:
        return Unrolled(None, 0, exhausted=False)
    pieces = _Pieces(limit)
    changed = False

    def visit(node: Node) -> str:
        nonlocal changed
        if node.constant and node.macro in _UNROLLABLE and node.foldable:
            kind, _ = _evaluate(text[node.start:node.end], pieces)
            if kind == "aborted":
                outcome = _unroll(text, node, pieces, {})
                if outcome[0] == "value":
                    changed = True
                    return outcome[1]
            return text[node.start:node.end]
        return _rebuild(text, node, visit)

    try:
        out = visit(root)
    except (_Unfoldable, RecursionError):
        return Unrolled(None, pieces.used, exhausted=pieces.left < 0)
    return Unrolled(out if changed else None, pieces.used, exhausted=False)


def _outcome(kind: str, value: object) -> Outcome:
    return (kind, _scalar(value)) if kind == "value" else (kind, str(value))


def _unroll(text: str, node: Node, pieces: _Pieces, env: dict[str, object]) -> Outcome:
    """Evaluate the one-variable comprehension `node` (all/exists/exists_one) element by element.

    `env` binds the enclosing comprehensions' variables to plain values. As in cel-go, all() is
    false as soon as one element is false (an error elsewhere is absorbed), else the first error,
    else true; exists() is the mirror; exists_one() fails on any error.
    """
    target, *args = node.children
    if len(node.iter_vars) != 1 or len(args) != 2:
        raise _Unfoldable("two-variable comprehension")
    var, body = node.iter_vars[0], args[1]
    elements = _elements(text, target, pieces, env)
    results: list[Outcome] = []
    for element in elements:
        inner = {**env, var: element}
        outcome = _outcome(*_evaluate(text[body.start:body.end], pieces, inner, body.free))
        if outcome[0] == "aborted" and body.macro in _UNROLLABLE:
            outcome = _unroll(text, body, pieces, inner)
        if outcome[0] == "aborted":
            raise _Unfoldable("still over the iteration budget")
        if outcome[0] == "value" and outcome[1] not in ("true", "false"):
            raise _Unfoldable("a predicate that is not a bool")
        results.append(outcome)
        if node.macro == "all" and outcome == ("value", "false"):
            return outcome
        if node.macro == "exists" and outcome == ("value", "true"):
            return outcome
    errors = [r for r in results if r[0] == "error"]
    if errors:
        return errors[0]
    if node.macro == "all":
        return "value", "true"
    if node.macro == "exists":
        return "value", "false"
    return "value", "true" if sum(r == ("value", "true") for r in results) == 1 else "false"


def _elements(text: str, node: Node, pieces: _Pieces, env: dict[str, object]) -> list[object]:
    """The elements of a list-valued sub-expression, as plain values the data map carries exactly."""
    kind, value = _evaluate(text[node.start:node.end], pieces, env, node.free)
    if kind != "value":
        raise _Unfoldable("the range does not evaluate")
    assert isinstance(value, _native.Typed)
    if not value.kind.startswith("LIST"):
        raise _Unfoldable("the range is not a list")
    out: list[object] = []
    for item_kind, item in value.items:
        # Through the dyn data map an int stays an int and a string a string; a uint would
        # arrive as an int, so only these kinds are unrolled.
        if item_kind not in ("BOOL", "INT", "DOUBLE", "STRING"):
            raise _Unfoldable(f"a range element of type {item_kind}")
        out.append(item)
    return out


# ---- quantities Kubernetes holds as decimals ---------------------------------------------------------

_SIMPLE_STRING = re.compile(r"""^(?:'([^'\\\n]*)'|"([^"\\\n]*)")$""")
_HELD_AS_DECIMAL = {"isInteger": "__draguard_decimalIsInteger", "asInteger": "__draguard_decimalAsInteger"}


def pin_literals(text: str) -> str | None:
    """`text` rewritten where a literal means something else in Kubernetes than in the runtime, or
    None when nothing changes:

    - `quantity('<literal>').isInteger()` / `.asInteger()` follow Kubernetes' representation of
      that literal (see `library.int64_form`): draguard's quantities carry only their exact value
      (so that `==` compares values, as in Kubernetes), but where the quantity is written as a
      literal its representation is known;
    - a map literal that repeats a key keeps the last entry, as cel-go does (the runtime fails).
    """
    if "Integer" not in text and "{" not in text:
        return None  # the common case, without parsing
    root = parse(text)
    if root is None:
        return None
    edits: list[tuple[int, int, str]] = []
    for node in root.walk():
        if node.kind == "map":
            edits.extend(_duplicate_keys(text, node))
            continue
        if node.kind != "call" or node.name not in _HELD_AS_DECIMAL or len(node.children) != 1:
            continue
        target = node.children[0]
        if not _held_as_decimal(text, target):
            continue
        name_at = text.find(node.name, target.end, node.end)
        if name_at >= 0:
            edits.append((name_at, name_at + len(node.name), _HELD_AS_DECIMAL[node.name]))
    if not edits:
        return None
    out = text
    for start, end, new in sorted(edits, reverse=True):
        out = out[:start] + new + out[end:]
    return out


def _held_as_decimal(text: str, node: Node) -> bool:
    """A quantity apimachinery holds as a decimal: a literal it parses off its int64 fast path, or
    a sum or difference with one (Add and Sub keep the decimal form once an operand has it)."""
    if node.kind == "call" and node.name == "quantity" and len(node.children) == 1:
        arg = node.children[0]
        found = _SIMPLE_STRING.match(text[arg.start:arg.end])
        if found is None:
            return False
        valid, as_int = library.int64_form(found.group(1) if found.group(1) is not None else found.group(2))
        return valid and as_int is None
    if node.kind == "call" and node.name in ("add", "sub") and node.children:
        return any(_held_as_decimal(text, child) for child in node.children)
    return False


def _duplicate_keys(text: str, node: Node) -> list[tuple[int, int, str]]:
    """Edits dropping the earlier entries of a repeated literal key (only literal values go)."""
    entries = list(zip(node.children[0::2], node.children[1::2], strict=True))
    keys: list[str | None] = []
    for key, _ in entries:
        source = text[key.start:key.end]
        found = _SIMPLE_STRING.match(source)
        if found is not None:
            keys.append("s:" + (found.group(1) if found.group(1) is not None else found.group(2)))
        elif key.kind == "lit" and re.fullmatch(r"[0-9]+|true|false", source):
            keys.append("v:" + source)
        else:
            keys.append(None)
    edits: list[tuple[int, int, str]] = []
    for index, ((key, value), name) in enumerate(zip(entries, keys, strict=True)):
        if name is None or name not in keys[index + 1:] or value.kind != "lit":
            continue
        # From the key to the start of the next entry's key: "k: v, ".
        end = entries[index + 1][0].start
        edits.append((key.start, end, ""))
    return edits


def exists_one_alias(text: str) -> str | None:
    """`exists_one(i, v, p)` spelled `existsOne(i, v, p)`, or None when there is none.

    cel-go's two-variable comprehensions take both spellings with three arguments; the runtime's
    only the second (with `exists_one` it reads a one-variable macro and reports `v` undeclared).
    """
    try:
        tokens = _tokens(text)
    except _Unfoldable:
        return None
    spans: list[int] = []
    for k in range(1, len(tokens) - 1):
        tok = tokens[k]
        if tok.text != "exists_one" or tokens[k - 1].text != "." or tokens[k + 1].text != "(":
            continue
        depth, commas = 0, 0
        for t in tokens[k + 1:]:
            if t.text in ("(", "[", "{", "[?"):
                depth += 1
            elif t.text in (")", "]", "}"):
                depth -= 1
                if depth == 0:
                    break
            elif t.text == "," and depth == 1:
                commas += 1
        if commas == 2:
            spans.append(tok.start)
    if not spans:
        return None
    out = text
    for start in reversed(spans):
        out = out[:start] + "existsOne" + out[start + len("exists_one"):]
    return out


def invalid_has(text: str) -> int | None:
    """Offset of a `has()` whose argument is not a field selection (`has(m['k'])`), or None.

    The parser refuses it however deep it stands; the runtime's parser says so too, but only
    where it does not stop at its nesting limit first.
    """
    try:
        tokens = _tokens(text)
    except _Unfoldable:
        return None
    for k in range(len(tokens) - 2):
        if tokens[k].text != "has" or tokens[k + 1].text != "(" or (k and tokens[k - 1].text == "."):
            continue
        depth = 0
        for j in range(k + 1, len(tokens)):
            t = tokens[j].text
            if t in ("(", "[", "{", "[?"):
                depth += 1
            elif t in (")", "]", "}"):
                depth -= 1
                if depth == 0:
                    if tokens[j - 1].text == "]":
                        return tokens[j - 1].start
                    break
    return None


HOIST_DEPTH = 10
"""Levels of the tree kept in one piece when a deep selector is cut with `cel.bind`."""
_STRICT = frozenset({"select", "index", "list", "map", "unary"})


def hoist_deep(text: str) -> str | None:
    """`text` with its deep parts bound by `cel.bind` to fresh names, so that no piece nests deeper
    than the runtime allows (32 levels); None when nothing could be cut.

    `cel.bind` evaluates its value before the body, so only a part the whole evaluates in any case
    is bound: one reached from the top through operators that evaluate all their operands and pass
    an error on (selections, indexes, literals, arithmetic, comparisons, function calls), never
    through `&&`, `||`, a branch of `? :`, a comprehension or `has()`. Its value or its error then
    reaches the result exactly as before. Deep device-reading shapes (`[[...][0]][0]`, a 40-term sum
    of attributes) get Kubernetes' answer instead of none.
    """
    root = parse(text)
    if root is None:
        return None
    bound: list[tuple[str, str]] = []
    depth: dict[int, int] = {}

    def strict(node: Node) -> bool:
        if node.kind in _STRICT:
            return True
        if node.kind == "binary":
            return node.name not in ("&&", "||")
        return node.kind == "call" and not node.macro and node.name not in ("has", "cel.bind")

    def visit(node: Node, reached: bool) -> str:
        inner_reached = reached and strict(node)
        inner = _rebuild(text, node, lambda child: visit(child, inner_reached))
        depth[id(node)] = 1 + max((depth[id(c)] for c in node.children), default=0)
        if reached and node is not root and node.foldable and node.kind != "lit" \
                and depth[id(node)] >= HOIST_DEPTH and node.free <= {"device"}:
            name = f"{RESERVED}b{len(bound)}"
            bound.append((name, inner))
            depth[id(node)] = 1
            return name
        return inner

    try:
        out = visit(root, True)
    except (_Unfoldable, RecursionError):
        return None
    if not bound:
        return None
    for name, value in reversed(bound):
        out = f"cel.bind({name}, {value}, {out})"
    return out

