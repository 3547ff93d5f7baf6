"""The Kubernetes-compatible CEL environment for DRA device selectors.

`compile_selector(text)` compiles once per distinct text (cached) and rejects what the API server
rejects at create time: syntax and type errors, a non-bool result, more than 10 KiB of text and an
estimated cost over 1,000,000 (see `analysis.estimate_cost`; the limit is checked statically, not
counted at run time — device data is bounded, so the estimate bounds the run).

Selector text is written by tenants, so the compile cache is bounded by memory, not by count: a
compiled expression holds about 136 bytes per byte of text (measured: a 7 KiB selector keeps
~1 MiB), and takes ~10 ms per KiB to compile. Inside `compile_budget()` (one admission request)
at most 8 KiB of never-seen text are compiled and 5,000 device evaluations run; beyond that a
selector is reported as `cel/unsupported` (not checked by draguard, left to the API server) and
nothing is cached for it, so one request can neither grow the cache past its share nor hold the
event loop for long.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..core.findings import Severity
from ..dra.device import Device
from . import _native, fold, phantom, sizes, typecheck, unsupported
from .analysis import COMPARISON_SYMBOLS, MAX_COST, Analysis, analyse, cost_is_exact
from .ast import CheckedAst, decode_checked
from .issues import CelIssue
from .library import cel_type_name, device_data

MAX_EXPRESSION_LENGTH = 10 * 1024
"""CELSelectorExpressionMaxLength: 10 KiB of UTF-8."""

CACHE_BYTES = 32 * 1024 * 1024
"""The compile cache's memory bound (estimated by `entry_bytes`)."""
REQUEST_COMPILE_BYTES = 8 * 1024
"""Never-seen selector text one admission request may compile (about 80 ms of CPU)."""
REQUEST_EVALUATIONS = 5000
"""Device evaluations one admission request may run (tens of µs each)."""
_BYTES_PER_CHAR = 136
_ENTRY_OVERHEAD = 32 * 1024
COST_MARGIN = 1.5
"""draguard's cost estimate is at most this much above Kubernetes' (measured on the differential
corpus: 1.1-1.35x on comprehensions); only an estimate above the limit by more is a rejection."""
UNROLL_COST = 2000
"""Above this estimated cost a constant comprehension may exceed the runtime's iteration budget
(a few thousand steps), so it is evaluated ahead, element by element (`fold.unroll_constants`)."""
_SCIENTIFIC = re.compile(r"%[-+# 0]*[0-9]*(?:\.[0-9]+)?[eE]")
_LOCATION = re.compile(r"<input>:(\d+):(\d+):")
_STANDARD_DOMAINS = frozenset({"gpu.nvidia.com", "resource.kubernetes.io"})


class CelCompileError(ValueError):
    """An expression the API server would refuse; `issue` says which check and where."""

    def __init__(self, issue: CelIssue) -> None:
        super().__init__(issue.message)
        self.issue = issue


class CelEvalError(Exception):
    """Evaluating a selector against one device failed (cel-go wording, e.g. "no such key: profile").

    `missing_key` is set when a lookup named a key the device does not publish. `limit` is set
    when draguard's runtime gave up (its iteration budget ran out): the verdict is unknown, which
    says nothing about the device or about what the API server's scheduler would decide.
    """

    def __init__(
        self, message: str, *, missing_key: str | None = None, type_error: bool = False, limit: bool = False
    ) -> None:
        super().__init__(message)
        self.message = message
        self.missing_key = missing_key
        self.type_error = type_error
        self.limit = limit


