"""Kubernetes' unknown-domain semantics, by rewriting the selector text before evaluation.

In Kubernetes, `device.attributes` and `device.capacity` answer a lookup of a domain the device
does not publish with an empty map (`device.attributes['other.example.com']` is `{}`, and
`has(device.attributes.x)` is true for any x), while `in`, `size()`, iteration and equality see
only the published domains. A plain map cannot behave both ways, so the evaluated text turns each
domain lookup into an optional one, `device.attributes[?key].orValue({})`, and each
`has(device.attributes.x)` into `true`; the data carries the published domains only.

The same pass sends `s.indexOf(sub, offset)` / `s.lastIndexOf(sub, offset)` to functions with
cel-go's offset rules (an offset past the end is -1 there, an error in the native runtime), and
`s.substring(start, end)` to one that accepts an `end` equal to the length, as cel-go does.
"""

from __future__ import annotations

from .ast import CALL, IDENT, SELECT, CheckedAst, Expr

_ROOTS = frozenset({"attributes", "capacity"})
RESERVED = "__draguard_"
"""Prefix of functions only the rewritten text may call; a selector naming one does not compile."""
OFFSET_FUNCTIONS = {"indexOf": f"{RESERVED}indexOf", "lastIndexOf": f"{RESERVED}lastIndexOf",
                    "substring": f"{RESERVED}substring"}
_OPEN = "([{"
_CLOSE = ")]}"


def _is_root(node: Expr | None) -> bool:
    return (
        node is not None and node.kind == SELECT and not node.test_only and node.field in _ROOTS
        and node.operand is not None and node.operand.kind == IDENT and node.operand.name == "device"
    )


def _is_raw(text: str, at: int) -> bool:
    """Whether the literal whose quote is at `at` has a raw prefix (r, R, rb, br, ...)."""
    start = at
    while start > 0 and at - start < 2 and text[start - 1] in "rRbB":
        start -= 1
    if start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        return False  # part of an identifier (`attr'...` cannot occur; `bar'` is not a prefix)
    return any(c in "rR" for c in text[start:at])


def _skip_string(text: str, at: int) -> int:
    """Index just past the string literal starting at `at` (a quote; an r/R prefix makes it raw)."""
    raw = _is_raw(text, at)
    quote = text[at]
    triple = text.startswith(quote * 3, at)
    end_token = quote * 3 if triple else quote
    i = at + len(end_token)
    while i < len(text):
        if not raw and text[i] == "\\":
            i += 2
            continue
        if text.startswith(end_token, i):
            return i + len(end_token)
        i += 1
    return len(text)


def matching_close(text: str, at: int) -> int | None:
    """Index of the bracket closing the one at `at`, skipping string literals."""
    depth = 0
    i = at
    while i < len(text):
        ch = text[i]
        if ch in "'\"":
            i = _skip_string(text, i)
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _identifier_end(text: str, at: int) -> int:
    while at < len(text) and (text[at].isalnum() or text[at] == "_"):
        at += 1
    return at


def rewrite(text: str, ast: CheckedAst) -> str | None:
    """The text to evaluate (`text` itself when nothing needs rewriting), or None when the source
    is not where the positions say."""
    inserts: list[tuple[int, int, str]] = []  # (start, end, replacement); end == start inserts
    for node in ast.nodes():
        offset = ast.positions.get(node.id)
        if offset is None:
            continue
        if node.kind == CALL and node.function == "_[_]" and node.target is None and len(node.args) == 2 \
                and _is_root(node.args[0]):
            if not text.startswith("[", offset):
                return None
            close = matching_close(text, offset)
            if close is None:
                return None
            inserts.append((offset + 1, offset + 1, "?"))
            inserts.append((close + 1, close + 1, ".orValue({})"))
        elif node.kind == CALL and node.function in OFFSET_FUNCTIONS and node.target is not None \
                and len(node.args) == 2:
            # s.indexOf(sub, offset), s.substring(start, end): cel-go's offset rules (see library.py),
            # under a reserved name.
            if not text.startswith("(", offset):
                return None
            end = offset
            while end > 0 and text[end - 1].isspace():
                end -= 1
            start = end - len(node.function)
            if start < 0 or text[start:end] != node.function:
                return None
            inserts.append((start, end, OFFSET_FUNCTIONS[node.function]))
        elif node.kind == SELECT and _is_root(node.operand):
            if node.test_only:
                # has(device.attributes.x): from `has` to its closing parenthesis.
                if not text.startswith("(", offset):
                    return None
                start = offset - 1
                while start >= 0 and text[start].isspace():
                    start -= 1
                if start < 2 or text[start - 2:start + 1] != "has":
                    return None
                close = matching_close(text, offset)
                if close is None:
                    return None
                inserts.append((start - 2, close + 1, "true"))
                continue
            if not text.startswith(".", offset):
                return None
            name_at = offset + 1
            while name_at < len(text) and text[name_at].isspace():
                name_at += 1
            end = _identifier_end(text, name_at)
            if text[name_at:end] != node.field:
                return None
            inserts.append((offset, end, f"[?'{node.field}'].orValue({{}})"))
    if not inserts:
        return text
    out = text
    for start, end, replacement in sorted(inserts, key=lambda e: (e[0], e[1]), reverse=True):
        out = out[:start] + replacement + out[end:]
    return out


def collapse_parentheses(text: str) -> str:
    """`((x))` -> `(x)` everywhere outside string literals: the same expression, nested less deep.

    The native parser stops at 32 levels where Kubernetes' allows far more; redundant
    parentheses are the common way to get there.
    """
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "'\"":
            i = _skip_string(text, i)
            continue
        if ch in _OPEN:
            stack.append(i)
        elif ch in _CLOSE and stack:
            pairs[stack.pop()] = i
        i += 1
    drop: set[int] = set()
    for start, end in pairs.items():
        if text[start] != "(":
            continue
        inner = start + 1
        while inner < end and text[inner].isspace():
            inner += 1
        before = end - 1
        while before > start and text[before].isspace():
            before -= 1
        # The outer pair only wraps the inner one; a call's own parentheses (f((x))) keep theirs.
        if inner < end and text[inner] == "(" and pairs.get(inner) == before:
            prev = start - 1
            while prev >= 0 and text[prev].isspace():
                prev -= 1
            if prev >= 0 and (text[prev].isalnum() or text[prev] in "_)]"):
                continue
            drop.update((start, end))
    if not drop:
        return text
    return "".join(ch for k, ch in enumerate(text) if k not in drop)
