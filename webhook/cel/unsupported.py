"""Recognise compile failures that are draguard's runtime's limits, not the API server's.

`cel_expr_python` has fixed limits the Kubernetes CEL environment does not (32 levels of nesting,
an iteration budget, no `cel.@mapInsert` for transformMap; see docs/cel.md). A selector hitting
them is valid for the API server, so draguard must not report it as a syntax or type error; it
reports `cel/unsupported` (a warning) and leaves the check to the API server.
"""

from __future__ import annotations

import re

from ..core.findings import Severity
from .issues import CelIssue

CHECK = "cel/unsupported"

# Release that introduced each library in the Kubernetes base CEL environment (libraries there
# since "1.0" are given as 1.31, the first release with DRA selectors), for the libraries the DRA
# environment inherits and draguard does not declare. Today draguard declares all of them
# (library.py, netlib.py, the runtime's extensions); a library a later release adds goes here
# until it is implemented, so that selectors using it warn instead of failing to compile.
_BASE = "1.31"
KUBERNETES_FUNCTIONS: dict[str, tuple[str, str]] = {}
"""Function (and namespace) names of Kubernetes CEL libraries -> (library, Kubernetes release)."""

# A namespaced function (`ns.f(...)`) also reports its last part as undeclared.
_NAMESPACED: dict[str, str] = {}

TWO_VARIABLE_MACROS = ("all", "exists", "existsOne", "transformList", "transformMap", "transformMapEntry")
_TWO_VAR = re.compile(
    r"\.\s*(" + "|".join(TWO_VARIABLE_MACROS) + r")\s*\(\s*([A-Za-z_]\w*)\s*,\s*([A-Za-z_]\w*)\s*,"
)
_ERROR = re.compile(r"^ERROR: <input>:\d+:\d+: (.*)$", re.MULTILINE)
_UNDECLARED = re.compile(r"^undeclared reference to '([^']+)'")

RUNTIME_NESTING = 32
"""The native runtime's nesting limit (33 parentheses, a 33-term `+` chain, ...)."""
PARSER_NESTING = 249
"""The deepest bracket nesting the API server's cel-go parser accepts (250 levels are refused there)."""


def issue(feature: str, version: str, fix: str = "") -> CelIssue:
    """The warning for a selector draguard cannot check but the API server accepts."""
    return CelIssue(
        CHECK, Severity.WARNING,
        f"draguard cannot evaluate this selector (uses {feature}, which Kubernetes supports from "
        f"{version}); it is checked by the API server only",
        fix or "nothing to change if your cluster runs that release; draguard skips its other checks",
    )


def classify(expression: str, message: str) -> CelIssue | None:
    """A `cel/unsupported` issue when every error in `message` is explained by Kubernetes-only features.

    Any other error (an undeclared name that is no Kubernetes function, a wrong argument type, a
    syntax error) means the expression is wrong for the API server too: None.
    """
    errors = _ERROR.findall(message)
    if not errors:
        return None
    macros = _TWO_VAR.findall(expression)
    macro_names = {m[0] for m in macros}
    loop_vars = {v for m in macros for v in m[1:]}
    used: list[tuple[str, str]] = []
    two_var = False
    names = {u.group(1) for e in errors if (u := _UNDECLARED.match(e))}
    for error in errors:
        undeclared = _UNDECLARED.match(error)
        if undeclared:
            name = undeclared.group(1)
            if name in loop_vars or name in macro_names:
                two_var = True
                continue
            if name in KUBERNETES_FUNCTIONS:
                used.append(KUBERNETES_FUNCTIONS[name])
                continue
            if _NAMESPACED.get(name) in names:
                continue
            return None
        return None
    if two_var:
        names_used = ", ".join(sorted(macro_names))
        return issue(f"two-variable comprehensions ({names_used})", "1.32")
    feature, version = used[0]
    return issue(feature, version)


def max_depth(expression: str) -> int:
    """Deepest bracket nesting outside string literals (a lower bound of the parse depth)."""
    depth = deepest = 0
    quote = ""
    escaped = False
    for ch in expression:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


_ARITHMETIC = "+-*/%"
_CHAIN_BREAKS = frozenset(",?:&|=<>!")


def max_operator_chain(expression: str) -> int:
    """Longest run of binary arithmetic operators at one bracket level (outside string literals).

    Such a chain nests one parser level per operator (`1 + 1 + ...`); it is a lower bound of the
    parse depth, like `max_depth`.
    """
    counts = [0]
    longest = 0
    quote = ""
    escaped = False
    previous = before = ""
    for ch in expression:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
                previous = ch
            continue
        if ch in "'\"":
            quote = ch
            continue
        if ch.isspace():
            continue
        if ch in "([{":
            counts.append(0)
        elif ch in ")]}":
            if len(counts) > 1:
                counts.pop()
        elif ch in _ARITHMETIC and (previous.isalnum() or previous in "_)]}'\".") \
                and not (ch in "+-" and previous in "eE" and before.isdigit()):
            counts[-1] += 1
            longest = max(longest, counts[-1])
        elif ch in _CHAIN_BREAKS:
            counts[-1] = 0
        before, previous = previous, ch
    return longest


def nesting_issue(expression: str, detail: str) -> CelIssue | None:
    """`cel/unsupported` for the runtime's nesting limit, unless the API server's parser refuses it too."""
    if max_depth(expression) > PARSER_NESTING:
        return None
    return issue(
        f"more than {RUNTIME_NESTING} levels of nesting ({detail})", _BASE,
        "remove redundant parentheses, or split long `+` chains / conditions over several selectors, "
        "so draguard can check it",
    )