@dataclass(frozen=True, slots=True, eq=False)
class CompiledSelector:
    expression: str
    native: _native.NativeExpression
    ast: CheckedAst
    analysis: Analysis
    # Domains the expression may look up; absent ones are given as empty maps (Kubernetes semantics).
    empty_domains: frozenset[str]

    @property
    def return_type(self) -> str:
        return self.native.return_type

    def device_data(self, device: Device) -> dict[str, object]:
        return device_data(device, self.empty_domains)

    def evaluate(self, device: Device) -> bool:
        """True when the device is selected; raises CelEvalError as the API server's evaluation would fail."""
        return self.evaluate_data(self.device_data(device))

    def evaluate_data(self, data: dict[str, object]) -> bool:
        budget = _budget.get()
        if budget is not None:
            if budget.evaluations <= 0:
                budget.refused += 1
                raise CelEvalError(
                    "draguard's CEL runtime stopped: the request used its budget of "
                    f"{REQUEST_EVALUATIONS} device evaluations",
                    limit=True,
                )
            budget.evaluations -= 1
        try:
            ok, value = self.native.evaluate({"device": data})
        except _native.EvaluationAborted as exc:
            raise CelEvalError(f"draguard's CEL runtime stopped: {exc.message}", limit=True) from None
        if not ok:
            message = str(value)
            missing = message[len("no such key: "):] if message.startswith("no such key: ") else None
            raise CelEvalError(
                message, missing_key=missing, type_error=message.startswith("no such overload")
            )
        if not isinstance(value, bool):
            raise CelEvalError(
                f"must evaluate to bool, but the result is {cel_type_name(value)}",
                type_error=True,
            )
        return value


def _location(message: str) -> tuple[int | None, int | None]:
    found = _LOCATION.search(message)
    return (int(found.group(1)), int(found.group(2))) if found else (None, None)


def _error(
    check: str, message: str, fix: str = "", line: int | None = None, column: int | None = None
) -> CelIssue:
    return CelIssue(check, Severity.ERROR, message, fix, line, column)


def _literal_type(value: object) -> str:
    if value is None:
        return "null_type"
    return cel_type_name(value)


def _too_long(expression: str) -> CelIssue | None:
    size = len(expression.encode("utf-8", errors="surrogatepass"))
    if size > MAX_EXPRESSION_LENGTH:
        return _error(
            "cel/limits",
            f"expression is {size} bytes long; the limit is {MAX_EXPRESSION_LENGTH} (10 KiB)",
            "split the condition over several selectors (all must match) or simplify it",
        )
    return None


_MAX_CONSTANT_CALLS = 32


def _constant_call_error(ast: CheckedAst) -> str | None:
    seen: set[str] = set()
    for node, text in typecheck.constant_calls(ast):
        if text in seen:
            continue
        seen.add(text)
        if len(seen) > _MAX_CONSTANT_CALLS:
            # Each is a compile; a selector full of them would otherwise cost seconds. Missing a
            # late one only leaves that rejection to the API server.
            break
        try:
            ok, value = _native.compile_expression(text).evaluate({"device": {}})
        except (_native.CompileFailure, _native.EvaluationAborted):
            continue
        if not ok:
            line, column = ast.location(node.id)
            return f"ERROR: <input>:{line}:{column}: program instantiation failed: {value}"
    return None


def _spend(work: Callable[[str, int | None], fold.Unrolled], expression: str) -> str | None:
    """Run a fold with the request's evaluation budget (at admission): each piece it evaluates is one
    device evaluation, so a selector cannot make a request do more work than matching could."""
    budget = _budget.get()
    done = work(expression, None if budget is None else max(budget.evaluations, 0))
    if budget is not None:
        budget.evaluations -= done.pieces
        if done.exhausted:
            budget.refused += 1
            _uncacheable.set(True)  # a later request (or review) may have the budget for it
    return done.text


