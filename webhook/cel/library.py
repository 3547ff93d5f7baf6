"""The Kubernetes CEL library functions DRA selectors use: Quantity and Semver, the lists and regex
libraries, cel-go's string offsets (and, from netlib.py, IP, CIDR and URL).

The native runtime cannot declare opaque types, so a Quantity or Semver travels through CEL as a
one-entry tagged map, `{"@quantity": "<exact value>"}` / `{"@semver": "<version>"}`, and the
member functions are overloads on that map type. The tag holds a canonical form, so CEL `==`
compares values the way Kubernetes does (`quantity('1Gi') == quantity('1024Mi')`).

Everything here is plain Python; `webhook/cel/_native.py` turns `FUNCTIONS` into runtime
declarations.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import re2  # type: ignore[import-untyped]

from ..dra.device import AttrValue, Device, Version
from ..dra.quantity import Quantity
from ..dra.semver import Semver, coerce_semver, is_semver
from . import netlib

QUANTITY_TAG = "@quantity"
SEMVER_TAG = "@semver"

# Parameter/return type names understood by `_native`: "tagged" is the tagged map.
TypeName = str


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    """One overload of a library function."""

    name: str
    overload_id: str
    params: tuple[TypeName, ...]
    result: TypeName
    member: bool
    impl: Callable[..., Any]


class LibraryError(ValueError):
    """A library function was applied to a value it does not accept."""


# ---- tagged values -------------------------------------------------------------------------------

def quantity_value(q: Quantity) -> dict[str, str]:
    return {QUANTITY_TAG: q.canonical_key()}


def semver_value(v: Semver) -> dict[str, str]:
    return {SEMVER_TAG: v.canonical_key()}


def _kind(value: object) -> str:
    if isinstance(value, Mapping) and len(value) == 1:
        if QUANTITY_TAG in value:
            return "Quantity"
        if SEMVER_TAG in value:
            return "Semver"
        for tag, kind in netlib.KINDS.items():
            if tag in value:
                return kind
    return type(value).__name__


def _as_quantity(value: object, function: str) -> Quantity:
    if isinstance(value, Mapping) and len(value) == 1 and QUANTITY_TAG in value:
        return Quantity(Fraction(str(value[QUANTITY_TAG])))
    raise LibraryError(f"no such overload: {function} applied to {_kind(value)} (expects Quantity)")


def _as_semver(value: object, function: str) -> Semver:
    if isinstance(value, Mapping) and len(value) == 1 and SEMVER_TAG in value:
        return Semver.parse(str(value[SEMVER_TAG]))
    raise LibraryError(f"no such overload: {function} applied to {_kind(value)} (expects Semver)")


def _pair(left: object, right: object, function: str) -> tuple[Quantity, Quantity] | tuple[Semver, Semver]:
    kind = _kind(left)
    if kind == "Quantity":
        return _as_quantity(left, function), _as_quantity(right, f"Quantity.{function}")
    if kind == "Semver":
        return _as_semver(left, function), _as_semver(right, f"Semver.{function}")
    raise LibraryError(f"no such overload: {function} applied to {kind} (expects Quantity or Semver)")


def _compare(left: object, right: object, function: str) -> int:
    a, b = _pair(left, right, function)
    return a.compare(b)  # type: ignore[arg-type]  # _pair returns two values of one type


# ---- function implementations --------------------------------------------------------------------

def _quantity(text: str) -> dict[str, str]:
    return quantity_value(Quantity.parse(text))


def _is_quantity(text: str) -> bool:
    try:
        Quantity.parse(text)
    except ValueError:
        return False
    return True


_INT64_MAX = 2**63 - 1


def _checked_semver(text: str) -> Semver:
    version = Semver.parse(text)
    if max(version.major, version.minor, version.patch) > _INT64_MAX:
        raise ValueError(f"invalid semver {text!r}: a version number exceeds the int64 range")
    return version


def _semver(text: str) -> dict[str, str]:
    return semver_value(_checked_semver(text))


def _semver_normalize(text: str, normalize: bool) -> dict[str, str]:
    return semver_value(_checked_semver(coerce_semver(text) if normalize else text))


def _is_semver(text: str) -> bool:
    return is_semver(text)


def _is_semver_normalize(text: str, normalize: bool) -> bool:
    if not normalize:
        return is_semver(text)
    try:
        Semver.parse(coerce_semver(text))
    except ValueError:
        return False
    return True


def _add(left: object, right: object) -> dict[str, str]:
    if isinstance(right, int) and not isinstance(right, bool):
        return quantity_value(_as_quantity(left, "add").add(right))
    return quantity_value(_as_quantity(left, "add").add(_as_quantity(right, "Quantity.add")))


def _sub(left: object, right: object) -> dict[str, str]:
    if isinstance(right, int) and not isinstance(right, bool):
        return quantity_value(_as_quantity(left, "sub").sub(right))
    return quantity_value(_as_quantity(left, "sub").sub(_as_quantity(right, "Quantity.sub")))


def _spec(name: str, params: tuple[TypeName, ...], result: TypeName, impl: Callable[..., Any],
          *, member: bool = False) -> FunctionSpec:
    ids = [p.replace("(", "_").replace(")", "") for p in params]
    overload = "_".join((name, *ids)) if not member else f"{ids[0]}_{name}_" + "_".join(ids[1:])
    return FunctionSpec(name, overload, params, result, member, impl)


FUNCTIONS: tuple[FunctionSpec, ...] = (
    _spec("quantity", ("string",), "tagged", _quantity),
    _spec("isQuantity", ("string",), "bool", _is_quantity),
    _spec("semver", ("string",), "tagged", _semver),
    _spec("semver", ("string", "bool"), "tagged", _semver_normalize),
    _spec("isSemver", ("string",), "bool", _is_semver),
    _spec("isSemver", ("string", "bool"), "bool", _is_semver_normalize),
    _spec("compareTo", ("tagged", "tagged"), "int", lambda a, b: _compare(a, b, "compareTo"), member=True),
    _spec("isGreaterThan", ("tagged", "tagged"), "bool", lambda a, b: _compare(a, b, "isGreaterThan") > 0,
          member=True),
    _spec("isLessThan", ("tagged", "tagged"), "bool", lambda a, b: _compare(a, b, "isLessThan") < 0,
          member=True),
    _spec("add", ("tagged", "tagged"), "tagged", _add, member=True),
    _spec("add", ("tagged", "int"), "tagged", _add, member=True),
    _spec("sub", ("tagged", "tagged"), "tagged", _sub, member=True),
    _spec("sub", ("tagged", "int"), "tagged", _sub, member=True),
    _spec("asInteger", ("tagged",), "int", lambda q: _as_quantity(q, "asInteger").as_integer(), member=True),
    _spec("isInteger", ("tagged",), "bool", lambda q: _as_quantity(q, "isInteger").is_integer(), member=True),
    _spec("asApproximateFloat", ("tagged",), "double",
          lambda q: _as_quantity(q, "asApproximateFloat").as_approximate_float(), member=True),
    # A global function in Kubernetes' quantity library (`sign(q)`); `q.sign()` does not compile there.
    _spec("sign", ("tagged",), "int", lambda q: _as_quantity(q, "sign").sign()),
    _spec("major", ("tagged",), "int", lambda v: _as_semver(v, "major").major, member=True),
    _spec("minor", ("tagged",), "int", lambda v: _as_semver(v, "minor").minor, member=True),
    _spec("patch", ("tagged",), "int", lambda v: _as_semver(v, "patch").patch, member=True),
)


# ---- Kubernetes' lists library (k8s.io/apiserver/pkg/cel/library/lists.go) -------------------------

def _list_sum(items: list[Any]) -> Any:
    total: Any = 0.0 if items and isinstance(items[0], float) else 0
    for item in items:
        total += item
    return total


def _list_min(items: list[Any]) -> Any:
    if not items:
        raise LibraryError("min called on empty list")
    return min(items)


def _list_max(items: list[Any]) -> Any:
    if not items:
        raise LibraryError("max called on empty list")
    return max(items)


def _same(a: object, b: object) -> bool:
    # CEL equality across int/uint/double compares numerically; bool is never a number.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _index_of(items: list[Any], value: Any) -> int:
    return next((i for i, item in enumerate(items) if _same(item, value)), -1)


def _last_index_of(items: list[Any], value: Any) -> int:
    return next((i for i in range(len(items) - 1, -1, -1) if _same(items[i], value)), -1)


def _is_sorted(items: list[Any]) -> bool:
    return all(items[i] <= items[i + 1] for i in range(len(items) - 1))


# One overload each on list(dyn): the runtime dispatches on the argument's kind (list), so one
# implementation per name serves every element type; the checker then types the result dyn.
_LIST_FUNCTIONS: tuple[FunctionSpec, ...] = (
    _spec("sum", ("list(dyn)",), "dyn", _list_sum, member=True),
    _spec("min", ("list(dyn)",), "dyn", _list_min, member=True),
    _spec("max", ("list(dyn)",), "dyn", _list_max, member=True),
    _spec("isSorted", ("list(dyn)",), "bool", _is_sorted, member=True),
    _spec("indexOf", ("list(dyn)", "dyn"), "int", _index_of, member=True),
    _spec("lastIndexOf", ("list(dyn)", "dyn"), "int", _last_index_of, member=True),
)

def _regex(pattern: str) -> Any:
    """RE2, as Go's regexp: linear time whatever the pattern, where a backtracking engine is not."""
    try:
        return _compile_regex(pattern)
    except re2.error as exc:
        raise LibraryError(f"invalid regex {pattern!r}: {exc}") from None


