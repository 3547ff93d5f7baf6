"""Type rules of Kubernetes' CEL environment that the native checker does not apply.

- Aggregate literals are homogeneous (cel-go's HomogeneousAggregateLiterals): `[1, 'a']`,
  `[1, null]` and `{'a': 1, 'b': 'x'}` do not compile (format()'s argument list is exempt).
- `device` is an object type whose `driver` is a string and `allowMultipleAllocations` a bool;
  the native runtime only knows `map(string, dyn)`, so `device.driver == 1` or
  `true || device.driver` would otherwise pass its checker.

A type that depends on device data (dyn in the native checker) is never held against a selector:
only what the API server's checker must refuse is reported.
"""

from __future__ import annotations

import json
import re

from .ast import CALL, COMPREHENSION, CONST, IDENT, LIST, SELECT, STRUCT, CheckedAst, Expr
from .library import regex_valid

_DEVICE_FIELD_TYPES = {"driver": "string", "allowMultipleAllocations": "bool"}
_LOGIC = frozenset({"_&&_", "_||_", "!_"})
_EQUALITY = frozenset({"_==_", "_!=_"})


def _device_field(node: Expr) -> str | None:
    if node.kind == SELECT and not node.test_only and node.operand is not None \
            and node.operand.kind == IDENT and node.operand.name == "device":
        return _DEVICE_FIELD_TYPES.get(node.field)
    return None


def _device_map(node: Expr) -> str | None:
    """"attributes" or "capacity" for `device.attributes` / `device.capacity`."""
    if node.kind == SELECT and not node.test_only and node.field in ("attributes", "capacity") \
            and node.operand is not None and node.operand.kind == IDENT and node.operand.name == "device":
        return node.field
    return None


def _domain_map(node: Expr) -> str | None:
    """"attributes" or "capacity" for one domain's map: `device.attributes['d']`, `device.capacity.d`."""
    if node.kind == SELECT and not node.test_only and node.operand is not None:
        return _device_map(node.operand)
    if node.kind == CALL and node.function == "_[_]" and len(node.args) == 2:
        return _device_map(node.args[0])
    return None


def attribute_value(node: Expr) -> bool:
    """An attribute's value: typed `any` by the API server's checker (not `dyn`: `[attr, 'x']` and
    `[attr, dyn('x')]` are mixed literals there)."""
    if node.kind == SELECT and not node.test_only and node.operand is not None:
        return _domain_map(node.operand) == "attributes"
    if node.kind == CALL and node.function == "_[_]" and len(node.args) == 2:
        return _domain_map(node.args[0]) == "attributes"
    return False