def _compile_uncached(expression: str, *, internal: bool = False) -> CompiledSelector | CelIssue:
    """`internal`: text draguard rewrote, which may use the reserved prefix."""
    issue = _too_long(expression)
    if issue is not None:
        return issue
    aliased = fold.exists_one_alias(expression)
    if aliased is not None:
        result = _compile_uncached(aliased)
        return replace(result, expression=expression) if isinstance(result, CompiledSelector) else result
    if phantom.RESERVED in expression and not internal:
        return _error("cel/type", f"ERROR: <input>:1:{expression.index(phantom.RESERVED) + 1}: undeclared "
                                  f"reference to '{phantom.RESERVED}...' (names starting {phantom.RESERVED} "
                                  "are not part of the Kubernetes environment)")
    depth = max(unsupported.max_depth(expression), unsupported.max_operator_chain(expression))
    if depth > unsupported.PARSER_NESTING:
        return _error(
            "cel/syntax",
            f"expression nests {depth} levels deep; the API server's CEL parser allows at most "
            f"{unsupported.PARSER_NESTING}",
            "remove redundant parentheses, or split the condition over several selectors",
        )
    try:
        native = _native.compile_expression(expression)
    except _native.CompileFailure as exc:
        if "recursion" in exc.message.lower():
            collapsed = phantom.collapse_parentheses(expression)
            if collapsed != expression:
                return _compile_uncached(collapsed)
            folded = _spend(fold.fold_deep, expression)
            if folded is not None:
                # Deep constant parts evaluated piece by piece; the rest is compiled as usual.
                result = _compile_uncached(folded)
                if isinstance(result, CompiledSelector):
                    return replace(result, expression=expression)
                return result
            bad_has = fold.invalid_has(expression)
            if bad_has is not None:
                return _error("cel/syntax",
                              f"ERROR: <input>:1:{bad_has + 1}: invalid argument to has() macro",
                              "has() takes a field selection: `has(device.attributes['d'].name)` or "
                              "`'name' in device.attributes['d']`", 1, bad_has + 1)
            hoisted = None if internal else fold.hoist_deep(expression)  # one pass: no loop
            if hoisted is not None:
                # Deep parts the whole evaluates anyway, bound by cel.bind: the same value, in pieces
                # the runtime can nest.
                result = _compile_uncached(hoisted, internal=True)
                if isinstance(result, CompiledSelector):
                    return replace(result, expression=expression)
                if result.check in ("cel/syntax", "cel/type"):
                    return result
            # The native runtime nests at most 32 levels deep (e.g. 33 parentheses or a 33-term `+`
            # chain); the API server allows more, so this is draguard's limit, not a rejection.
            nested = unsupported.nesting_issue(expression, exc.message.splitlines()[0])
            if nested is not None:
                return nested
            return _error(
                "cel/limits",
                f"expression nests {unsupported.max_depth(expression)} levels deep; the API server's CEL "
                f"parser allows at most {unsupported.PARSER_NESTING} (draguard's runtime stops at 32 levels)",
                "remove redundant parentheses, or split the condition over several selectors",
            )
        missing = unsupported.classify(expression, exc.message)
        if missing is not None:
            return missing
        check = "cel/syntax" if "Syntax error" in exc.message else "cel/type"
        line, column = _location(exc.message)
        return _error(check, exc.message, "", line, column)
    try:
        ast = decode_checked(native.serialized)
        analysis = analyse(ast)
    except RecursionError:
        nested = unsupported.nesting_issue(expression, "too deep for draguard's analysis")
        return nested or _error("cel/limits", "expression is nested too deeply to analyse",
                                "flatten the expression, e.g. split it over several selectors")
    for name, node_id in analysis.unknown_fields:
        line, column = ast.location(node_id)
        return _error(
            "cel/type",
            f"ERROR: <input>:{line}:{(column or 0) + 1}: undefined field '{name}'",
            "device has only driver, attributes and capacity (and allowMultipleAllocations)",
            line, None if column is None else column + 1,
        )
    mistyped = typecheck.type_error(ast) or typecheck.root_error(ast) or typecheck.regex_error(ast) \
        or _constant_call_error(ast)
    if mistyped is not None:
        line, column = _location(mistyped)
        return _error("cel/type", mistyped, "", line, column)
    for comparison in analysis.comparisons:
        if comparison.access.kind == "capacity":
            # Capacities are typed Quantity in the API server's environment: comparing one with a
            # literal is a compile error there ("found no matching overload").
            access = comparison.access
            line, column = ast.location(comparison.node_id)
            literal = str(comparison.constant)
            target = f"device.capacity['{access.domain}'].{access.name}"
            return _error(
                "cel/type",
                f"ERROR: <input>:{line}:{column}: found no matching overload for '{comparison.op}' "
                f"applied to '(Quantity, {_literal_type(comparison.constant)})'",
                f"compare quantities: {target}.compareTo(quantity('{literal}')) "
                f"{COMPARISON_SYMBOLS[comparison.op]} 0",
                line, column,
            )
    root = analysis.root
    if root is not None and (root.level in ("device", "root", "domain") or root.kind == "capacity"):
        what = "a Quantity" if root.kind == "capacity" and root.level == "value" else "a map"
        return _error(
            "cel/type",
            f"expression must evaluate to bool, but it returns {what}",
            "compare it, e.g. `device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0`",
            1, 1,
        )
    if native.return_type not in ("bool", "dyn"):
        return _error(
            "cel/type",
            f"expression must evaluate to bool, but its type is {native.return_type}",
            "compare the value, e.g. `... == 'x'`, or use a function that returns bool",
            1, 1,
        )
    unbounded = typecheck.unbounded_cost(ast) or sizes.unbounded(ast)
    if unbounded is not None:
        return _error(
            "cel/limits",
            f"estimated cost exceeds the limit of {MAX_COST}: the API server's estimate is unbounded "
            f"({unbounded})",
            "compare elements directly (e.g. `x in ['a', 'b']`) instead of building strings or lists",
        )
    if any(n.kind == "call" and n.function == "format" and n.target is not None and n.target.kind == "const"
           and isinstance(n.target.value, str) and _SCIENTIFIC.search(n.target.value) for n in ast.nodes()):
        # cel-go prints %e through golang.org/x/text ("1.234500×10⁰³"); the runtime prints C's form.
        return unsupported.issue("format() with %e (scientific notation, printed the golang.org/x/text way)",
                                 "1.31", "compare the number itself, not its formatted text")
    if any(n.kind == "call" and n.function == "cel.@mapInsert" for n in ast.nodes()):
        return unsupported.issue("transformMap/transformMapEntry (two-variable comprehensions)", "1.32")
    if analysis.cost > MAX_COST * COST_MARGIN or (analysis.cost > MAX_COST and cost_is_exact(ast)):
        return _error(
            "cel/limits",
            f"estimated cost {analysis.cost} exceeds the limit of {MAX_COST}",
            "avoid nested comprehensions (exists/all/map/filter) over large lists",
        )
    if analysis.cost > MAX_COST:
        # Within draguard's over-estimate of the API server's figure: it may well be accepted.
        return unsupported.issue(
            f"an estimated cost of {analysis.cost}, near the limit of {MAX_COST} (draguard's estimate runs "
            f"up to {COST_MARGIN}x above the API server's)", "1.31",
            "the API server decides; nesting fewer comprehensions keeps it well inside the limit",
        )
    if analysis.cost > UNROLL_COST:
        # Each piece is one evaluation of the request's budget (at admission), so a selector cannot
        # make a request evaluate more than it could by matching devices.
        unrolled = _spend(fold.unroll_constants, expression)
        if unrolled is not None:
            # Constant comprehensions beyond the runtime's iteration budget, evaluated element by
            # element; lint keeps the user's text, positions and analysis.
            result = _compile_uncached(unrolled)
            if isinstance(result, CompiledSelector):
                return replace(result, expression=expression, ast=ast, analysis=analysis)
    evaluated = native
    source, source_ast = expression, ast
    pinned_source = fold.pin_literals(expression)
    if pinned_source is not None:
        # Literals pinned first: the optional lookups of the rewrite below are past its parser.
        try:
            evaluated = _native.compile_expression(pinned_source)
            source, source_ast = pinned_source, decode_checked(evaluated.serialized)
        except (_native.CompileFailure, RecursionError):
            evaluated = native
    rewritten = phantom.rewrite(source, source_ast)
    if rewritten is not None:
        rewritten = fold.pin_literals(rewritten) or rewritten
    if rewritten is not None and rewritten != expression:
        try:
            evaluated = _native.compile_expression(rewritten)
        except _native.CompileFailure:
            rewritten = None
    if rewritten is None:
        # Not rewritable (source positions off): fall back to empty maps for the domains it names.
        domains = {a.domain for a in analysis.accesses}
        domains.update(s for s in analysis.string_constants if "." in s and len(s) <= 253)
        pinned = fold.pin_literals(expression)
        if pinned is not None:
            with contextlib.suppress(_native.CompileFailure):
                native = _native.compile_expression(pinned)
        return CompiledSelector(expression, native, ast, analysis, frozenset(domains | _STANDARD_DOMAINS))
    return CompiledSelector(expression, evaluated, ast, analysis, frozenset())


