"""What a checked selector reads from `device`, and what it may cost.

The matcher uses `Analysis.accesses` to group devices by the values an expression can see; when
the expression uses `device`, `device.attributes`, `device.capacity` or a domain map in any way
other than constant lookups (iteration, `size()`, computed keys), `dynamic` is set and callers fall
back to the full device. The linter uses the same walk for attribute names, comparisons and the
driver guard.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from .ast import CALL, COMPREHENSION, CONST, IDENT, LIST, SELECT, STRUCT, CheckedAst, Expr

DEVICE_FIELDS = frozenset({"driver", "attributes", "capacity", "allowMultipleAllocations"})
COMPARISON_SYMBOLS = {"_==_": "==", "_!=_": "!=", "_<_": "<", "_<=_": "<=", "_>_": ">", "_>=_": ">="}
COMPARISONS = frozenset(COMPARISON_SYMBOLS)

# Sizes the cost model assumes for data it cannot see: at most 32 attributes+capacities per device
# and 64 characters per string value (Kubernetes validation limits).
MAX_MAP_ENTRIES = 32
MAX_STRING = 64
UNKNOWN_LIST = 64
MAX_COST = 1_000_000


@dataclass(frozen=True, slots=True)
class Ref:
    """What a sub-expression denotes in terms of the device.

    level: "device" | "root" (device.attributes / device.capacity) | "domain" | "value" | "driver".
    """

    level: str
    kind: str = ""  # "attributes" | "capacity"
    domain: str = ""
    name: str = ""


DEVICE = Ref("device")
DRIVER = Ref("driver")


@dataclass(frozen=True, slots=True)
class Access:
    """A constant lookup `device.<kind>[domain][name]` (or `.name`, `has(...)`, `'name' in ...`)."""

    kind: str
    domain: str
    name: str
    node_id: int
    presence: bool
    indexed: bool


@dataclass(frozen=True, slots=True)
class Comparison:
    """`<value access> <op> <constant>` (either order), for type checks against the schema."""

    op: str
    access: Access
    constant: object
    constant_node: int
    node_id: int


@dataclass(frozen=True, slots=True)
class Conversion:
    """`semver(<access>)` / `quantity(<access>)`: converting a value that already has that type."""

    function: str
    access: Access
    node_id: int


@dataclass(slots=True)
class Analysis:
    accesses: list[Access] = field(default_factory=list)
    unknown_fields: list[tuple[str, int]] = field(default_factory=list)
    reads_driver: bool = False
    dynamic: bool = False
    # Drivers named by a `device.driver == '...'` (or `in [...]`) conjunct at the top level.
    driver_guards: set[str] = field(default_factory=set)
    string_constants: set[str] = field(default_factory=set)
    comparisons: list[Comparison] = field(default_factory=list)
    conversions: list[Conversion] = field(default_factory=list)
    cost: int = 0
    # What the whole expression denotes when it is a piece of the device (e.g. a capacity value).
    root: Ref | None = None

    @property
    def visible_keys(self) -> tuple[tuple[str, str, str], ...]:
        """(kind, domain, name) the expression reads, sorted and unique."""
        return tuple(sorted({(a.kind, a.domain, a.name) for a in self.accesses}))


def analyse(ast: CheckedAst) -> Analysis:
    result = Analysis()
    walker = _Walker(result)
    result.root = walker.visit(ast.expr, {})
    _driver_guards(ast.expr, result)
    result.cost = estimate_cost(ast.expr)
    return result


class _Walker:
    def __init__(self, result: Analysis) -> None:
        self.out = result
        self._access_by_node: dict[int, Access] = {}

    def consume(self, ref: Ref | None) -> None:
        """A device-level reference used as an ordinary value: the expression sees all of it."""
        if ref is not None and ref.level in ("device", "root", "domain"):
            self.out.dynamic = True

    def record(self, kind: str, domain: str, name: str, node: Expr, *, presence: bool, indexed: bool) -> Ref:
        access = Access(kind, domain, name, node.id, presence, indexed)
        self.out.accesses.append(access)
        self._access_by_node[node.id] = access
        return Ref("value", kind, domain, name)

    def visit(self, node: Expr, scope: Mapping[str, Ref | None]) -> Ref | None:
        kind = node.kind
        if kind == CONST:
            if isinstance(node.value, str):
                self.out.string_constants.add(node.value)
            return None
        if kind == IDENT:
            if node.name in scope:
                return scope[node.name]
            return DEVICE if node.name == "device" else None
        if kind == SELECT:
            return self._select(node, scope)
        if kind == CALL:
            return self._call(node, scope)
        if kind == COMPREHENSION:
            return self._comprehension(node, scope)
        if kind in (LIST, STRUCT):
            for child in node.children():
                self.consume(self.visit(child, scope))
            return None
        return None

    def _select(self, node: Expr, scope: Mapping[str, Ref | None]) -> Ref | None:
        assert node.operand is not None
        op = self.visit(node.operand, scope)
        if op is None or op.level in ("value", "driver"):
            return None
        if op.level == "device":
            if node.field not in DEVICE_FIELDS:
                self.out.unknown_fields.append((node.field, node.id))
                return None
            if node.test_only:
                return None
            if node.field == "driver":
                self.out.reads_driver = True
                return DRIVER
            if node.field in ("attributes", "capacity"):
                return Ref("root", node.field)
            # allowMultipleAllocations: not part of the internal device form; read the whole device.
            self.out.dynamic = True
            return None
        if op.level == "root":
            if node.test_only:
                # has(device.attributes.d) depends on which domains exist.
                self.out.dynamic = True
                return None
            return Ref("domain", op.kind, node.field)
        # op.level == "domain"
        ref = self.record(op.kind, op.domain, node.field, node, presence=node.test_only, indexed=False)
        return None if node.test_only else ref

    def _call(self, node: Expr, scope: Mapping[str, Ref | None]) -> Ref | None:
        fn = node.function
        args = node.args
        if fn == "_[_]" and len(args) == 2 and node.target is None:
            base = self.visit(args[0], scope)
            key = args[1]
            key_ref = self.visit(key, scope)
            self.consume(key_ref)
            if key.kind == CONST and isinstance(key.value, str) and base is not None:
                if base.level == "root":
                    return Ref("domain", base.kind, key.value)
                if base.level == "domain":
                    return self.record(base.kind, base.domain, key.value, node, presence=False, indexed=True)
            self.consume(base)
            return None
        if fn == "@in" and len(args) == 2 and node.target is None:
            key = args[0]
            self.consume(self.visit(key, scope))
            container = self.visit(args[1], scope)
            if container is not None and container.level == "domain" and key.kind == CONST \
                    and isinstance(key.value, str):
                self.record(container.kind, container.domain, key.value, node, presence=True, indexed=True)
                return None
            self.consume(container)
            return None
        refs: list[Ref | None] = []
        if node.target is not None:
            target_ref = self.visit(node.target, scope)
            self.consume(target_ref)
            refs.append(target_ref)
        for arg in args:
            ref = self.visit(arg, scope)
            self.consume(ref)
            refs.append(ref)
        if fn in COMPARISONS and len(args) == 2:
            for value_node, const_node in ((args[0], args[1]), (args[1], args[0])):
                access = self._access_by_node.get(value_node.id)
                if access is not None and const_node.kind == CONST:
                    self.out.comparisons.append(
                        Comparison(fn, access, const_node.value, const_node.id, node.id)
                    )
        if fn in ("semver", "quantity") and node.target is None and args:
            access = self._access_by_node.get(args[0].id)
            if access is not None:
                self.out.conversions.append(Conversion(fn, access, node.id))
        return None

    def _comprehension(self, node: Expr, scope: Mapping[str, Ref | None]) -> Ref | None:
        assert node.accu_init is not None and node.result is not None
        is_bind = (
            node.iter_range is not None and node.iter_range.kind == LIST and not node.iter_range.elements
            and node.loop_condition is not None and node.loop_condition.kind == CONST
            and node.loop_condition.value is False
        )
        if is_bind:
            # cel.bind(name, init, body): `name` is an alias for init inside body.
            alias = self.visit(node.accu_init, scope)
            inner = dict(scope)
            inner[node.accu_var] = alias
            if node.loop_step is not None:
                self.visit(node.loop_step, inner)
            return self.visit(node.result, inner)
        if node.iter_range is not None:
            self.consume(self.visit(node.iter_range, scope))
        self.consume(self.visit(node.accu_init, scope))
        inner = dict(scope)
        for name in (node.iter_var, node.iter_var2, node.accu_var):
            if name:
                inner[name] = None
        for child in (node.loop_condition, node.loop_step):
            if child is not None:
                self.consume(self.visit(child, inner))
        self.consume(self.visit(node.result, inner))
        return None


def _conjuncts(node: Expr) -> list[Expr]:
    if node.kind == CALL and node.function == "_&&_" and node.target is None:
        out: list[Expr] = []
        for arg in node.args:
            out.extend(_conjuncts(arg))
        return out
    return [node]


def _is_driver(node: Expr) -> bool:
    return (
        node.kind == SELECT and not node.test_only and node.field == "driver"
        and node.operand is not None and node.operand.kind == IDENT and node.operand.name == "device"
    )


def _driver_guards(root: Expr, out: Analysis) -> None:
    for conjunct in _conjuncts(root):
        if conjunct.kind != CALL or len(conjunct.args) != 2:
            continue
        left, right = conjunct.args
        if conjunct.function == "_==_":
            for a, b in ((left, right), (right, left)):
                if _is_driver(a) and b.kind == CONST and isinstance(b.value, str):
                    out.driver_guards.add(b.value)
        elif conjunct.function == "@in" and _is_driver(left) and right.kind == LIST:
            values = [e.value for e in right.elements if e.kind == CONST and isinstance(e.value, str)]
            if len(values) == len(right.elements):
                out.driver_guards.update(str(v) for v in values)


# ---- cost estimate -------------------------------------------------------------------------------

_STRING_FUNCTIONS = frozenset({
    "contains", "startsWith", "endsWith", "matches", "lowerAscii", "upperAscii", "replace", "split",
    "substring", "trim", "indexOf", "lastIndexOf", "charAt", "join", "format", "quote", "reverse",
})


def _list_size(node: Expr, sizes: Mapping[str, int]) -> int:
    """Upper bound on the number of elements a list or map expression yields."""
    kind = node.kind
    if kind == LIST:
        return len(node.elements)
    if kind == STRUCT:
        return len(node.entries)
    if kind == IDENT:
        return sizes.get(node.name, UNKNOWN_LIST)
    if kind == CALL:
        if node.function == "_+_" and len(node.args) == 2:
            return _list_size(node.args[0], sizes) + _list_size(node.args[1], sizes)
        if node.function == "split":
            return MAX_STRING + 1
        if node.function in ("sort", "distinct", "reverse") and node.target is not None:
            return _list_size(node.target, sizes)
        if node.function == "slice" and node.target is not None:
            bounds = [a.value for a in node.args if a.kind == CONST and type(a.value) is int]
            whole = _list_size(node.target, sizes)
            return min(whole, max(0, bounds[1] - bounds[0])) if len(bounds) == 2 else whole
        if node.function == "lists.range" and node.args and node.args[0].kind == CONST \
                and type(node.args[0].value) is int:
            return max(0, node.args[0].value)
        if node.function == "_[_]" or node.function == "_?_:_":
            if node.function == "_?_:_" and len(node.args) == 3:
                return max(_list_size(node.args[1], sizes), _list_size(node.args[2], sizes))
            return MAX_MAP_ENTRIES
        return UNKNOWN_LIST
    if kind == SELECT:
        return MAX_MAP_ENTRIES
    if kind == COMPREHENSION:
        # map()/filter() yield at most one element per element of their range; cel.bind yields its body.
        if node.iter_range is not None and node.iter_range.kind == LIST and not node.iter_range.elements \
                and node.result is not None:
            inner = dict(sizes)
            if node.accu_init is not None:
                inner[node.accu_var] = _list_size(node.accu_init, sizes)
            return _list_size(node.result, inner)
        return _list_size(node.iter_range, sizes) if node.iter_range is not None else 0
    return UNKNOWN_LIST


def _string_len(node: Expr) -> int:
    if node.kind == CONST and isinstance(node.value, str | bytes):
        return len(node.value)
    return MAX_STRING


# Calls whose cel-go cost is one unit plus their operands when the operands are numbers or bools
# (equality and ordering of strings and lists are charged by size there).
_FLAT_CALLS = frozenset({
    "_+_", "_-_", "_*_", "_/_", "_%_", "-_", "!_", "_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_",
    "@not_strictly_false", "_&&_", "_||_", "_?_:_",
})
_FLAT_TYPES = frozenset({"int", "uint", "double", "bool"})


def cost_is_exact(ast: CheckedAst) -> bool:
    """True when `estimate_cost` is cel-go's estimate exactly: comprehensions over literal lists,
    literals, variables, and arithmetic, comparisons and logic on numbers and bools.

    Checked against the API server's own estimate on the differential corpus; for anything else
    the estimate is only an approximation (see COST_MARGIN in env.py).
    """
    for node in ast.nodes():
        if node.kind in (CONST, IDENT):
            continue
        if node.kind == LIST:
            if not all(e.kind == CONST for e in node.elements):
                return False
            continue
        if node.kind == COMPREHENSION:
            if node.iter_range is None or node.iter_range.kind != LIST or node.iter_var2:
                return False
            continue
        if node.kind != CALL or node.target is not None or node.function not in _FLAT_CALLS:
            return False
        if node.function in ("_+_", "_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_") and any(
                ast.types.get(a.id) not in _FLAT_TYPES for a in node.args):
            return False
    return True


def estimate_cost(node: Expr, sizes: Mapping[str, int] | None = None) -> int:
    """Static cost estimate in the spirit of Kubernetes' CEL estimator.

    One unit per call, selection and variable lookup; string functions add a tenth of a unit per
    character; a comprehension costs its range plus (condition + step) for every element. Sizes
    are exact for literals and bounded by the DRA device limits for device data (32 entries per map,
    64 characters per string); concatenations, map()/filter() results and cel.bind variables carry
    their bounds along. The API server uses its own estimator; this one exists to reject
    expressions that are far over the limit.
    """
    scope: Mapping[str, int] = sizes or {}
    kind = node.kind
    if kind == CONST:
        return 0
    if kind == IDENT:
        return 1
    if kind == SELECT:
        assert node.operand is not None
        return 1 + estimate_cost(node.operand, scope)
    if kind == CALL:
        if node.function in ("_&&_", "_||_") and node.target is None:
            # cel-go charges a logical operator nothing beyond its operands.
            return sum(estimate_cost(a, scope) for a in node.args)
        if node.function == "_?_:_" and len(node.args) == 3:
            return estimate_cost(node.args[0], scope) + max(estimate_cost(a, scope) for a in node.args[1:])
        cost = 1 + sum(estimate_cost(a, scope) for a in node.args)
        if node.target is not None:
            cost += estimate_cost(node.target, scope)
        if node.function in _STRING_FUNCTIONS:
            lengths = [_string_len(a) for a in node.args]
            if node.target is not None:
                lengths.append(_string_len(node.target))
            if node.function == "matches":
                # Regex matching is roughly input length times pattern length.
                cost += math.ceil(math.prod(lengths) / 10) if lengths else 0
            else:
                cost += math.ceil(sum(lengths) / 10)
        return cost
    if kind in (LIST, STRUCT):
        return 10 + sum(estimate_cost(c, scope) for c in node.children())
    if kind == COMPREHENSION:
        assert node.accu_init is not None and node.result is not None
        size = _list_size(node.iter_range, scope) if node.iter_range is not None else 0
        inner = dict(scope)
        inner[node.accu_var] = _list_size(node.accu_init, scope)
        for name in (node.iter_var, node.iter_var2):
            if name:
                inner.pop(name, None)
        per_item = sum(
            estimate_cost(c, inner) for c in (node.loop_condition, node.loop_step) if c is not None
        )
        range_cost = estimate_cost(node.iter_range, scope) if node.iter_range is not None else 0
        return (range_cost + estimate_cost(node.accu_init, scope) + size * per_item
                + estimate_cost(node.result, inner))
    return 1