class _Typer:
    def __init__(self, ast: CheckedAst) -> None:
        self.ast = ast

    def full(self, node: Expr) -> str | None:
        """The static type as cel-go names it, or None when it depends on device data."""
        field_type = _device_field(node)
        if field_type is not None:
            return field_type
        if attribute_value(node):
            return "any"
        if _list_aggregate(node):
            return "int"
        if node.kind == LIST:
            if not node.elements:
                return None
            inner = self.full(node.elements[0])
            return None if inner is None else f"list({inner})"
        if node.kind == STRUCT:
            if not node.entries or node.entries[0].key is None or node.entries[0].value is None:
                return None
            key, value = self.full(node.entries[0].key), self.full(node.entries[0].value)
            return None if key is None or value is None else f"map({key}, {value})"
        if node.kind == CALL and node.function == "dyn" and node.target is None:
            return "dyn"
        primitive = self.ast.types.get(node.id)
        if primitive in (None, "dyn", "list", "map", "type"):
            return None
        return primitive

    def _shape(self, node: Expr) -> str:
        if _device_map(node) == "attributes":
            return "map(string, map(string, any))"
        if _device_map(node) == "capacity":
            return "map(string, map(string, Quantity))"
        if _domain_map(node) == "attributes":
            return "map(string, any)"
        if _domain_map(node) == "capacity":
            return "map(string, Quantity)"
        if node.kind == CONST:
            return "null_type" if node.value is None else self.full(node) or "dyn"
        return self.full(node) or "dyn"

    def message(self, node: Expr, text: str) -> str:
        line, column = self.ast.location(node.id)
        return f"ERROR: <input>:{line}:{(column or 0) + 1}: {text}"

    def homogeneous(self, items: list[Expr]) -> str | None:
        if len(items) < 2:
            return None
        first = self.full(items[0])
        if first is None:
            return None
        for item in items[1:]:
            current = self.full(item)
            if current is not None and current != first:
                return self.message(item, f"expected type '{first}' but found '{current}'")
        return None

    def check(self, node: Expr) -> str | None:
        if node.kind == LIST:
            found = self.homogeneous(node.elements)
            if found:
                return found
        elif node.kind == STRUCT and node.entries and all(e.key is not None for e in node.entries):
            keys = [e.key for e in node.entries if e.key is not None]
            values = [e.value for e in node.entries if e.value is not None]
            found = self.homogeneous(keys) or self.homogeneous(values)
            if found:
                return found
        elif node.kind == CALL and node.target is None:
            if node.function in _LOGIC or (node.function == "_?_:_" and node.args):
                operands = node.args if node.function in _LOGIC else node.args[:1]
                for arg in operands:
                    field_type = _device_field(arg)
                    if field_type is not None and field_type != "bool":
                        return self.message(arg, f"expected type 'bool' but found '{field_type}'")
            elif node.function in _EQUALITY and len(node.args) == 2 and any(
                    (_device_map(a) or _domain_map(a)) and b.kind == CONST
                    for a, b in (node.args, node.args[::-1])):
                pair = ", ".join(self._shape(a) for a in node.args)
                return self.message(node, f"found no matching overload for '{node.function}' "
                                          f"applied to '({pair})'")
            elif node.function == "@in" and len(node.args) == 2 and (
                    _device_map(node.args[1]) or _domain_map(node.args[1])) \
                    and self.ast.types.get(node.args[0].id) in ("bool", "int", "uint", "double"):
                pair = f"{self.ast.types[node.args[0].id]}, {self._shape(node.args[1])}"
                return self.message(node, f"found no matching overload for '@in' applied to '({pair})'")
            elif node.function in _EQUALITY and len(node.args) == 2 and any(
                    _list_aggregate(a) and _static_type(self, b) in ("uint", "double", "string", "bool")
                    for a, b in (node.args, node.args[::-1])):
                pair = ", ".join("int" if _list_aggregate(a) else _static_type(self, a) or "dyn"
                                 for a in node.args)
                return self.message(node, f"found no matching overload for '{node.function}' "
                                          f"applied to '({pair})'")
            elif node.function in _EQUALITY and len(node.args) == 2:
                left, right = node.args
                for a, b in ((left, right), (right, left)):
                    field_type = _device_field(a)
                    other = self.full(b) if b.kind == CONST or _device_field(b) else None
                    if field_type is not None and other is not None and other != field_type:
                        pair = f"({field_type}, {other})" if a is left else f"({other}, {field_type})"
                        return self.message(node, f"found no matching overload for '{node.function}' "
                                                  f"applied to '{pair}'")
        return None


_CLAUSE = re.compile(r"%(%|[-+# 0]*[0-9]*(?:\.[0-9]+)?([a-zA-Z]))")
# Clause letter -> (argument types cel-go's format validator refuses, its message).
_CLAUSE_RULES: dict[str, tuple[frozenset[str], str]] = {
    "d": (frozenset({"double", "string", "bool", "bytes", "list", "map"}),
          "decimal clause can only be used on integers"),
    "o": (frozenset({"double", "string", "bool", "bytes", "list", "map"}),
          "octal clause can only be used on integers"),
    "f": (frozenset({"int", "uint", "bool", "bytes", "list", "map"}),
          "fixed-point clause can only be used on doubles"),
    "e": (frozenset({"int", "uint", "bool", "bytes", "list", "map"}),
          "scientific clause can only be used on doubles"),
    "b": (frozenset({"double", "string", "bytes", "list", "map"}),
          "only integers and bools can be formatted as binary"),
    "x": (frozenset({"double", "bool", "list", "map"}),
          "only integers, byte buffers, and strings can be formatted as hex"),
    "X": (frozenset({"double", "bool", "list", "map"}),
          "only integers, byte buffers, and strings can be formatted as hex"),
}
_VERBS = frozenset("sdfeExXob")
_CONST_TYPES = {str: "string", bool: "bool", int: "int", float: "double", bytes: "bytes"}