_cache: OrderedDict[str, tuple[CompiledSelector | CelIssue, int]] = OrderedDict()
_cache_bytes = 0
_cache_lock = threading.Lock()


class Budget:
    """What is left of one request's CEL budget (`compile_budget`)."""

    __slots__ = ("evaluations", "left", "refused")

    def __init__(self, left: int, evaluations: int) -> None:
        self.left = left
        self.evaluations = evaluations
        self.refused = 0  # compiles and evaluations refused for lack of budget


_budget: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("cel_compile_budget", default=None)
_uncacheable: contextvars.ContextVar[bool] = contextvars.ContextVar("cel_uncacheable", default=False)


class compile_budget:
    """Bound the never-seen selector text compiled and the device evaluations run inside the
    block (one admission request). An evaluation over the budget fails as draguard's runtime
    limit (`CelEvalError.limit`: verdict unknown, reported as cel/unsupported, never denied).
    A class, not contextlib.contextmanager: it is entered once per review, on the hot path."""

    __slots__ = ("_budget", "_token")

    def __init__(self, limit: int = REQUEST_COMPILE_BYTES, evaluations: int = REQUEST_EVALUATIONS) -> None:
        self._budget = Budget(limit, evaluations)
        self._token: contextvars.Token[Budget | None] | None = None

    def __enter__(self) -> Budget:
        self._token = _budget.set(self._budget)
        return self._budget

    def __exit__(self, *_exc: object) -> None:
        if self._token is not None:
            _budget.reset(self._token)
            self._token = None


