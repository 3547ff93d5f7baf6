"""The one place that talks to the native CEL runtime (`cel_expr_python`).

The extension ships loose stubs, so its objects are `Any` here and nowhere else; everything this
module returns is a plain Python value.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from cel_expr_python import cel as _cel

from .library import EXTENDS_RUNTIME, FUNCTIONS

_T: Any = _cel.Type
_TYPES: dict[str, Any] = {
    "string": _T.STRING,
    "int": _T.INT,
    "uint": _T.UINT,
    "bool": _T.BOOL,
    "double": _T.DOUBLE,
    "dyn": _T.DYN,
    "duration": _T.DURATION,
    "tagged": _T.Map(_T.STRING, _T.STRING),
}


def _type(name: str) -> Any:
    """`list(T)` / `map(K,V)` or one of _TYPES."""
    if name.startswith("list(") and name.endswith(")"):
        return _T.List(_type(name[5:-1]))
    if name.startswith("map(") and name.endswith(")"):
        key, value = name[4:-1].split(",", 1)
        return _T.Map(_type(key), _type(value))
    return _TYPES[name]

_STATUS_PREFIX = re.compile(r"^[A-Z_]+: ")
_STATUS_SUFFIX = re.compile(r" \[[A-Z_]+\]$")
_MISSING_KEY = re.compile(r'^Key not found in map : "?(.*?)"?$')
_NO_OVERLOAD = re.compile(r"^No matching overloads found : (.*)$")


class CompileFailure(Exception):
    """The runtime rejected an expression; `message` is in cel-go's `ERROR: <input>:L:C: ...` form."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class EvaluationAborted(Exception):
    """The runtime stopped evaluating (e.g. its comprehension iteration budget ran out).

    Not an answer about the device: the expression is beyond what draguard's runtime evaluates.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NativeExpression:
    """A compiled expression (opaque handle plus facts read off it once)."""

    __slots__ = ("_handle", "return_type", "serialized")

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self.return_type: str = str(handle.return_type().name()).lower()
        self.serialized: bytes = bytes(handle.serialize())

    def evaluate(self, data: dict[str, object]) -> tuple[bool, object]:
        """(True, value) or (False, error message in cel-go's wording).

        Raises EvaluationAborted when the runtime gives up (it raises RuntimeError, e.g.
        "Iteration budget exceeded"), so that no caller sees the extension's own exception.
        """
        try:
            result: Any = self._handle.eval(data=data)
        except RuntimeError as exc:
            raise EvaluationAborted(compile_message(str(exc))) from None
        kind = str(result.type().name())
        if kind == "BOOL":
            return True, bool(result.value())
        if kind == "ERROR":
            return False, runtime_message(str(result.value()))
        plain: object = result.plain_value()
        return True, plain


    def evaluate_typed(self, data: dict[str, object]) -> tuple[bool, object]:
        """Like `evaluate`, but a value comes as `Typed` (the runtime's type name is kept, which
        plain values lose: a uint reads as an int)."""
        try:
            result: Any = self._handle.eval(data=data)
        except RuntimeError as exc:
            raise EvaluationAborted(compile_message(str(exc))) from None
        kind = str(result.type().name())
        if kind == "ERROR":
            return False, runtime_message(str(result.value()))
        items: tuple[tuple[str, object], ...] = ()
        if kind.startswith("LIST"):
            items = tuple((str(item.type().name()), item.plain_value()) for item in result.value())
        return True, Typed(kind, result.plain_value(), items)


class Typed:
    """A runtime value with its type name; `items` are a list's elements, each with its own."""

    __slots__ = ("items", "kind", "plain")

    def __init__(self, kind: str, plain: object, items: tuple[tuple[str, object], ...]) -> None:
        self.kind = kind
        self.plain = plain
        self.items = items


def runtime_message(raw: str) -> str:
    """Translate the runtime's status text into cel-go's wording ("no such key: x", ...)."""
    text = _STATUS_PREFIX.sub("", raw.strip())
    missing = _MISSING_KEY.match(text)
    if missing:
        return f"no such key: {missing.group(1)}"
    overload = _NO_OVERLOAD.match(text)
    if overload:
        return f"no such overload: {overload.group(1)}"
    return text


# The Kubernetes base environment's extensions that the runtime ships (cel-go ext.Strings v2,
# ext.Lists, ext.Sets, ext.TwoVarComprehensions, ext.Bindings, optional types). The ordering
# operators are declared here instead of by the standard library so that the checker accepts
# comparisons across int, uint and double, as Kubernetes' CrossTypeNumericComparisons does; the
# runtime already evaluates those.
_CONFIG = """stdlib:
  exclude_functions:
    - name: "_<_"
    - name: "_<=_"
    - name: "_>_"
    - name: "_>=_"
extensions:
  - name: "strings"
    version: 2
  - name: "bindings"
  - name: "optional"
    version: 2
  - name: "lists"
  - name: "sets"
  - name: "two-var-comprehensions"
"""

_ORDERED = ("_<_", "_<=_", "_>_", "_>=_")
_NUMERIC = ("int", "uint", "double")
_ORDERED_OTHER = ("string", "bytes", "bool", "timestamp", "duration")


def _ordering_decls() -> list[Any]:
    kinds: dict[str, Any] = {
        "int": _T.INT, "uint": _T.UINT, "double": _T.DOUBLE, "string": _T.STRING, "bytes": _T.BYTES,
        "bool": _T.BOOL, "timestamp": _T.TIMESTAMP, "duration": _T.DURATION,
    }
    decls = []
    for name in _ORDERED:
        op = name.strip("_")
        overloads = [
            _cel.Overload(f"{op}_{a}_{b}", _T.BOOL, [kinds[a], kinds[b]])
            for a in _NUMERIC for b in _NUMERIC
        ]
        overloads += [_cel.Overload(f"{op}_{a}", _T.BOOL, [kinds[a], kinds[a]]) for a in _ORDERED_OTHER]
        decls.append(_cel.FunctionDecl(name, overloads))
    return decls


def _build_env() -> Any:
    decls: dict[str, list[Any]] = {}
    for spec in FUNCTIONS:
        overload = _cel.Overload(
            spec.overload_id,
            _type(spec.result),
            [_type(p) for p in spec.params],
            is_member=spec.member,
            impl=spec.impl,
        )
        decls.setdefault(spec.name, []).append(overload)
    functions = [_cel.FunctionDecl(name, overloads) for name, overloads in decls.items()
                 if name not in EXTENDS_RUNTIME]
    # A second declaration of a name is refused; an extension's overloads are merged instead.
    merged = _cel.CelExtension("kubernetes.lists", [
        _cel.FunctionDecl(name, overloads) for name, overloads in decls.items() if name in EXTENDS_RUNTIME
    ])
    return _cel.NewEnv(
        config=_cel.NewEnvConfigFromYaml(_CONFIG),
        variables={"device": _T.Map(_T.STRING, _T.DYN)},
        extensions=[merged],
        functions=functions + _ordering_decls(),
    )


_ENV: Any = None
_ENV_LOCK = threading.Lock()


def _env() -> Any:
    global _ENV
    if _ENV is None:
        with _ENV_LOCK:
            if _ENV is None:
                _ENV = _build_env()
    return _ENV


def compile_expression(text: str) -> NativeExpression:
    """Parse and type-check; raises CompileFailure with cel-go style text."""
    env = _env()
    with _ENV_LOCK:
        try:
            handle = env.compile(text)
        except RuntimeError as exc:
            raise CompileFailure(compile_message(str(exc))) from None
    return NativeExpression(handle)


def compile_message(raw: str) -> str:
    text = _STATUS_PREFIX.sub("", raw.strip())
    return _STATUS_SUFFIX.sub("", text)