def _static_type(typer: _Typer, node: Expr) -> str | None:
    if node.kind == CONST:
        return _CONST_TYPES.get(type(node.value))
    if node.kind == LIST:
        return "list"
    if node.kind == STRUCT:
        return "map"
    found = typer.ast.types.get(node.id)
    return found if found in ("int", "uint", "double", "string", "bool", "bytes", "list", "map") else None


def _format_error(typer: _Typer, node: Expr) -> str | None:
    """What cel-go's format validator refuses at compile time: a literal format string whose clauses
    do not fit a literal argument list (count, or an argument type a clause cannot print)."""
    if not (node.kind == CALL and node.function == "format" and node.target is not None
            and node.target.kind == CONST and isinstance(node.target.value, str)
            and len(node.args) == 1 and node.args[0].kind == LIST):
        return None
    args = node.args[0].elements
    clauses = [m.group(2) for m in _CLAUSE.finditer(node.target.value) if m.group(1) != "%"]
    if len(args) > len(clauses):
        return typer.message(node, f"too many arguments supplied to string.format "
                                   f"(expected {len(clauses)}, got {len(args)})")
    if len(args) < len(clauses):
        return typer.message(node, f"index {len(args)} out of range")
    for found in _CLAUSE.finditer(node.target.value):
        if found.group(1) != "%" and found.group(2) not in _VERBS:
            return typer.message(node, f"error during string format: unrecognized formatting clause "
                                       f"\"{found.group(2)}\"")
    # What the validator lets through and fails only when run ('%.2f' of 'a') is an evaluation error.
    for letter, arg in zip(clauses, args, strict=True):
        rule = _CLAUSE_RULES.get(letter or "")
        kind = _static_type(typer, arg)
        if rule is not None and kind in rule[0]:
            return typer.message(arg, f"error during formatting: {rule[1]}, was given {kind}")
    return None


def root_error(ast: CheckedAst) -> str | None:
    """A whole selector whose result type the API server refuses where the native checker says dyn
    (not applied to the pieces draguard evaluates on its own, which need not be bool)."""
    found = _root_type(ast)
    return None if found is None else f"must evaluate to bool or the unknown type, not {found}"


def _root_type(ast: CheckedAst) -> str | None:
    """The result type where the native checker says dyn but Kubernetes' checker knows better."""
    root = ast.expr
    while root.kind == COMPREHENSION and root.iter_range is not None and root.iter_range.kind == LIST \
            and not root.iter_range.elements and root.result is not None:  # cel.bind(x, v, body)
        body: Expr = root.result
        if body.kind == IDENT and body.name == root.accu_var and root.accu_init is not None:
            root = root.accu_init
        else:
            root = body
    if root.kind == CALL and root.function == "dyn" and root.target is None:
        return "dyn"
    if root.kind == CALL and root.function in ("sum", "min", "max") and root.target is not None:
        # Only a list of bools has a bool maximum; a list of attribute values gives dyn.
        kind = _element_kind(ast, root.target)
        return None if kind in (None, "bool") else "dyn" if kind == "any" else kind
    if root.kind == CALL and root.function == "_[_]" and len(root.args) == 2 and ast.types.get(
            root.args[0].id) == "list":
        kind = _element_kind(ast, root.args[0])  # an element of a list of strings is a string
        return None if kind in (None, "bool", "any") else kind
    if root.kind == CALL and root.function in _ARITHMETIC and root.target is None:
        known = ast.types.get(root.id)  # arithmetic never yields a bool, nor an attribute's `any`
        return known if known in ("int", "uint", "double", "string", "bytes", "list") else "dyn"
    return None


_ARITHMETIC = frozenset({"_+_", "_-_", "_*_", "_/_", "_%_", "-_"})
_KINDS = {"bool", "int", "uint", "double", "string", "bytes"}