_RE2_OPTIONS: Any = re2.Options()
_RE2_OPTIONS.log_errors = False


@functools.lru_cache(maxsize=256)
def _compile_regex(pattern: str) -> Any:
    return re2.compile(pattern, options=_RE2_OPTIONS)


def regex_valid(pattern: str) -> bool:
    """Whether RE2 (the syntax Kubernetes' `matches` and `find` use) accepts the pattern."""
    try:
        _compile_regex(pattern)
    except re2.error:
        return False
    return True


def _find(text: str, pattern: str) -> str:
    found = _regex(pattern).search(text)
    return found.group(0) if found else ""


def _find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    if limit == 0:
        return []
    out = [m.group(0) for m in _regex(pattern).finditer(text)]
    return out if limit < 0 else out[:limit]


# Kubernetes' regex library (k8s.io/apiserver/pkg/cel/library/regex.go).
_REGEX_FUNCTIONS: tuple[FunctionSpec, ...] = (
    _spec("find", ("string", "string"), "string", _find, member=True),
    _spec("findAll", ("string", "string"), "list(string)", _find_all, member=True),
    _spec("findAll", ("string", "string", "int"), "list(string)", _find_all, member=True),
)

def _substring_range(text: str, start: int, end: int) -> str:
    """cel-go's `s.substring(start, end)`: code points, `end` exclusive and at most the length (the
    native runtime refuses an `end` equal to the length)."""
    if start > end:
        raise LibraryError(f"invalid substring range. start: {start}, end: {end}")
    if start < 0 or start > len(text):
        raise LibraryError(f"index out of range: {start}")
    if end > len(text):
        raise LibraryError(f"index out of range: {end}")
    return text[start:end]


