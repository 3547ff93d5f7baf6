"""Selectors the API server accepts that can never select a device.

Kubernetes compiles a selector without knowing what devices publish: `productName > 5`,
`memory.compareTo(quantity('40GiB')) >= 0` or `type == 'gpu' && type == 'mig'` are valid there,
and the scheduler then fails or answers false on every device. This module proves that from the
selector and what drivers publish, without an inventory:

- **always**, whatever the devices: a part the selector always evaluates that fails on constants
  (`quantity('40GiB')`, `semver('1.2')`, `1 / 0`), `compareTo()` compared with a value it never
  returns (it returns -1, 0 or 1), conjuncts that contradict each other on one value
  (`x == 'a' && x == 'b'`, `x > 5 && x < 3`, `device.driver` pinned to two drivers), an ordering
  of values of different kinds;
- **by the driver's schema** (`webhook/dra/drivers`): a value of the wrong type for the attribute
  (`productName == 1`, `driverVersion.startsWith('5')`), a name the schema does not publish, a
  domain the pinned driver does not publish, an attribute the pinned device type never has
  (`type == 'gpu' && profile == '1g.10gb'`), a `type` value the driver never publishes, a negative
  capacity.

"A part the selector always evaluates" is one reached from a conjunct (a term of the top-level
`&&`) only through operators and calls that fail when an operand fails: not through the other
side of `&&`, `||`, the branches of `? :` or a comprehension's body, which can absorb a failure.
A conjunct that fails or is false makes the selector false, so one such part is enough; both
sides of an `||` (and both branches of `? :`) must be.

The analysis is sound, not complete: where it cannot tell (a value it cannot read statically, a
function it does not model, more work than `MAX_STEPS`), it says nothing. Its work is bounded by
the size of the selector, except for the constant parts it evaluates (at most `MAX_EVALUATIONS`
per selector, each a small compile). Pure module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction

from ..dra.quantity import Quantity
from ..dra.semver import Semver, coerce_semver
from .analysis import Access
from .ast import CALL, COMPREHENSION, CONST, IDENT, LIST, SELECT, STRUCT, CheckedAst, Expr
from .fold import string_literal

MAX_STEPS = 2000
"""Conjunct visits per selector; past it the analysis gives up (says nothing)."""
MAX_EVALUATIONS = 6
"""Constant parts evaluated by the runtime per selector (each a compile of a few characters)."""
MAX_CANDIDATES = 64
"""Values of one `in [...]` list the contradiction check tries."""

NO_MATCH = "cel/no-match"
UNKNOWN = "cel/unknown-attribute"

Family = str  # "num" | "str" | "bool" | "ver" | "qty"
_ATTR_FAMILY = {"string": "str", "int": "num", "bool": "bool", "version": "ver", "quantity": "qty"}
_FAMILY_WORD = {
    "num": "a number",
    "str": "a string",
    "bool": "a bool",
    "ver": "a Semver",
    "qty": "a Quantity",
}


@dataclass(frozen=True, slots=True)
class Val:
    """A constant of a known kind: numbers (int, uint, double) compare with each other, as in CEL."""

    family: Family
    value: object
    text: str

    def compare(self, other: Val) -> int | None:
        """-1/0/1, or None when the two are not ordered against each other (another kind)."""
        if self.family != other.family:
            return None
        a, b = self.value, other.value
        if self.family in ("ver", "qty"):
            assert isinstance(a, Semver | Quantity) and isinstance(b, Semver | Quantity)
            return a.compare(b)  # type: ignore[arg-type]  # one family: two values of one type
        if a == b:
            return 0
        return -1 if a < b else 1  # type: ignore[operator]


@dataclass(frozen=True, slots=True)
class Reason:
    """Why the selector never selects a device.

    `known`: the linter's name and type checks already report it (it is not repeated).
    `basis`: "always" (any device) or "schema" (devices as their driver's schema describes them).
    """

    check: str
    message: str
    fix: str
    node_id: int | None
    basis: str
    known: bool = False
    access: Access | None = None


@dataclass(frozen=True, slots=True)
class SchemaView:
    """What the analysis may assume about devices, from the driver schema serving the cluster.

    `spec(kind, domain, name)`: the (type, device types) of a published name, or None;
    `schema_domain(domain)`: whether the schema describes the names of that domain;
    `driver_domains(driver, kind)`: the domains that driver's devices publish, None when unknown;
    `type_values(domain)`: the values the domain's `type` attribute takes (its device types);
    `reported(access)`: whether the linter has already reported that lookup.
    """

    spec: Callable[[str, str, str], tuple[str, frozenset[str]] | None]
    schema_domain: Callable[[str], bool]
    driver_domains: Callable[[str, str], frozenset[str] | None]
    type_values: Callable[[str], frozenset[str] | None]
    reported: Callable[[Access], bool]
    evaluate: Callable[[str], str | None] | None = None
    """`evaluate(text)`: the runtime's error for a constant CEL expression, None when it has a value
    (or when it cannot be told); without it only semver() and quantity() literals are checked."""


# ---- printing ------------------------------------------------------------------------------------

_BINARY = {
    "_==_": "==",
    "_!=_": "!=",
    "_<_": "<",
    "_<=_": "<=",
    "_>_": ">",
    "_>=_": ">=",
    "_+_": "+",
    "_-_": "-",
    "_*_": "*",
    "_/_": "/",
    "_%_": "%",
    "_&&_": "&&",
    "_||_": "||",
    "@in": "in",
}
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_NOT_PRINTABLE = frozenset({"_?._", "_[?_]", "@not_strictly_false", "cel.@mapInsert", "cel.@block"})


def _string(value: str, display: bool) -> str:
    if display:
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"
    return string_literal(value)


def unparse(node: Expr, types: dict[int, str], *, display: bool = False, depth: int = 0) -> str | None:
    """CEL text for a node (fully parenthesised unless `display`), None for what it cannot print."""
    if depth > 40:
        return None

    def sub(n: Expr | None) -> str | None:
        return None if n is None else unparse(n, types, display=display, depth=depth + 1)

    def wrap(text: str) -> str:
        return text if display else f"({text})"

    kind = node.kind
    if kind == CONST:
        value = node.value
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            if types.get(node.id) == "uint":
                return f"{value}u"
            return str(value) if value >= 0 else (f"({value})" if value > -(2**63) else None)
        if isinstance(value, float):
            if not math.isfinite(value):
                return None
            text = repr(abs(value))
            text = text if ("e" in text or "." in text) else text + ".0"
            return f"(-{text})" if math.copysign(1.0, value) < 0 else text
        if isinstance(value, str):
            return _string(value, display)
        if isinstance(value, bytes):
            return 'b"' + "".join(f"\\x{b:02x}" for b in value) + '"'
        return None
    if kind == IDENT:
        return node.name
    if kind == SELECT:
        operand = sub(node.operand)
        if operand is None:
            return None
        return f"has({operand}.{node.field})" if node.test_only else f"{operand}.{node.field}"
    if kind == LIST:
        parts = [sub(e) for e in node.elements]
        return None if any(p is None for p in parts) else "[" + ", ".join(p for p in parts if p) + "]"
    if kind == STRUCT:
        entries: list[str] = []
        for entry in node.entries:
            if entry.key is None or entry.value is None:
                return None
            key, value = sub(entry.key), sub(entry.value)
            if key is None or value is None:
                return None
            entries.append(f"{key}: {value}")
        return "{" + ", ".join(entries) + "}"
    if kind == CALL:
        fn = node.function
        if fn in _NOT_PRINTABLE:
            return None
        args = [sub(a) for a in node.args]
        if any(a is None for a in args):
            return None
        texts = [a for a in args if a is not None]
        if node.target is None and fn in _BINARY and len(texts) == 2:
            return wrap(f"{texts[0]} {_BINARY[fn]} {texts[1]}")
        if node.target is None and fn == "_[_]" and len(texts) == 2:
            return f"{texts[0]}[{texts[1]}]"
        if node.target is None and fn in ("!_", "-_") and len(texts) == 1:
            inner = node.args[0]
            grouped = display and inner.kind == CALL and inner.target is None and inner.function in _BINARY
            return wrap(f"{fn[0]}({texts[0]})" if grouped else f"{fn[0]}{texts[0]}")
        if node.target is None and fn == "_?_:_" and len(texts) == 3:
            return wrap(f"{texts[0]} ? {texts[1]} : {texts[2]}")
        if not (fn[:1].isalpha() or fn[:1] == "_") or (fn.startswith("_") and fn.endswith("_")):
            return None
        if node.target is not None:
            target = sub(node.target)
            return None if target is None else f"{target}.{fn}({', '.join(texts)})"
        return f"{fn}({', '.join(texts)})"
    if kind == COMPREHENSION and display:
        return "(...)"
    return None


def _show(node: Expr, types: dict[int, str], limit: int = 100) -> str:
    text = unparse(node, types, display=True) or "(this part)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- constants -----------------------------------------------------------------------------------


def _literal_string(node: Expr | None) -> str | None:
    if node is not None and node.kind == CONST and isinstance(node.value, str):
        return node.value
    return None


def _semver_literal(node: Expr) -> Semver | str | None:
    """semver('x') / semver('x', true): the version, the error text, or None when not that shape."""
    if node.kind != CALL or node.function != "semver" or node.target is not None or not node.args:
        return None
    text = _literal_string(node.args[0])
    if text is None:
        return None
    normalize = False
    if len(node.args) == 2:
        flag = node.args[1]
        if flag.kind != CONST or not isinstance(flag.value, bool):
            return None
        normalize = flag.value
    try:
        version = Semver.parse(coerce_semver(text) if normalize else text)
    except ValueError as exc:
        return str(exc) or f"invalid semver {text!r}"
    if max(version.major, version.minor, version.patch) > 2**63 - 1:
        return f"invalid semver {text!r}: a version number exceeds the int64 range"
    return version


def _quantity_literal(node: Expr) -> Quantity | str | None:
    if node.kind != CALL or node.function != "quantity" or node.target is not None or len(node.args) != 1:
        return None
    text = _literal_string(node.args[0])
    if text is None:
        return None
    try:
        return Quantity.parse(text)
    except ValueError as exc:
        return str(exc) or f"invalid quantity {text!r}"


def const_value(node: Expr, types: dict[int, str]) -> Val | None:
    """The node as a typed constant, None when it is not a literal (or semver()/quantity() of one)."""
    shown = _show(node, types)
    if node.kind == CONST:
        value = node.value
        if isinstance(value, bool):
            return Val("bool", value, shown)
        if isinstance(value, int):
            return Val("num", value, shown)
        if isinstance(value, float) and math.isfinite(value):
            return Val("num", Fraction(value), shown)
        if isinstance(value, str):
            return Val("str", value, shown)
        return None
    version = _semver_literal(node)
    if isinstance(version, Semver):
        return Val("ver", version, shown)
    quantity = _quantity_literal(node)
    if isinstance(quantity, Quantity):
        return Val("qty", quantity, shown)
    return None


def _is_constant(node: Expr, memo: dict[int, bool]) -> bool:
    """No device, no variable, no comprehension: the same value (or failure) wherever it stands."""
    hit = memo.get(node.id)
    if hit is not None:
        return hit
    if node.kind == CONST:
        result = True
    elif node.kind in (IDENT, COMPREHENSION) or (node.kind == CALL and node.function in _NOT_PRINTABLE):
        result = False
    else:
        result = all(_is_constant(c, memo) for c in node.children())
    memo[node.id] = result
    return result


# ---- what a part always evaluates ------------------------------------------------------------------

_NON_STRICT = frozenset(
    {
        "_&&_",
        "_||_",
        "@not_strictly_false",
        "or",
        "orValue",
        "hasValue",
        "value",
        "optional.of",
        "optional.ofNonZeroValue",
        "optional.none",
        "_?._",
        "_[?_]",
    }
)


def _is_bind(node: Expr) -> bool:
    return (
        node.kind == COMPREHENSION
        and node.iter_range is not None
        and node.iter_range.kind == LIST
        and not node.iter_range.elements
        and node.loop_condition is not None
        and node.loop_condition.kind == CONST
        and node.loop_condition.value is False
    )


def strict_parts(node: Expr) -> Iterator[Expr]:
    """`node` and every part whose failure makes `node` fail (see the module docstring)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if current.kind == CALL:
            fn = current.function
            if fn in _NON_STRICT or fn.startswith("optional."):
                continue
            if fn == "_?_:_":
                stack.extend(current.args[:1])
                continue
            if current.target is not None:
                stack.append(current.target)
            stack.extend(current.args)
        elif current.kind == SELECT:
            if current.operand is not None:
                stack.append(current.operand)
        elif current.kind in (LIST, STRUCT):
            stack.extend(current.children())
        elif current.kind == COMPREHENSION:
            if _is_bind(current):
                # cel.bind evaluates its value lazily (only where the body uses it); the body always.
                if current.result is not None:
                    stack.append(current.result)
            else:
                # The range and the initial value always; the body only per element.
                stack.extend(c for c in (current.iter_range, current.accu_init) if c is not None)


# ---- atoms: what one conjunct says about one value -------------------------------------------------

Subject = tuple[str, str, str]  # (kind, domain, name) of an attribute/capacity, or ("driver", "", "")
DRIVER: Subject = ("driver", "", "")


@dataclass(frozen=True, slots=True)
class Atom:
    subject: Subject
    op: str  # == != < <= > >= in
    values: tuple[Val, ...]
    text: str  # how to name it in a message
    node_id: int | None = None
    basis: str = "always"


_STRING_TESTS = {"startsWith": "startswith", "endsWith": "endswith", "contains": "__contains__"}


def _holds(atom: Atom, value: Val) -> bool:
    """Whether the atom may hold when the subject equals `value` (False only when it surely cannot)."""
    if atom.op == "in":
        return any(value.compare(v) == 0 for v in atom.values)
    if atom.op == "absent":
        return False  # the subject has a value, so it is there
    other = atom.values[0]
    if atom.op in _STRING_TESTS:
        if value.family != "str" or other.family != "str":
            return False  # no such overload: the call fails
        assert isinstance(value.value, str) and isinstance(other.value, str)
        return bool(getattr(value.value, _STRING_TESTS[atom.op])(other.value))
    order = value.compare(other)
    if atom.op in ("==", "is"):
        return order == 0
    if atom.op == "!=":
        # Versions of equal precedence may still differ (build metadata): not surely equal.
        return order != 0 or (value.family == "ver" and str(value.value) != str(other.value))
    if order is None:
        return False  # an ordering across kinds fails
    return {"<": order < 0, "<=": order <= 0, ">": order > 0, ">=": order >= 0}.get(atom.op, True)


def _contradiction(atoms: list[Atom], integral: bool) -> list[Atom] | None:
    """The atoms (of one subject) that cannot hold together, None when they can (or when unsure)."""
    equal = [a for a in atoms if a.op in ("==", "in", "is")]
    if equal:
        first = equal[0]
        candidates = list(first.values[:MAX_CANDIDATES])
        if len(first.values) > MAX_CANDIDATES:
            return None
        for candidate in candidates:
            if all(_holds(a, candidate) for a in atoms):
                return None
        # Name the atoms that ruled the candidates out: the first one and those that failed.
        culprits = [first] + [
            a for a in atoms if a is not first and any(not _holds(a, c) for c in candidates)
        ]
        return culprits
    ordered = [a for a in atoms if a.op in ("<", "<=", ">", ">=")]
    if not ordered:
        return None
    families = {a.values[0].family for a in ordered}
    if len(families) > 1:
        # A value is never ordered against both a number and a string (the comparison fails).
        return ordered
    lower: tuple[Val, bool, Atom] | None = None
    upper: tuple[Val, bool, Atom] | None = None
    for atom in ordered:
        value = atom.values[0]
        strict = atom.op in ("<", ">")
        if atom.op in (">", ">="):
            order = None if lower is None else value.compare(lower[0])
            if lower is None or (order is not None and (order > 0 or (order == 0 and strict))):
                lower = (value, strict, atom)
        else:
            order = None if upper is None else value.compare(upper[0])
            if upper is None or (order is not None and (order < 0 or (order == 0 and strict))):
                upper = (value, strict, atom)
    if lower is None or upper is None:
        return None
    order = lower[0].compare(upper[0])
    if order is None:
        return None
    if order > 0 or (order == 0 and (lower[1] or upper[1])):
        return [lower[2], upper[2]]
    family = lower[0].family
    if family == "num" and integral:
        lo, hi = Fraction(str(lower[0].value)), Fraction(str(upper[0].value))
        low_int = math.floor(lo) + 1 if lower[1] else math.ceil(lo)
        high_int = math.ceil(hi) - 1 if upper[1] else math.floor(hi)
        if low_int > high_int:
            return [lower[2], upper[2]]
        if high_int - low_int < 8:
            excluded = [a for a in atoms if a.op == "!="]
            if all(
                any(not _holds(a, Val("num", n, str(n))) for a in excluded)
                for n in range(low_int, high_int + 1)
            ):
                return [lower[2], upper[2], *excluded]
    return None


# ---- the analysis ---------------------------------------------------------------------------------

_COMPARISONS = {"_==_": "==", "_!=_": "!=", "_<_": "<", "_<=_": "<=", "_>_": ">", "_>=_": ">="}
_STRING_METHODS = frozenset(
    {
        "contains",
        "startsWith",
        "endsWith",
        "matches",
        "lowerAscii",
        "upperAscii",
        "trim",
        "split",
        "substring",
        "charAt",
        "replace",
        "find",
        "findAll",
        "size",
    }
)
_SEMVER_METHODS = frozenset({"major", "minor", "patch"})
_ORDER_METHODS = frozenset({"compareTo", "isGreaterThan", "isLessThan"})
_QUANTITY_METHODS = frozenset({"add", "sub", "asInteger", "isInteger", "asApproximateFloat"})
_STRING_FUNCTIONS = frozenset(
    {"semver", "quantity", "isSemver", "isQuantity", "ip", "cidr", "url", "isIP", "isCIDR", "isURL", "size"}
)


@dataclass(slots=True)
class _Analyzer:
    ast: CheckedAst
    view: SchemaView
    accesses: dict[int, Access]
    steps: int = 0
    evaluations: int = 0
    constant: dict[int, bool] = field(default_factory=dict)
    errors: dict[int, str | None] = field(default_factory=dict)
    covered: set[int] = field(default_factory=set)  # parts of a constant already evaluated

    # -- subjects and types --
    def subject(self, node: Expr) -> tuple[Subject, Access | None] | None:
        if (
            node.kind == SELECT
            and not node.test_only
            and node.field == "driver"
            and node.operand is not None
            and node.operand.kind == IDENT
            and node.operand.name == "device"
        ):
            return DRIVER, None
        access = self.accesses.get(node.id)
        if access is None or access.presence:
            return None
        return (access.kind, access.domain, access.name), access

    def schema_type(self, subject: Subject) -> Family | None:
        if subject == DRIVER:
            return "str"
        if subject[0] == "capacity":
            return "qty"  # a capacity is a Quantity, whatever the schema says
        spec = self.view.spec(*subject)
        return None if spec is None else _ATTR_FAMILY.get(spec[0])

    def show(self, node: Expr) -> str:
        return _show(node, self.ast.types)

    # -- atoms --
    def atoms_of(self, node: Expr) -> list[Atom]:
        types = self.ast.types
        negated = node.kind == CALL and node.function == "!_" and node.target is None and len(node.args) == 1
        bare = node.args[0] if negated else node
        found = self.subject(bare)
        if found is not None and found[0] != DRIVER:
            # A bool attribute as a condition: it must be true (false under `!`).
            return [
                Atom(
                    found[0],
                    "is",
                    (Val("bool", not negated, "false" if negated else "true"),),
                    f"`{self.show(node)}`",
                    node.id,
                )
            ]
        if negated and bare.kind in (SELECT, CALL):
            access = self.accesses.get(bare.id)
            if access is not None and access.presence:
                # `!has(x)`: x is absent, so reading it fails.
                subject = (access.kind, access.domain, access.name)
                return [Atom(subject, "absent", (), f"`{self.show(node)}`", node.id)]
        if (
            node.kind == CALL
            and node.target is not None
            and node.function in _STRING_TESTS
            and len(node.args) == 1
        ):
            found = self.subject(node.target)
            value = const_value(node.args[0], types)
            if found is not None and value is not None and value.family == "str":
                return [Atom(found[0], node.function, (value,), f"`{self.show(node)}`", node.id)]
        if node.kind != CALL or node.target is not None:
            return self.order_method_atoms(node)
        op = _COMPARISONS.get(node.function)
        if op is not None and len(node.args) == 2:
            left, right = node.args
            for a, b, o in ((left, right, op), (right, left, _FLIP[op])):
                found = self.subject(a)
                value = const_value(b, types)
                if (
                    found is not None
                    and value is not None
                    and (o in ("==", "!=") or value.family in ("num", "str", "bool"))
                ):
                    return [Atom(found[0], o, (value,), f"`{self.show(node)}`", node.id)]
            compare = self.compare_to_atoms(node, op)
            if compare is not None:
                return compare
        if node.function == "@in" and len(node.args) == 2 and node.args[1].kind == LIST:
            found = self.subject(node.args[0])
            values = [const_value(e, types) for e in node.args[1].elements]
            if found is not None and all(v is not None for v in values):
                return [
                    Atom(
                        found[0],
                        "in",
                        tuple(v for v in values if v is not None),
                        f"`{self.show(node)}`",
                        node.id,
                    )
                ]
        return []

    def order_method_atoms(self, node: Expr) -> list[Atom]:
        if (
            node.kind != CALL
            or node.target is None
            or node.function not in ("isGreaterThan", "isLessThan")
            or len(node.args) != 1
        ):
            return []
        op = ">" if node.function == "isGreaterThan" else "<"
        for a, b, o in ((node.target, node.args[0], op), (node.args[0], node.target, _FLIP[op])):
            found = self.subject(a)
            value = const_value(b, self.ast.types)
            if found is not None and value is not None and value.family in ("ver", "qty"):
                return [Atom(found[0], o, (value,), f"`{self.show(node)}`", node.id)]
        return []

    def compare_to_atoms(self, node: Expr, op: str) -> list[Atom] | None:
        """`s.compareTo(c) <op> k`: the relation it states between s and c (None: not that shape)."""
        types = self.ast.types
        for call, other, o in ((node.args[0], node.args[1], op), (node.args[1], node.args[0], _FLIP[op])):
            if (
                call.kind != CALL
                or call.function != "compareTo"
                or call.target is None
                or len(call.args) != 1
            ):
                continue
            if (
                other.kind != CONST
                or isinstance(other.value, bool)
                or not isinstance(other.value, int | float)
            ):
                continue
            k = other.value
            results = frozenset(r for r in (-1, 0, 1) if _compare_numbers(r, o, k))
            text = f"`{self.show(node)}`"
            if not results:
                return [Atom(("compareTo", "", ""), "in", (), text, node.id)]
            relation = {
                frozenset({-1}): "<",
                frozenset({0}): "==",
                frozenset({1}): ">",
                frozenset({-1, 0}): "<=",
                frozenset({0, 1}): ">=",
                frozenset({-1, 1}): "!=",
            }.get(results)
            if relation is None:
                return []
            for a, b, rel in (
                (call.target, call.args[0], relation),
                (call.args[0], call.target, _FLIP[relation]),
            ):
                found = self.subject(a)
                value = const_value(b, types)
                if found is not None and value is not None and value.family in ("ver", "qty"):
                    return [Atom(found[0], rel, (value,), text, node.id)]
            return []
        return None

    def implicit(self, subject: Subject) -> list[Atom]:
        """What the schema says of every value of `subject`."""
        out: list[Atom] = []
        if (
            subject[0] == "capacity"
            and self.view.schema_domain(subject[1])
            and self.view.spec(*subject) is not None
        ):
            zero = Val("qty", Quantity.parse("0"), "quantity('0')")
            out.append(
                Atom(
                    subject,
                    ">=",
                    (zero,),
                    "the driver's capacities (counts and sizes) are never negative",
                    None,
                    "schema",
                )
            )
        if subject[0] == "attributes" and subject[2] == "type":
            values = self.view.type_values(subject[1])
            if values:
                listed = " or ".join(f"'{v}'" for v in sorted(values))
                out.append(
                    Atom(
                        subject,
                        "in",
                        tuple(Val("str", v, f"'{v}'") for v in sorted(values)),
                        f"the driver publishes type {listed}",
                        None,
                        "schema",
                    )
                )
        family = self.schema_type(subject)
        if family is not None and subject != DRIVER and subject[0] == "attributes":
            out.append(
                Atom(
                    subject, "kind", (), f"'{subject[2]}' is {_FAMILY_WORD[family]} attribute", None, "schema"
                )
            )
        return out

    # -- contradictions --
    def contradiction(self, atoms: list[Atom]) -> Reason | None:
        by_subject: dict[Subject, list[Atom]] = {}
        for atom in atoms:
            if atom.subject == ("compareTo", "", ""):
                return Reason(
                    NO_MATCH,
                    f"compareTo() returns -1, 0 or 1, so {atom.text} is never true",
                    "compare the result with 0, e.g. `a.compareTo(b) >= 0` for a >= b",
                    atom.node_id,
                    "always",
                )
            by_subject.setdefault(atom.subject, []).append(atom)
        for subject, own in by_subject.items():
            extra = self.implicit(subject)
            kind = next((a for a in extra if a.op == "kind"), None)
            rules = [a for a in extra if a.op != "kind"]
            if kind is not None:
                family = self.schema_type(subject)
                # Equality only: an ordering or a string test of the wrong type fails, which
                # `misuse` explains with the operation's own words.
                wrong = next(
                    (
                        a
                        for a in own
                        if a.op in ("==", "in") and a.values and all(v.family != family for v in a.values)
                    ),
                    None,
                )
                if wrong is not None and family is not None:
                    access = self.accesses.get(self.access_node(wrong))
                    fix = _fix_for(family, access) if access else f"compare with {_FAMILY_WORD[family]}"
                    return Reason(
                        UNKNOWN,
                        f"{kind.text}, so {wrong.text} is never true (values of different types are never "
                        "equal)",
                        fix,
                        wrong.node_id,
                        "schema",
                        access is not None and self.view.reported(access),
                        access,
                    )
            for with_rules in (False, True):
                culprits = _contradiction(
                    own + (rules if with_rules else []), integral=subject[0] == "attributes"
                )
                if culprits is not None:
                    return self.contradiction_reason(subject, culprits, with_rules)
        return None

    def access_node(self, atom: Atom) -> int:
        node = self._node(atom.node_id)
        if node is None:
            return -1
        for part in node.walk():
            if part.id in self.accesses:
                return part.id
        return -1

    def _node(self, node_id: int | None) -> Expr | None:
        if node_id is None:
            return None
        return next((n for n in self.ast.nodes() if n.id == node_id), None)

    def contradiction_reason(self, subject: Subject, culprits: list[Atom], schema: bool) -> Reason:
        name = "device.driver" if subject == DRIVER else f"device.{subject[0]}['{subject[1]}'].{subject[2]}"
        said = [a.text for a in culprits if a.node_id is not None]
        rules = [a.text for a in culprits if a.node_id is None]
        parts = " and ".join(dict.fromkeys(said)) if said else "this"
        if any(a.op == "absent" for a in culprits):
            message = f"{parts} cannot all hold: the value is read where it is not published"
            fix = f"drop one of the conditions, or read it only where it exists: `!has({name}) || ...`"
        elif rules:
            message = f"{parts} cannot hold: {'; '.join(dict.fromkeys(rules))} ({name})"
            fix = "compare with a value the driver publishes (`draguard driver inventory` lists them)"
        else:
            message = f"{parts} cannot all hold for one device: {name} has one value"
            fix = (
                "to accept any of several values use `in` (e.g. `x in ['a', 'b']`) or `||`; "
                "a request for several devices of different kinds needs one request each"
            )
        node_id = next((a.node_id for a in reversed(culprits) if a.node_id is not None), None)
        return Reason(NO_MATCH, message, fix, node_id, "schema" if schema else "always")

    # -- leaves: parts that fail on every device --
    def pinned(self, atoms: list[Atom], subject: Subject) -> frozenset[str] | None:
        """The string values a subject can take under the atoms, None when not pinned to a set."""
        own = [a for a in atoms if a.subject == subject and a.op in ("==", "in")]
        if not own:
            return None
        values = {str(v.value) for v in own[0].values if v.family == "str"}
        for a in atoms:
            if a.subject != subject or not values:
                continue
            if a.op in ("==", "in") and all(v.family == "str" for v in a.values):
                # String equality is set membership: a 1,000-value `in` list against itself is one
                # intersection, not a million comparisons (a hostile selector's cost stays linear).
                values &= {str(v.value) for v in a.values}
            else:
                values = {v for v in values if _holds(a, Val("str", v, v))}
        return frozenset(values)

    def pins(self, atoms: list[Atom]) -> tuple[frozenset[str] | None, dict[Subject, frozenset[str]]]:
        """The drivers and the device types (per `type` attribute) the atoms allow, computed once
        per set of atoms: every lookup of the selector is judged against them."""
        types: dict[Subject, frozenset[str]] = {}
        for subject in dict.fromkeys(a.subject for a in atoms):
            if subject[0] == "attributes" and subject[2] == "type" and self.view.type_values(subject[1]):
                pinned = self.pinned(atoms, subject)
                if pinned is not None:
                    types[subject] = pinned
        return self.pinned(atoms, DRIVER), types

    def leaf(
        self,
        conjunct: Expr,
        atoms: list[Atom],
        pins: tuple[frozenset[str] | None, dict[Subject, frozenset[str]]],
    ) -> Reason | None:
        drivers, types = pins
        found: Reason | None = None
        for part in strict_parts(conjunct):
            reason = (
                self.access_reason(part, atoms, drivers, types)
                or self.misuse(part, conjunct)
                or self.constant_error(part)
            )
            if reason is not None and not reason.known:
                return reason
            found = found or reason
        return found

    def access_reason(
        self,
        node: Expr,
        atoms: list[Atom],
        drivers: frozenset[str] | None,
        types: dict[Subject, frozenset[str]],
    ) -> Reason | None:
        access = self.accesses.get(node.id)
        if access is None or access.presence:
            return None
        subject = (access.kind, access.domain, access.name)
        shown = f"device.{access.kind}['{access.domain}'].{access.name}"
        absent = next((a for a in atoms if a.op == "absent" and a.subject == subject), None)
        if absent is not None:
            return Reason(
                NO_MATCH,
                f"{absent.text} holds only where {shown} is not published, and reading it fails there",
                f"drop one of the two conditions, or read it only where it exists: `!has({shown}) || ...`",
                node.id,
                "always",
                access=access,
            )
        if self.view.schema_domain(access.domain):
            spec = self.view.spec(*subject)
            if spec is None:
                return Reason(
                    UNKNOWN,
                    f"{access.domain} does not publish '{access.name}'",
                    "",
                    node.id,
                    "schema",
                    True,
                    access,
                )
            for pinned in types.values():
                if pinned is not None and pinned and not pinned & spec[1]:
                    have = ", ".join(sorted(spec[1]))
                    word = "attribute" if access.kind == "attributes" else "capacity"
                    return Reason(
                        UNKNOWN,
                        f"'{access.name}' is published only on {have} devices, but the selector asks for "
                        f"type {' or '.join(repr(p) for p in sorted(pinned))}: {shown} fails to evaluate on "
                        "every device it can select",
                        f"drop the {word} condition, or select the device type that has it ({have})",
                        node.id,
                        "schema",
                        self.view.reported(access),
                        access,
                    )
        if drivers:
            published: set[str] = set()
            for driver in drivers:
                domains = self.view.driver_domains(driver, access.kind)
                if domains is None:
                    return None
                published |= domains
            if access.domain not in published:
                word = "attributes" if access.kind == "attributes" else "capacities"
                listed = ", ".join(sorted(published)) or "none"
                pinned_text = " or ".join(f"'{d}'" for d in sorted(drivers))
                return Reason(
                    UNKNOWN,
                    f"the selector asks for device.driver {pinned_text}, whose devices publish no {word} in "
                    f"domain '{access.domain}': {shown} fails to evaluate on every device it can select",
                    f"read {word} of the domains that driver publishes ({listed}), or check the driver name",
                    node.id,
                    "schema",
                    self.view.reported(access),
                    access,
                )
        return None

    def typed(self, node: Expr) -> tuple[Family, Access] | None:
        found = self.subject(node)
        if found is None or found[1] is None:
            return None
        family = self.schema_type(found[0])
        return None if family is None else (family, found[1])

    def misuse(self, node: Expr, conjunct: Expr) -> Reason | None:
        """A schema-typed value used where no overload takes it: the evaluation fails."""
        if node is conjunct:
            typed = self.typed(node)
            if typed is not None and typed[0] != "bool":
                return self.misuse_reason(node, typed, "a condition must be a bool")
        if node.kind != CALL:
            return None
        fn = node.function
        if node.target is None and fn == "!_" and node.args:
            typed = self.typed(node.args[0])
            if typed is not None and typed[0] != "bool":
                return self.misuse_reason(node, typed, "`!` takes a bool")
        if node.target is None and fn in ("_<_", "_<=_", "_>_", "_>=_") and len(node.args) == 2:
            for a, b in (node.args, node.args[::-1]):
                typed = self.typed(a)
                if typed is None:
                    continue
                if typed[0] in ("ver", "qty"):
                    return self.misuse_reason(
                        node, typed, f"{_FAMILY_WORD[typed[0]]} has no `<`/`>` operators (use compareTo())"
                    )
                word = self.family_of(b)
                if word is not None and word != typed[0]:
                    return self.misuse_reason(node, typed, f"it is compared with {_FAMILY_WORD[word]}")
        if node.target is not None:
            typed = self.typed(node.target)
            if typed is not None:
                family = typed[0]
                if fn in _STRING_METHODS and family != "str":
                    return self.misuse_reason(node, typed, f"{fn}() takes a string")
                if fn in _SEMVER_METHODS and family != "ver":
                    return self.misuse_reason(node, typed, f"{fn}() takes a Semver")
                if fn in _QUANTITY_METHODS and family != "qty":
                    return self.misuse_reason(node, typed, f"{fn}() takes a Quantity")
                if fn in _ORDER_METHODS:
                    if family not in ("ver", "qty"):
                        return self.misuse_reason(node, typed, f"{fn}() takes a Semver or a Quantity")
                    word = self.family_of(node.args[0]) if node.args else None
                    if word is not None and word != family:
                        return self.misuse_reason(
                            node, typed, f"{fn}() compares it with {_FAMILY_WORD[word]}"
                        )
        if node.target is None and fn in _STRING_FUNCTIONS and len(node.args) == 1:
            typed = self.typed(node.args[0])
            if typed is not None and typed[0] != "str":
                return self.misuse_reason(node, typed, f"{fn}() takes a string")
        return None

    def family_of(self, node: Expr) -> Family | None:
        """The kind of a constant or of a schema-typed value, None when unknown."""
        value = const_value(node, self.ast.types)
        if value is not None:
            return value.family
        typed = self.typed(node)
        return None if typed is None else typed[0]

    def misuse_reason(self, node: Expr, typed: tuple[Family, Access], why: str) -> Reason:
        family, access = typed
        what = "capacity" if access.kind == "capacity" else "attribute"
        return Reason(
            UNKNOWN,
            f"'{access.name}' is {_FAMILY_WORD[family]} {what} and {why}: `{self.show(node)}` fails to "
            "evaluate on every device",
            _fix_for(family, access),
            node.id,
            "schema",
            self.view.reported(access),
            access,
        )

    def constant_error(self, node: Expr) -> Reason | None:
        if (
            node.id in self.covered
            or node.kind not in (CALL, SELECT)
            or not _is_constant(node, self.constant)
        ):
            return None
        if node.id in self.errors:
            error = self.errors[node.id]
        else:
            error = self.errors[node.id] = self.evaluate_constant(node)
            # Its parts fail only if it does: no need to evaluate them on their own.
            self.covered.update(n.id for n in node.walk() if n is not node)
        if error is None:
            return None
        node, error = self.narrow(node, error)
        shown = self.show(node)
        return Reason(
            NO_MATCH,
            f"`{shown}` fails to evaluate ({error}), and the selector always evaluates it",
            _constant_fix(node),
            node.id,
            "always",
        )

    def narrow(self, node: Expr, error: str) -> tuple[Expr, str]:
        """The smallest part that fails by itself (`1 / 0` rather than `1 / 0 == 1`), to point at."""
        for _ in range(16):
            parts = [node.operand] if node.kind == SELECT else [node.target, *node.args]
            for part in parts:
                if part is None or part.kind not in (CALL, SELECT) or not _is_constant(part, self.constant):
                    continue
                inner = self.evaluate_constant(part)
                if inner is not None:
                    node, error = part, inner
                    break
            else:
                return node, error
        return node, error

    def evaluate_constant(self, node: Expr) -> str | None:
        version = _semver_literal(node)
        if version is not None:
            return version if isinstance(version, str) else None
        quantity = _quantity_literal(node)
        if quantity is not None:
            return quantity if isinstance(quantity, str) else None
        if self.view.evaluate is None or self.evaluations >= MAX_EVALUATIONS:
            return None
        # Only calls and indexes can fail; a literal or a field of one cannot.
        if not any(n.kind == CALL for n in node.walk()):
            return None
        text = unparse(node, self.ast.types)
        if text is None:
            return None
        self.evaluations += 1
        return self.view.evaluate(text)

    # -- the walk --
    def never(self, node: Expr, context: list[Atom], depth: int = 0) -> Reason | None:
        self.steps += 1
        if self.steps > MAX_STEPS or depth > 32:
            return None
        conjuncts = list(_conjuncts(node))
        atoms = list(context)
        for conjunct in conjuncts:
            atoms.extend(self.atoms_of(conjunct))
        best = self.contradiction(atoms)
        if best is not None and not best.known:
            return best
        pins = self.pins(atoms)
        for conjunct in conjuncts:
            reason = self.leaf(conjunct, atoms, pins) or self.branches(conjunct, atoms, depth)
            if reason is not None and not reason.known:
                return reason
            best = best or reason
        return best

    def branches(self, node: Expr, atoms: list[Atom], depth: int) -> Reason | None:
        if node.kind != CALL or node.target is not None:
            return None
        if node.function == "_||_" and len(node.args) == 2:
            sides = node.args
        elif node.function == "_?_:_" and len(node.args) == 3:
            sides = node.args[1:]
        else:
            return None
        reasons = []
        for side in sides:
            reason = self.never(side, atoms, depth + 1)
            if reason is None:
                return None
            reasons.append(reason)
        known = all(r.known for r in reasons)
        word = "side of" if node.function == "_||_" else "branch of"
        joined = "; ".join(dict.fromkeys(r.message for r in reasons))
        fixes = "; ".join(dict.fromkeys(r.fix for r in reasons if r.fix))
        basis = "schema" if any(r.basis == "schema" for r in reasons) else "always"
        return Reason(
            NO_MATCH, f"no {word} `{self.show(node)}` can be true: {joined}", fixes, node.id, basis, known
        )


def _compare_numbers(r: int, op: str, k: int | float) -> bool:
    return {"==": r == k, "!=": r != k, "<": r < k, "<=": r <= k, ">": r > k, ">=": r >= k}[op]


def _conjuncts(node: Expr) -> Iterator[Expr]:
    if node.kind == CALL and node.function == "_&&_" and node.target is None:
        for arg in node.args:
            yield from _conjuncts(arg)
    else:
        yield node


def _fix_for(family: Family, access: Access) -> str:
    target = f"device.{access.kind}['{access.domain}'].{access.name}"
    return {
        "str": f"treat it as a string, e.g. {target} == 'x' or {target}.startsWith('x')",
        "num": f"compare it as a number, e.g. {target} == 1 or {target} >= 2",
        "bool": f"use it as a condition, e.g. {target} or !{target}",
        "ver": f"compare Semver values, e.g. {target}.compareTo(semver('1.2.3')) >= 0",
        "qty": f"compare quantities, e.g. {target}.compareTo(quantity('40Gi')) >= 0",
    }[family]


def _constant_fix(node: Expr) -> str:
    if node.kind == CALL and node.function == "semver":
        return (
            "write a full semantic version, MAJOR.MINOR.PATCH (e.g. semver('1.2.0')), or pass true to "
            "normalise a short one: semver('1.2', true)"
        )
    if node.kind == CALL and node.function == "quantity":
        return (
            "write a Kubernetes quantity such as '40Gi', '512Mi', '1.5' or '500m' "
            "(suffixes Ki Mi Gi Ti, k M G T)"
        )
    return "correct or remove this part: it fails the same way on every device"


def find(ast: CheckedAst, accesses: Iterable[Access], view: SchemaView) -> Reason | None:
    """Why the selector can never select a device, or None when it may (or when that cannot be told)."""
    analyzer = _Analyzer(ast, view, {a.node_id: a for a in accesses})
    try:
        return analyzer.never(ast.expr, [])
    except RecursionError:
        return None


def runtime_error(text: str) -> str | None:
    """The evaluation error of a constant CEL expression, None when it has a value or cannot be told
    (the default `SchemaView.evaluate`). Compiled as a selector, so what the API server folds or
    rejects at compile time, and the literal forms it pins, are as in `webhook.cel.env`."""
    from .env import CelEvalError, compile_or_issue  # env imports this package's leaves

    compiled = compile_or_issue(f"[{text}].size() == 1")
    if not hasattr(compiled, "evaluate_data"):
        return None
    try:
        compiled.evaluate_data({})
    except CelEvalError as exc:
        return None if exc.limit else exc.message
    return None