def _element_kind(ast: CheckedAst, node: Expr) -> str | None:
    """The element type of a list expression as the API server's checker sees it, where the tree
    shows it: a primitive, "any" (attribute values), or None (unknown: no verdict drawn)."""
    def kind_of(e: Expr) -> str | None:
        if attribute_value(e):
            return "any"
        if e.kind == CONST:
            return _CONST_TYPES.get(type(e.value))
        found = ast.types.get(e.id)
        return found if found in _KINDS else None

    if node.kind == LIST:
        if not node.elements:
            return "int"  # cel-go resolves the overload for an empty literal to the int one
        kinds = {kind_of(e) for e in node.elements}
        return kinds.pop() if len(kinds) == 1 else None
    if node.kind == COMPREHENSION and node.loop_step is not None and node.iter_range is not None:
        for step in node.loop_step.walk():
            if step.kind == LIST and len(step.elements) == 1:
                element = step.elements[0]
                if element.kind == IDENT and element.name in (node.iter_var, node.iter_var2):
                    if _device_map(node.iter_range) or _domain_map(node.iter_range):
                        # over a device map: its keys are strings, attribute values `any`
                        key = element.name == node.iter_var
                        if key:
                            return "string"
                        return "any" if _domain_map(node.iter_range) == "attributes" else None
                    # filter(), or map(x, x): the variable's own type where the checker knows it
                    return kind_of(element) or _element_kind(ast, node.iter_range)
                return kind_of(element)  # map()
        return None
    if node.kind != CALL:
        return None
    if node.function == "lists.range":
        return "int"
    if node.function in ("split", "findAll"):
        return "string"
    if node.function in ("sort", "distinct", "reverse", "slice") and node.target is not None:
        return _element_kind(ast, node.target)
    if node.function == "_+_" and len(node.args) == 2:
        kinds = {_element_kind(ast, a) for a in node.args}
        return kinds.pop() if len(kinds) == 1 else None
    return None


def _int_list(node: Expr) -> bool:
    """A list of ints as far as the tree shows (`[]` counts: cel-go picks the int overload for it)."""
    if node.kind == LIST:
        return all(e.kind == CONST and type(e.value) is int for e in node.elements)
    if node.kind == COMPREHENSION:  # filter() keeps its range's elements
        step = node.loop_step
        filtering = step is not None and any(
            n.kind == LIST and len(n.elements) == 1 and n.elements[0].kind == IDENT
            and n.elements[0].name == node.iter_var for n in step.walk())
        return filtering and node.iter_range is not None and _int_list(node.iter_range)
    if node.kind != CALL:
        return False
    if node.function == "lists.range":
        return True
    if node.function in ("sort", "distinct", "reverse", "slice") and node.target is not None:
        return _int_list(node.target)
    return node.function == "_+_" and len(node.args) == 2 and all(_int_list(a) for a in node.args)


def _list_aggregate(node: Expr) -> bool:
    """`sum()`, `min()` or `max()` of a list of ints: an int to the API server's checker."""
    return node.kind == CALL and node.function in ("sum", "min", "max") and node.target is not None \
        and _int_list(node.target)


def type_error(ast: CheckedAst) -> str | None:
    """The first error Kubernetes' checker reports that the native one does not, in cel-go's words."""
    typer = _Typer(ast)
    root_type = _device_field(ast.expr)
    if root_type is not None and root_type != "bool":
        return f"must evaluate to bool or the unknown type, not {root_type}"
    for node in ast.nodes():
        if node.kind == CALL and node.function == "format" and node.target is not None \
                and node.target.kind == CONST and node.args and node.args[0].kind == LIST \
                and any(attribute_value(e) for e in node.args[0].elements):
            # An attribute's value is google.protobuf.Any to the format validator: no clause takes it.
            arg = next(e for e in node.args[0].elements if attribute_value(e))
            return typer.message(arg, "error during formatting: no formatting clause accepts "
                                      "google.protobuf.Any (an attribute's value); convert it first, "
                                      "e.g. string(...)")
    for node in ast.nodes():
        found = _format_error(typer, node)
        if found:
            return found
        if node.kind == CALL and node.function == "reverse" and node.target is not None and not node.args \
                and (_static_type(typer, node.target) == "string" or _device_field(node.target) == "string"):
            # Kubernetes' strings library is version 2; reverse() came with version 3.
            return typer.message(node, "found no matching overload for 'reverse' applied to 'string.()'")
    # cel-go exempts the argument list of the strings extension's format() from the rule.
    exempt = {arg.id for node in ast.nodes() if node.kind == CALL and node.function == "format"
              for arg in node.args if arg.kind == LIST}
    for node in ast.nodes():
        if node.id in exempt:
            continue
        found = typer.check(node)
        if found:
            return found
    return None


