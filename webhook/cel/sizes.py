"""Where the API server's cost estimate is unbounded because a string's size cannot be known.

cel-go's estimator tracks a size range for every string and list. A literal, `device.driver` and
an attribute value have a bounded size; the result of `string()`, `format()`, `charAt()` and the
URL getters has none, nor have the elements of `split()` and `findAll()` lists. Any operation whose
cost is charged per character of such a string (`matches`, `contains`, `+`, `split`, `lowerAscii`,
`quantity()`, ...) then has an unbounded estimate, and the API server refuses the selector as too
complex ("exceeds cost limit"), however short the string is at run time. A comprehension over a list
of unknown length is refused the same way.

The model follows cel-go's `checker/cost.go` and Kubernetes' `apiserver/pkg/cel/library/cost.go`
only as far as bounded/unbounded goes: the exact figures are `analysis.estimate_cost`'s business.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .ast import CALL, COMPREHENSION, CONST, IDENT, LIST, CheckedAst, Expr


@dataclass(frozen=True, slots=True)
class _Var:
    text: bool = False  # a string of unknown size
    items: bool = False  # a list whose string elements have unknown sizes
    length: bool = False  # a list of unknown length


_KNOWN = _Var()
# Functions whose string result has no size estimate in cel-go or Kubernetes' estimators.
_UNSIZED_RESULT = frozenset({"format", "charAt", "getHost", "getHostname", "getPort", "getScheme",
                             "getEscapedPath"})
# Same size as the string they are called on.
_SIZE_OF_TARGET = frozenset({"lowerAscii", "upperAscii", "trim", "substring", "find", "replace"})
# Charged per character of the string they are called on.
_SCAN_TARGET = frozenset({"contains", "lowerAscii", "upperAscii", "trim", "substring", "replace", "split",
                          "format",
                          "indexOf", "lastIndexOf"})
# Charged per character of their (first) argument.
_SCAN_ARGUMENT = frozenset({"startsWith", "endsWith", "contains", "quantity", "isQuantity", "semver",
                            "isSemver", "ip", "isIP", "cidr", "isCIDR", "url", "ip.isCanonical",
                            "strings.quote"})
_LIST_SCANS = frozenset({"isSorted", "sum", "max", "min", "indexOf", "lastIndexOf", "includes"})
_REORDERING = frozenset({"sort", "distinct", "reverse", "slice"})
_CONST_KINDS = {str: "string", bool: "bool", int: "int", float: "double", bytes: "bytes", type(None): "null"}
_ORDERING = frozenset({"_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_"})


class _Sizes:
    def __init__(self, ast: CheckedAst) -> None:
        self.types = ast.types
        self.reason: str | None = None

    def kind(self, node: Expr) -> str | None:
        if node.kind == CONST:
            return _CONST_KINDS.get(type(node.value))
        if node.kind == LIST:
            return "list"
        return self.types.get(node.id)

    # ---- sizes ----------------------------------------------------------------------------------
    def text(self, node: Expr, env: Mapping[str, _Var]) -> bool:
        """A string expression whose size the estimator cannot bound."""
        if node.kind == IDENT:
            return env.get(node.name, _KNOWN).text
        if node.kind == COMPREHENSION and node.result is not None:
            return self.text(node.result, self.scope(node, env))
        if node.kind != CALL:
            return False
        f = node.function
        if f == "string" and node.target is None and len(node.args) == 1:
            # string(dyn) may pick the identity overload, whose size is its argument's.
            arg = node.args[0]
            kind = self.kind(arg)
            return self.text(arg, env) if kind in (None, "dyn", "string") else True
        if f == "join":
            return node.target is None or not _empty_list(node.target)
        if f in _UNSIZED_RESULT:
            return True
        if f in _SIZE_OF_TARGET and node.target is not None:
            return self.text(node.target, env) or any(self.text(a, env) for a in node.args)
        if f == "_+_" and self.kind(node) == "string":
            return any(self.text(a, env) for a in node.args)
        if f == "_?_:_" and len(node.args) == 3:
            return self.text(node.args[1], env) or self.text(node.args[2], env)
        if f == "_[_]" and node.args and self.kind(node.args[0]) == "list":
            return self.items(node.args[0], env)
        if f in ("strings.quote", "dyn") and node.args:
            return self.text(node.args[0], env)
        return False

    def items(self, node: Expr, env: Mapping[str, _Var]) -> bool:
        """A list whose string elements have sizes the estimator cannot bound."""
        if node.kind == LIST:
            return any(self.text(e, env) for e in node.elements)
        if node.kind == IDENT:
            return env.get(node.name, _KNOWN).items
        if node.kind == COMPREHENSION:
            inner = self.scope(node, env)
            if node.loop_step is not None and any(
                    n.kind == LIST and any(self.text(e, inner) for e in n.elements)
                    for n in node.loop_step.walk()):
                return True
            return node.result is not None and self.items(node.result, inner)
        if node.kind != CALL:
            return False
        f = node.function
        if f in ("split", "findAll"):
            return True
        if f in _REORDERING and node.target is not None:
            return self.stringy(node.target)  # the extension's list functions keep no element sizes
        if f == "_+_":
            return any(self.items(a, env) for a in node.args)
        if f == "_?_:_" and len(node.args) == 3:
            return self.items(node.args[1], env) or self.items(node.args[2], env)
        return False

    def stringy(self, node: Expr) -> bool:
        """A list whose elements are strings, as far as the tree shows."""
        if node.kind == LIST:
            return any(self.kind(e) == "string" for e in node.elements)
        if node.kind == COMPREHENSION:
            step = node.loop_step
            if step is not None and any(n.kind == LIST and n.elements for n in step.walk()):
                return any(n.kind == LIST and any(self.kind(e) == "string" for e in n.elements)
                           for n in step.walk())
            return node.iter_range is not None and self.stringy(node.iter_range)
        if node.kind != CALL:
            return False
        f = node.function
        if f in ("split", "findAll"):
            return True
        if f in _REORDERING and node.target is not None:
            return self.stringy(node.target)
        if f == "_+_" or (f == "_?_:_" and len(node.args) == 3):
            return any(self.stringy(a) for a in node.args[-2:])
        return False

    def length(self, node: Expr, env: Mapping[str, _Var]) -> bool:
        """A list whose length the estimator cannot bound."""
        if node.kind == IDENT:
            return env.get(node.name, _KNOWN).length
        if node.kind == COMPREHENSION:
            if node.iter_range is not None and self.length(node.iter_range, env):
                return True
            return node.result is not None and self.length(node.result, self.scope(node, env))
        if node.kind != CALL:
            return False
        f = node.function
        if f in ("split", "findAll") and node.target is not None:
            limited = f == "split" and len(node.args) > 1 and node.args[1].kind == CONST
            return not limited and self.text(node.target, env)
        if f in _REORDERING and node.target is not None:
            return self.length(node.target, env)
        if f == "lists.range":
            return not node.args or node.args[0].kind != CONST
        if f == "_+_" or (f == "_?_:_" and len(node.args) == 3):
            return any(self.length(a, env) for a in node.args[-2:])
        return False

    def scope(self, node: Expr, env: Mapping[str, _Var]) -> dict[str, _Var]:
        inner = dict(env)
        source = node.iter_range
        if source is not None and self.kind(source) == "list":
            element = _Var(text=self.items(source, env))
            if node.iter_var2:
                inner[node.iter_var2] = element
                inner[node.iter_var] = _KNOWN
            else:
                inner[node.iter_var] = element
        elif node.iter_var:
            inner[node.iter_var] = _KNOWN
            if node.iter_var2:
                inner[node.iter_var2] = _KNOWN
        if node.accu_init is not None and node.accu_var:
            init = node.accu_init
            inner[node.accu_var] = _Var(self.text(init, env), self.items(init, env), self.length(init, env))
        return inner

    # ---- costs ----------------------------------------------------------------------------------
    def visit(self, node: Expr, env: Mapping[str, _Var]) -> None:
        if self.reason is not None:
            return
        if node.kind == COMPREHENSION:
            source = node.iter_range
            if source is not None:
                self.visit(source, env)
                if self.kind(source) == "list" and self.length(source, env):
                    self.reason = "a comprehension over a list whose length is unknown"
                    return
            if node.accu_init is not None:
                self.visit(node.accu_init, env)
            inner = self.scope(node, env)
            # Over an empty range the body is charged zero times, whatever it costs.
            body = () if source is not None and _empty_list(source) else (node.loop_condition, node.loop_step)
            for part in (*body, node.result):
                if part is not None:
                    self.visit(part, inner)
            return
        if node.kind == CALL:
            found = self.call(node, env)
            if found is not None:
                self.reason = found
                return
        for child in node.children():
            self.visit(child, env)

    def call(self, node: Expr, env: Mapping[str, _Var]) -> str | None:
        f = node.function
        target = node.target
        args = node.args
        if f == "matches":
            subject, pattern = (target, args[0]) if target is not None and args else \
                (args[0], args[1]) if len(args) == 2 else (None, None)
            # The cost is string size x pattern size: an empty literal on either side makes it 0.
            if subject is not None and pattern is not None and not _empty(subject) and not _empty(pattern) \
                    and (self.text(subject, env) or self.text(pattern, env)):
                return "matches() on a string whose size is unknown"
        if f in ("find", "findAll") and target is not None and args and not _empty(args[0]) \
                and (self.text(target, env) or self.text(args[0], env)):
            return f"{f}() on a string whose size is unknown"
        if f == "contains" and target is not None and args and (_empty(target) or _empty(args[0])):
            return None
        if f in _SCAN_TARGET and target is not None and self.kind(target) == "string" \
                and self.text(target, env):
            return f"{f}() on a string whose size is unknown"
        if f in ("contains", "replace") and target is not None and self.kind(target) == "string" \
                and any(self.text(a, env) for a in args):
            return f"{f}() with a string argument whose size is unknown"
        if f in _SCAN_ARGUMENT and args and (target is None or f in ("startsWith", "endsWith", "contains")) \
                and self.text(args[0], env):
            return f"{f}() of a string whose size is unknown"
        if f == "_+_" and self.kind(node) == "string" and any(self.text(a, env) for a in args):
            return "concatenating a string whose size is unknown"
        if f in _ORDERING and len(args) == 2 and all(self.text(a, env) for a in args):
            return "comparing two strings whose sizes are unknown"
        if f == "join" and target is not None and not _empty_list(target):
            return "join() over a list whose element sizes are unknown"
        if f in _LIST_SCANS and target is not None and self.kind(target) == "list" \
                and (self.items(target, env) or self.length(target, env)):
            return f"{f}() over a list of strings whose sizes are unknown"
        if f == "@in" and len(args) == 2 and self.kind(args[1]) == "list" and self.length(args[1], env):
            return "`in` over a list whose length is unknown"
        if f.startswith("sets.") and any(self.length(a, env) for a in args):
            return f"{f}() over a list whose length is unknown"
        return None


def _empty(node: Expr) -> bool:
    return _empty_list(node)


def _empty_list(node: Expr) -> bool:
    """A list or string the estimator knows to be empty (size 0): `[]`, `''`, and what is made of
    them (`''.split(' ')`, `[].sort()`, `[].map(x, ...)`, `[].join()`)."""
    if node.kind == LIST:
        return not node.elements
    if node.kind == CONST:
        return node.value == ""
    if node.kind == COMPREHENSION:
        bind = node.iter_var.startswith("#")
        return not bind and node.iter_range is not None and _empty_list(node.iter_range) \
            and node.result is not None and node.result.kind == IDENT and node.result.name == node.accu_var \
            and node.accu_init is not None and _empty_list(node.accu_init)
    if node.kind == CALL and node.function == "_[_]" and node.args:
        return node.args[0].kind == LIST and not node.args[0].elements  # `[][i]` has size 0 there
    if node.kind == CALL and node.function == "_+_" and len(node.args) == 2:
        return all(_empty_list(a) for a in node.args)
    if node.kind == CALL and node.function == "lists.range" and len(node.args) == 1:
        return node.args[0].kind == CONST and node.args[0].value == 0
    if node.kind != CALL or node.target is None:
        return False
    if node.function == "slice" and len(node.args) == 2 and all(
            a.kind == CONST and type(a.value) is int for a in node.args) \
            and node.args[0].value == node.args[1].value:
        return True
    if node.function in ("split", "find", "findAll", "join", "replace", "lowerAscii", "upperAscii", "trim",
                         "substring") or node.function in _REORDERING:
        return _empty_list(node.target)
    return False


def unbounded(ast: CheckedAst) -> str | None:
    """Why the API server's estimate is unbounded for want of a size, or None."""
    sizes = _Sizes(ast)
    sizes.visit(ast.expr, {})
    return sizes.reason