def entry_bytes(expression: str, result: CompiledSelector | CelIssue) -> int:
    """Estimated memory of one cache entry."""
    size = len(expression.encode("utf-8", errors="surrogatepass"))
    if isinstance(result, CelIssue):
        return 1024 + size * 2
    return _ENTRY_OVERHEAD + size * _BYTES_PER_CHAR


def cache_stats() -> tuple[int, int]:
    """(entries, estimated bytes) of the compile cache."""
    with _cache_lock:
        return len(_cache), _cache_bytes


def _over_budget(expression: str) -> CelIssue:
    return CelIssue(
        unsupported.CHECK,
        Severity.WARNING,
        "over draguard's per-request CEL budget (new selector text per request and per second): "
        "not checked by draguard; the API server still checks it",
        "apply again later, split very large selectors over several objects, or reuse selector text "
        "draguard has seen",
    )


def compile_or_issue(expression: str) -> CompiledSelector | CelIssue:
    """Compile (cached by text): the selector, or the CelIssue the API server would reject it with."""
    global _cache_bytes
    with _cache_lock:
        hit = _cache.get(expression)
        if hit is not None:
            _cache.move_to_end(expression)
            return hit[0]
    budget = _budget.get()
    size = len(expression.encode("utf-8", errors="surrogatepass"))
    if budget is not None and size <= MAX_EXPRESSION_LENGTH:  # longer: refused without compiling
        if size > budget.left:
            budget.refused += 1
            return _over_budget(expression)
        budget.left -= size
    token = _uncacheable.set(False)
    try:
        result = _compile_uncached(expression)
        partial = _uncacheable.get()
    finally:
        _uncacheable.reset(token)
    weight = entry_bytes(expression, result)
    if weight > CACHE_BYTES // 8 or partial:
        return result  # never one entry for an eighth of the cache, nor one the budget cut short
    with _cache_lock:
        old = _cache.pop(expression, None)
        if old is not None:
            _cache_bytes -= old[1]
        _cache[expression] = (result, weight)
        _cache_bytes += weight
        while _cache_bytes > CACHE_BYTES and _cache:
            _cache_bytes -= _cache.popitem(last=False)[1][1]
    return result


def compile_selector(expression: str) -> CompiledSelector:
    """Compile (cached by text); raises CelCompileError carrying the CelIssue."""
    result = compile_or_issue(expression)
    if isinstance(result, CelIssue):
        raise CelCompileError(result)
    return result


def clear_cache() -> None:
    """Forget compiled expressions (benchmarks and tests)."""
    global _cache_bytes
    with _cache_lock:
        _cache.clear()
        _cache_bytes = 0