# ---- calls the API server evaluates while compiling -------------------------------------------
# cel-go folds type conversions of literals while building the program, and precompiles literal
# regexes: a failure there (`int('x')`, `uint(-1)`, `matches('[')`) rejects the selector. format()
# is judged by its validator's static rules (`_format_error`): what passes them and fails when run
# (`'%.2f'.format(['a'])`) is an evaluation error, as in the scheduler.

_CONVERSIONS = frozenset({"int", "uint", "double", "string", "bytes", "bool", "duration", "timestamp"})


def literal(node: Expr, types: dict[int, str]) -> str | None:
    """CEL source text of a literal (or a list of literals), None for anything else."""
    if node.kind == CONST:
        value = node.value
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return f"{value}u" if types.get(node.id) == "uint" else str(value)
        if isinstance(value, float):
            text = repr(value)
            return text if any(c in text for c in ".e") and "n" not in text else None
        if isinstance(value, str):
            return json.dumps(value)
        if isinstance(value, bytes):
            return 'b"' + "".join(f"\\x{b:02x}" for b in value) + '"'
        return None
    if node.kind == CALL and node.function in _CONVERSIONS and node.target is None and len(node.args) == 1:
        # cel-go folds a conversion of a conversion of a literal too (`uint(double(1e30))`).
        inner = literal(node.args[0], types)
        return None if inner is None else f"{node.function}({inner})"
    if node.kind == LIST:
        parts = [literal(e, types) for e in node.elements]
        if any(p is None for p in parts):
            return None
        return "[" + ", ".join(p for p in parts if p is not None) + "]"
    return None


def constant_calls(ast: CheckedAst) -> list[tuple[Expr, str]]:
    """Calls the API server evaluates at compile time, as (node, standalone CEL text)."""
    out: list[tuple[Expr, str]] = []
    for node in ast.nodes():
        if node.kind != CALL:
            continue
        if node.function in _CONVERSIONS and node.target is None and len(node.args) == 1:
            arg = literal(node.args[0], ast.types)
            if arg is not None:
                out.append((node, f"{node.function}({arg})"))
    # In source order, so that a bounded caller looks at the first ones.
    return sorted(out, key=lambda item: ast.positions.get(item[0].id, 0))


def regex_error(ast: CheckedAst) -> str | None:
    """cel-go compiles a literal `matches` pattern with RE2 when it builds the program."""
    for node in ast.nodes():
        if node.kind != CALL or node.function != "matches" or not node.args:
            continue
        pattern = node.args[-1]
        if pattern.kind != CONST or not isinstance(pattern.value, str):
            continue
        if not regex_valid(pattern.value):
            return _Typer(ast).message(node, "invalid matches argument")
    return None


# ---- estimates Kubernetes cannot bound ----------------------------------------------------------
# Kubernetes' cost estimator charges string traversals by the size of the strings; for the
# elements of a list built from literals or split() it has no size, so the estimate is unbounded
# and the selector is refused as too complex. Type values have no size either.

_LIST_SCANS = frozenset({"indexOf", "lastIndexOf", "isSorted", "sum", "max", "min", "includes"})
_TYPE_NAMES = frozenset({
    "int", "uint", "double", "string", "bytes", "bool", "map", "list", "null_type", "type",
    "google.protobuf.Duration", "google.protobuf.Timestamp",
})


def _string_list(node: Expr) -> bool:
    if node.kind == LIST:
        elements = node.elements
        return bool(elements) and all(e.kind == CONST and isinstance(e.value, str) for e in elements)
    return node.kind == CALL and node.function == "split" and node.target is not None


def _type_value(node: Expr) -> bool:
    if node.kind == CALL and node.function == "type" and node.target is None:
        return True
    return node.kind == IDENT and node.name in _TYPE_NAMES


def unbounded_cost(ast: CheckedAst) -> str | None:
    """Why Kubernetes' estimate for this selector is unbounded, or None."""
    for node in ast.nodes():
        if node.kind != CALL:
            continue
        if node.function in _LIST_SCANS and node.target is not None and node.target.kind != CONST \
                and _string_list(node.target):
            return f"{node.function}() over a list of strings whose sizes are unknown"
        if node.function in _EQUALITY and any(_type_value(a) for a in node.args):
            return "comparing type values, which have no size"
    return None