def _index_of_offset(text: str, sub: str, offset: int) -> int:
    """cel-go's strings extension: a negative offset fails; past the end, "" matches at the end and
    anything else finds nothing (the native runtime fails there instead)."""
    if offset < 0:
        raise LibraryError(f"index out of range: {offset}")
    if sub == "":
        return min(offset, len(text))
    if offset >= len(text):
        return -1
    return text.find(sub, offset)


def _last_index_of_offset(text: str, sub: str, offset: int) -> int:
    if offset < 0:
        raise LibraryError(f"index out of range: {offset}")
    if sub == "":
        return min(offset, len(text))
    if offset >= len(text):
        return -1
    return text.rfind(sub, 0, min(offset, len(text) - len(sub)) + len(sub))


# ---- Kubernetes' quantity representation ------------------------------------------------------------

_QUANTITY_TEXT = re.compile(r"^([+-]?)0*([0-9]*)(?:\.([0-9]*))?([a-zA-Z]*[-+]?[0-9]*)$")
_BINARY_EXP = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_EXP = {"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_EXPONENT = re.compile(r"^[eE]([-+]?[0-9]+)$")


def int64_form(text: str) -> tuple[bool, int | None]:
    """How apimachinery's ParseQuantity holds `text`: (valid, the int64 `AsInt64` gives or None).

    ParseQuantity keeps a value as an int64 with a decimal scale only on its fast path (few
    enough digits, no fraction with a binary suffix, at most nano precision); otherwise it holds
    an inf.Dec, and `AsInt64` (the CEL library's isInteger/asInteger) refuses those, as it
    refuses a negative scale (`1000m`), whatever the value.
    """
    try:
        Quantity.parse(text)
    except ValueError:
        return False, None
    if text == "0":
        return True, 0
    found = _QUANTITY_TEXT.match(text)
    if found is None:
        return True, None
    sign, num, denom, suffix = found.group(1), found.group(2) or "0", found.group(3) or "", found.group(4)
    if suffix in _BINARY_EXP:
        exponent = _BINARY_EXP[suffix]
        if denom:
            return True, None
        # int32(float32(exponent)*3/10) in Go: exact for these multiples of ten.
        if 15 - len(num) - (exponent * 3) // 10 - 1 < 0:
            return True, None
        value, scale = int(num) << exponent, 0
    else:
        if suffix in _DECIMAL_EXP:
            exponent = _DECIMAL_EXP[suffix]
        elif (exp := _EXPONENT.match(suffix)) is not None:
            exponent = int(exp.group(1))
        else:
            return True, None
        if 18 - (len(num) + len(denom)) < 0:
            return True, None
        scale = exponent - len(denom)
        if scale < -9:
            return True, None
        value = int(num + denom)
    if value > _INT64_MAX:
        return True, None
    if sign == "-":
        value = -value
    if scale < 0:
        return True, None
    value *= 10**scale
    return True, value if -_INT64_MAX - 1 <= value <= _INT64_MAX else None


def _held_as_decimal(value: object) -> int:
    q = _as_quantity(value, "asInteger")
    q.as_integer()  # the usual error when it is no int64 at all
    raise LibraryError(f"cannot convert value to integer: {q} is held as a decimal by Kubernetes "
                       "(a fraction, a negative scale such as 1000m, or too many digits for its suffix)")


_OFFSET_FUNCTIONS: tuple[FunctionSpec, ...] = (
    _spec("__draguard_decimalIsInteger", ("tagged",), "bool", lambda _q: False, member=True),
    _spec("__draguard_decimalAsInteger", ("tagged",), "int", _held_as_decimal, member=True),
    _spec("__draguard_indexOf", ("string", "string", "int"), "int", _index_of_offset, member=True),
    _spec("__draguard_lastIndexOf", ("string", "string", "int"), "int", _last_index_of_offset, member=True),
    _spec("__draguard_substring", ("string", "int", "int"), "string", _substring_range, member=True),
)

EXTENDS_RUNTIME = frozenset({"indexOf", "lastIndexOf"})
"""Names the runtime's strings extension already declares: these overloads are merged into it."""

FUNCTIONS = FUNCTIONS + _LIST_FUNCTIONS + _REGEX_FUNCTIONS + _OFFSET_FUNCTIONS + tuple(
    _spec(name, params, result, impl, member=member) for name, params, result, impl, member in netlib.SPECS
)

# Names of the functions above (for the linter's cost model and error mapping).
FUNCTION_NAMES: frozenset[str] = frozenset(f.name for f in FUNCTIONS)


# ---- device conversion ---------------------------------------------------------------------------

def attribute_value(value: AttrValue) -> object:
    """An attribute as CEL sees it: versions become Semver values, the rest stay as they are."""
    if isinstance(value, Version):
        try:
            return semver_value(Semver.parse(str(value)))
        except ValueError:
            # Not valid semver: the API server would not have stored it; keep the text under the tag
            # so that library functions report it instead of silently comparing.
            return {SEMVER_TAG: str(value)}
    return value


def capacity_value(text: str) -> object:
    try:
        return quantity_value(Quantity.parse(text))
    except ValueError:
        return {QUANTITY_TAG: text}


def device_data(device: Device, empty_domains: frozenset[str] = frozenset()) -> dict[str, object]:
    """The `device` variable for one device.

    `empty_domains` are domains the expression may look up: those the device does not publish are
    present as empty maps, because Kubernetes answers an unknown domain with an empty map, not an error.
    """
    attributes: dict[str, object] = {d: {} for d in empty_domains}
    for domain, values in device.attributes.items():
        attributes[domain] = {name: attribute_value(v) for name, v in values.items()}
    capacity: dict[str, object] = {d: {} for d in empty_domains}
    for domain, caps in device.capacity.items():
        capacity[domain] = {name: capacity_value(v) for name, v in caps.items()}
    return {
        "driver": device.driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": device.allow_multiple_allocations,
    }


def cel_type_name(value: object) -> str:
    """The CEL type name of a Python value returned by the runtime."""
    kind = _kind(value)
    if kind in ("Quantity", "Semver", *netlib.KINDS.values()):
        return kind
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    if value is None:
        return "null_type"
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__
