"""A seeded random generator of DRA CEL selectors and devices, judged by Kubernetes' own CEL code.

Selectors are drawn from a typed grammar of the environment the API server gives DRA selectors:
every operator, the macros (`has`, `all`, `exists`, `exists_one`, `map`, `filter`, their
two-variable forms, `cel.bind`), the Kubernetes libraries (quantity, semver, lists, regex, IP/CIDR,
URL, `sets.*`, strings, optional) and attribute and capacity lookups of every type in published,
foreign and unknown domains. A share of the draws is deliberately off: a wrong operand type, a
literal that fails at evaluation (`1 / 0`, `semver('bad')`), deep or long shapes, comprehensions
whose estimated cost nears or passes the limit. Devices carry attributes of every type (string,
int, bool, version), sometimes under an unusual type for a name, and capacities.

Each selector is paired with several devices; tools/celoracle (the API server's create-time
validation and the scheduler's evaluation) and draguard answer every pair, compared on what a user
sees: the API server rejects the selector / the device is selected / it is not.

    .venv/bin/python -m tests.cel.generate [SEED] [PAIRS]   # print disagreements and the figures
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.cel.corpus import oracle_device
from webhook.cel.env import CelEvalError, compile_or_issue
from webhook.cel.issues import CelIssue
from webhook.dra.device import AttrValue, Device, Version

REJECTING = frozenset({"cel/syntax", "cel/type", "cel/limits"})
DEVICES_PER_SELECTOR = 5

NV = "gpu.nvidia.com"
K8S = "resource.kubernetes.io"
FPGA = "fpga.example.com"
OTHER = "other.example.com"
MISSING = "missing.example.com"
DOMAINS = (NV, K8S, FPGA, OTHER, MISSING)
DRIVERS = (NV, FPGA, "x.example.com")

# Names and the type each usually has; devices sometimes publish a name under another type.
STRING_NAMES = ("productName", "type", "model", "zone", "uuid")
INT_NAMES = ("index", "lanes", "minor")
BOOL_NAMES = ("migEnabled", "enabled")
VERSION_NAMES = ("driverVersion", "cudaComputeCapability")
CAPACITY_NAMES = ("memory", "multiprocessors", "luts", "fraction")
STRINGS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100 80GB PCIe", "NVIDIA L4", "gpu", "mig", "u250", "b", "",
           "3g.40gb", "GPU-7a1c", "a b c", "10.0.0.1")
VERSIONS = ("570.86.10", "550.54.15", "9.0.0", "8.0.0", "580.0.1-rc.1+build.7", "1.0.0")
QUANTITIES = ("81559Mi", "40Gi", "42", "1728k", "500m", "0", "64Gi", "1Pi", "1.5Gi", "23034Mi", "-1")


def _attr_value(rng: random.Random, name: str) -> AttrValue:
    odd = rng.random() < 0.1  # the name under another type than usual
    kind = rng.choice(("s", "i", "b", "v")) if odd else (
        "s" if name in STRING_NAMES else "i" if name in INT_NAMES else "b" if name in BOOL_NAMES else "v")
    if kind == "s":
        return rng.choice(STRINGS)
    if kind == "i":
        return rng.choice((0, 1, 3, -16, 42, 9223372036854775807, -9223372036854775808))
    if kind == "b":
        return rng.random() < 0.5
    return Version(rng.choice(VERSIONS))


def random_device(rng: random.Random, index: int) -> Device:
    driver = rng.choice(DRIVERS)
    attributes: dict[str, dict[str, AttrValue]] = {}
    capacity: dict[str, dict[str, str]] = {}
    if index > 0:  # device 0 publishes nothing
        names = STRING_NAMES + INT_NAMES + BOOL_NAMES + VERSION_NAMES
        for domain in rng.sample(DOMAINS[:4], rng.randint(1, 3)):
            picked = rng.sample(names, rng.randint(1, len(names)))
            attributes[domain] = {n: _attr_value(rng, n) for n in picked}
        for domain in rng.sample(DOMAINS[:3], rng.randint(0, 2)):
            picked = rng.sample(CAPACITY_NAMES, rng.randint(1, len(CAPACITY_NAMES)))
            capacity[domain] = {n: rng.choice(QUANTITIES) for n in picked}
    return Device(driver=driver, pool="pool", name=f"dev-{index}", node="node-1", attributes=attributes,
                  capacity=capacity, allow_multiple_allocations=rng.random() < 0.3)


def random_devices(rng: random.Random, count: int) -> list[Device]:
    return [random_device(rng, i) for i in range(count)]


def _q(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Grammar:
    """Typed productions; `expr(type, depth)` returns CEL text of that type (mostly)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.vars: list[tuple[str, str]] = []  # comprehension variables in scope: (name, type)
        self._n = 0

    def pick(self, *choices: Callable[[int], str], depth: int) -> str:
        return self.rng.choice(choices)(depth)

    def var(self, kind: str) -> str | None:
        names = [n for n, t in self.vars if t == kind]
        return self.rng.choice(names) if names and self.rng.random() < 0.5 else None

    def fresh(self) -> str:
        self._n += 1
        return f"v{self._n}"

    # ---- lookups --------------------------------------------------------------------------------
    def domain(self) -> str:
        return self.rng.choice((*DOMAINS, NV, NV))

    def attr(self, names: tuple[str, ...]) -> str:
        r = self.rng.random()
        base = f"device.attributes[{_q(self.domain())}]"
        name = self.rng.choice(names) if r < 0.92 else self.rng.choice(("nope", "profile"))
        return f"{base}.{name}" if self.rng.random() < 0.7 else f"{base}[{_q(name)}]"

    def cap(self) -> str:
        base = f"device.capacity[{_q(self.rng.choice((NV, NV, FPGA, K8S, MISSING)))}]"
        return f"{base}.{self.rng.choice(CAPACITY_NAMES)}"

    # ---- productions by type --------------------------------------------------------------------
    def expr(self, kind: str, depth: int) -> str:
        v = self.var(kind)
        if v is not None:
            return v
        if depth <= 0:
            return self.leaf(kind)
        make = getattr(self, "g_" + kind)
        text: str = make(depth - 1)
        return text

    def leaf(self, kind: str) -> str:
        r = self.rng
        match kind:
            case "bool":
                return r.choice(("true", "false", self.attr(BOOL_NAMES), "device.allowMultipleAllocations",
                                 f"has({self.attr(STRING_NAMES)})",
                                 f"{_q(self.domain())} in device.attributes"))
            case "int":
                return r.choice((str(r.randint(-5, 50)), "9223372036854775807", "-9223372036854775808",
                                 self.attr(INT_NAMES), f"size(device.attributes[{_q(self.domain())}])"))
            case "uint":
                return r.choice(("0u", "1u", "18446744073709551615u", f"{r.randint(0, 9)}u"))
            case "double":
                return r.choice(("0.5", "1.0", "2.5", "-1.5", "1e300", "3.0"))
            case "string":
                return r.choice((_q(r.choice(STRINGS)), self.attr(STRING_NAMES), "device.driver"))
            case "list_int":
                return r.choice(("[1, 2, 3]", "[]", "[3, 1, 2, 2]", "lists.range(4)", "[0]"))
            case "list_string":
                return r.choice(("['a', 'b']", "['gpu', 'mig']", f"{self.attr(STRING_NAMES)}.split(' ')"))
            case "semver":
                return r.choice((f"semver({_q(r.choice(VERSIONS))})", self.attr(VERSION_NAMES)))
            case "quantity":
                return r.choice((f"quantity({_q(r.choice(QUANTITIES))})", self.cap()))
            case "map":
                return r.choice((f"device.attributes[{_q(self.domain())}]",
                                 f"device.capacity[{_q(self.domain())}]",
                                 "{'a': 1, 'b': 2}", "device.attributes"))
            case _:
                return "dyn(1)"

    def g_bool(self, d: int) -> str:
        r = self.rng
        n = r.randrange(24)
        e = self.expr
        if n == 0:
            return f"({e('bool', d)} {r.choice(('&&', '||'))} {e('bool', d)})"
        if n == 1:
            return f"!{e('bool', d)}"
        if n == 2:
            return f"({e('bool', d)} ? {e('bool', d)} : {e('bool', d)})"
        if n in (3, 4):
            a, b = r.choice((("int", "int"), ("int", "uint"), ("int", "double"), ("uint", "double"),
                             ("double", "double"), ("string", "string"), ("int", "int")))
            op = r.choice(("==", "!=", "<", "<=", ">", ">="))
            return f"{e(a, d)} {op} {e(b, d)}"
        if n == 5:
            m = r.choice(("startsWith", "endsWith", "contains", "matches"))
            patterns = ("NVIDIA", "100", "[0-9]+", "^gpu$", "(?i)nvidia", "a|b", "")
            arg = _q(r.choice(patterns)) if r.random() < 0.7 else e("string", d)
            return f"{e('string', d)}.{m}({arg})"
        if n == 6:
            return f"{e('string', d)} in {e('list_string', d)}" if r.random() < 0.5 \
                else f"{e('int', d)} in {e('list_int', d)}"
        if n == 7:
            return f"has({self.attr(STRING_NAMES + INT_NAMES)})" if r.random() < 0.7 \
                else f"has(device.{r.choice(('attributes', 'capacity'))}.{r.choice(('gpu', 'nodots', 'x'))})"
        if n == 8:
            if r.random() < 0.6:
                return f"{_q(self.domain())} in device.{r.choice(('attributes', 'capacity'))}"
            return f"{_q(r.choice(STRING_NAMES + CAPACITY_NAMES))} in {self.leaf('map')}"
        if n == 9:
            m = r.choice(("isGreaterThan", "isLessThan"))
            return f"{e('semver', d)}.{m}({e('semver', d)})" if r.random() < 0.5 \
                else f"{e('semver', d)}.compareTo({e('semver', d)}) {r.choice(('==', '<=', '>'))} 0"
        if n == 10:
            m = r.choice(("isGreaterThan", "isLessThan"))
            return f"{e('quantity', d)}.{m}({e('quantity', d)})" if r.random() < 0.5 \
                else f"{e('quantity', d)}.compareTo({e('quantity', d)}) {r.choice(('==', '>=', '<'))} 0"
        if n in (11, 12):
            return self.comprehension(d)
        if n == 13:
            f = r.choice(("isSemver", "isQuantity", "isIP", "isCIDR", "isURL"))
            arg = r.choice(("'1.2.3'", "'1.2'", "'40Gi'", "'10.0.0.1'", "'10.0.0.0/8'", "'https://a.example'",
                            "'bad'", "''"))
            return f"{f}({arg})" if r.random() < 0.7 else f"{f}({e('string', d)})"
        if n == 14:
            f = r.choice(("contains", "intersects", "equivalent"))
            return f"sets.{f}({e('list_int', d)}, {e('list_int', d)})" if r.random() < 0.5 \
                else f"sets.{f}({e('list_string', d)}, {e('list_string', d)})"
        if n == 15:
            return f"{e('list_int', d)}.isSorted()"
        if n == 16:
            x = self.fresh()
            t = r.choice(("int", "string", "map", "bool"))
            val = self.expr(t, d)
            self.vars.append((x, t))
            try:
                body = e("bool", d)
            finally:
                self.vars.pop()
            return f"cel.bind({x}, {val}, {body})"
        if n == 17:
            dom = _q(self.domain())
            name = _q(r.choice(STRING_NAMES + INT_NAMES + ("profile",)))
            return r.choice((f"device.attributes[{dom}][?{name}].hasValue()",
                             f"device.attributes[{dom}].?{name[1:-1]}.orValue('x') == 'x'",
                             f"optional.of({e('int', d)}).hasValue()",
                             f"{e('list_int', d)}.first().hasValue()"))
        if n == 18:
            return self.net_bool(d)
        if n == 19:
            if r.random() < 0.6:
                return f"{self.attr(BOOL_NAMES)}"
            return f"{self.attr(BOOL_NAMES)} == {e('bool', d)}"
        if n == 20:
            return self.faulty(d)
        if n == 21:
            return f"{self.attr(VERSION_NAMES)} {r.choice(('==', '!='))} {e('semver', d)}"
        if n == 22:
            return f"{e('quantity', d)}.isInteger()"
        return f"{e('list_string', d)} == {e('list_string', d)}" if r.random() < 0.5 \
            else f"size({e('list_int', d)}) {r.choice(('==', '>', '<='))} {e('int', d)}"

    def net_bool(self, d: int) -> str:
        r = self.rng
        return r.choice((
            "ip('10.0.0.1').family() == 4", "ip('::1').isLoopback()",
            "cidr('10.0.0.0/8').containsIP(ip('10.1.2.3'))",
            "cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16')", "ip('fe80::1').isLinkLocalUnicast()",
            "url('https://example.com:8443/a?b=c').getPort() == '8443'", "ip.isCanonical('10.0.0.1')",
            f"isIP({self.expr('string', d)})", "cidr('10.0.0.0/8').prefixLength() == 8",
            "url('https://example.com/?b=c').getQuery()['b'] == ['c']",
        ))

    def faulty(self, d: int) -> str:
        """Literals and shapes that compile but fail at evaluation, or that the API server refuses."""
        r = self.rng
        e = self.expr
        return r.choice((
            f"{e('int', d)} / 0 == 1", f"{e('int', d)} % 0 == 0", "9223372036854775807 + 1 > 0",
            "-9223372036854775808 - 1 < 0", "0u - 1u == 0u", "[1, 2][5] == 1", "'abc'.charAt(5) == ''",
            "semver('bad') == semver('1.0.0')", "semver('1.2').major() == 1", "quantity('40GiB').isInteger()",
            "url('bad url').getHost() == ''", "ip('bad').family() == 4", "int('x') == 1", "uint(-1) == 0u",
            f"{self.attr(STRING_NAMES)} > 1", f"{self.attr(STRING_NAMES)}.isGreaterThan(semver('1.0.0'))",
            "dyn(1) + 'a' == 'b'", "device.attributes == 1", f"{self.attr(STRING_NAMES)}",
            f"device.attributes[{_q(self.domain())}] != null", f"{self.attr(INT_NAMES)} == 'x'",
            f"'%s'.format([{self.attr(STRING_NAMES)}]) == 'x'",
            f"'%d'.format([{self.attr(INT_NAMES)}]) == '1'",
            f"{self.attr(STRING_NAMES)}.split(' ').all(w, w.size() > 0)",
            f"{self.attr(STRING_NAMES)}.split('').exists(c, c == 'x')",
            f"{e('bool', d)} || {self.attr(STRING_NAMES)} == 'x'", f"true || {self.attr(INT_NAMES)} > 0",
            f"{self.attr(INT_NAMES)} > 0 || true", f"false && {self.attr(INT_NAMES)} > 0",
            f"{self.attr(INT_NAMES)} > 0 && false", f"{self.attr(STRING_NAMES)} == 1",
            "1 + 'a' == 2", "[1, 'a'].size() == 2", "x == 1", "device.foo == 1", "'a' == 1",
            f"{self.attr(STRING_NAMES)}.size()", "'unterminated", "1 +", "",
            "(" * 40 + "true" + ")" * 40,
        )) if r.random() < 0.97 else self.deep(d)

    def deep(self, d: int) -> str:
        r = self.rng
        n = r.choice((20, 31, 33, 40, 64, 100))
        kind = r.randrange(4)
        if kind == 0:
            return "(" * n + self.expr("bool", 1) + ")" * n
        if kind == 1:
            return "1" + " + 1" * n + f" > {self.expr('int', 0)}"
        if kind == 2:
            return " && ".join(self.expr("bool", 1) for _ in range(min(n, 40)))
        inner = self.expr("bool", 0)
        for _ in range(min(n, 40)):
            inner = f"[{inner}][0]"
        return inner

    def comprehension(self, d: int) -> str:
        r = self.rng
        source_kind = r.choice(("list_int", "list_int", "list_string", "map", "range"))
        if source_kind == "range":
            source = f"lists.range({r.choice((3, 10, 100, 400, 1200))})"
            elem = "int"
        elif source_kind == "map":
            source = r.choice((f"device.attributes[{_q(self.domain())}]", "device.attributes",
                               "device.capacity", "{'a': 1, 'b': 2}"))
            elem = "string"
        else:
            source = self.expr(source_kind, d)
            elem = "int" if source_kind == "list_int" else "string"
        x = self.fresh()
        macro = r.choice(("all", "exists", "exists_one", "all2", "exists2", "existsOne2", "exists_one2",
                          "filter", "map", "transformList"))
        if macro.endswith("2") or macro == "transformList":
            i = self.fresh()
            second = "string" if source_kind == "map" else elem
            first = "string" if source_kind == "map" else "int"
            self.vars.extend([(i, first), (x, second if source_kind != "map" else "dyn")])
            try:
                body = self.expr("bool", d)
                if macro == "transformList":
                    return f"{source}.transformList({i}, {x}, {body}).size() >= 0"
                return f"{source}.{macro[:-1]}({i}, {x}, {body})"
            finally:
                del self.vars[-2:]
        self.vars.append((x, elem))
        try:
            body = self.expr("bool", d)
            if macro == "filter":
                return f"{source}.filter({x}, {body}).size() {r.choice(('>', '==', '<='))} {r.randint(0, 3)}"
            if macro == "map":
                return f"{source}.map({x}, {body}).exists(b, b)"
            return f"{source}.{macro}({x}, {body})"
        finally:
            self.vars.pop()

    def g_int(self, d: int) -> str:
        r = self.rng
        e = self.expr
        n = r.randrange(14)
        if n == 0:
            return f"({e('int', d)} {r.choice(('+', '-', '*', '/', '%'))} {e('int', d)})"
        if n == 1:
            return f"size({e(r.choice(('string', 'list_int', 'list_string', 'map')), d)})"
        if n == 2:
            return f"{e('list_int', d)}.{r.choice(('sum', 'min', 'max'))}()"
        if n == 3:
            return f"{e('semver', d)}.{r.choice(('major', 'minor', 'patch'))}()"
        if n == 4:
            return f"{e('quantity', d)}.asInteger()"
        if n == 5:
            return f"{e('quantity', d)}.compareTo({e('quantity', d)})"
        if n == 6:
            return f"{e('string', d)}.indexOf({_q(r.choice(('a', '1', ' ', '')))})" if r.random() < 0.5 \
                else f"{e('list_int', d)}.indexOf({e('int', d)})"
        if n == 7:
            return f"int({r.choice((e('double', d), e('uint', d), _q('12'), _q('x')))})"
        if n == 8:
            return f"{e('string', d)}.size()"
        if n == 9:
            return f"{e('list_int', d)}[{r.randint(0, 3)}]"
        if n == 10:
            return f"-{e('int', d)}"
        if n == 11:
            if r.random() < 0.5:
                return f"math.{r.choice(('greatest', 'least'))}({e('int', d)}, {e('int', d)})"
            return f"math.abs({e('int', d)})"
        if n == 12:
            return f"{e('semver', d)}.compareTo({e('semver', d)})"
        return self.attr(INT_NAMES)

    def g_uint(self, d: int) -> str:
        r = self.rng
        e = self.expr
        n = r.randrange(3)
        if n == 0:
            return f"({e('uint', d)} {r.choice(('+', '-', '*', '/', '%'))} {e('uint', d)})"
        if n == 1:
            return f"uint({r.choice((e('int', d), e('double', d)))})"
        return self.leaf("uint")

    def g_double(self, d: int) -> str:
        r = self.rng
        e = self.expr
        n = r.randrange(4)
        if n == 0:
            return f"({e('double', d)} {r.choice(('+', '-', '*', '/'))} {e('double', d)})"
        if n == 1:
            return f"{e('quantity', d)}.asApproximateFloat()"
        if n == 2:
            return f"double({r.choice((e('int', d), e('uint', d), _q('1.5')))})"
        return self.leaf("double")

    def g_string(self, d: int) -> str:
        r = self.rng
        e = self.expr
        n = r.randrange(13)
        if n == 0:
            return f"({e('string', d)} + {e('string', d)})"
        if n == 1:
            return f"{e('string', d)}.{r.choice(('lowerAscii', 'upperAscii', 'trim', 'reverse'))}()"
        if n == 2:
            return f"{e('string', d)}.replace({_q(r.choice(('NVIDIA ', 'a', '')))}, {_q('x')})"
        if n == 3:
            return f"{e('string', d)}.substring({r.randint(0, 8)})" if r.random() < 0.5 \
                else f"{e('string', d)}.substring({r.randint(0, 4)}, {r.randint(0, 12)})"
        if n == 4:
            return f"{e('string', d)}.charAt({r.randint(0, 12)})"
        if n == 5:
            return f"{e('list_string', d)}[{r.randint(0, 2)}]"
        if n == 6:
            return f"{e('list_string', d)}.join({_q(r.choice(('-', '')))})"
        if n == 7:
            fmt = r.choice(("%s", "%d", "%s-%s", "%x", "%.2f"))
            args = r.choice(("['a']", "[1]", "['a', 'b']", "[1.5]", "[255]", f"[{self.attr(STRING_NAMES)}]"))
            return f"{_q(fmt)}.format({args})"
        if n == 8:
            return f"string({e(r.choice(('int', 'uint', 'double', 'bool')), d)})"
        if n == 9:
            return f"{e('string', d)}.find({_q(r.choice(('[0-9]+', 'A|H', 'x')))})"
        if n == 10:
            return f"strings.quote({e('string', d)})"
        if n == 11:
            if r.random() < 0.3:
                return f"{e('semver', d)}.major() > 0 ? 'y' : 'n'"
            return self.attr(STRING_NAMES)
        return self.leaf("string")

    def g_list_int(self, d: int) -> str:
        r = self.rng
        e = self.expr
        n = r.randrange(9)
        if n == 0:
            return f"[{', '.join(e('int', d) for _ in range(r.randint(0, 4)))}]"
        if n == 1:
            return f"({e('list_int', d)} + {e('list_int', d)})"
        if n == 2:
            return f"{e('list_int', d)}.{r.choice(('sort', 'distinct', 'reverse'))}()"
        if n == 3:
            return f"{e('list_int', d)}.slice(0, {r.randint(0, 3)})"
        if n == 4:
            return f"lists.range({r.randint(0, 6)})"
        if n == 5:
            x = self.fresh()
            return f"{e('list_int', d)}.map({x}, {x} * 2)"
        if n == 6:
            x = self.fresh()
            return f"{e('list_int', d)}.filter({x}, {x} > {r.randint(0, 3)})"
        if n == 7:
            return f"{e('string', d)}.split(' ').map(w, w.size())"
        return self.leaf("list_int")

    def g_list_string(self, d: int) -> str:
        r = self.rng
        e = self.expr
        n = r.randrange(6)
        if n == 0:
            return f"[{', '.join(e('string', d) for _ in range(r.randint(0, 3)))}]"
        if n == 1:
            return f"{e('string', d)}.split({_q(r.choice((' ', '', '-')))})"
        if n == 2:
            return f"{e('string', d)}.findAll('[0-9]+')"
        if n == 3:
            return f"device.attributes[{_q(self.domain())}].map(k, k)"
        if n == 4:
            return f"{e('list_string', d)}.sort()"
        return self.leaf("list_string")

    def g_semver(self, d: int) -> str:
        r = self.rng
        if r.random() < 0.15:
            return f"semver({_q(r.choice(('v1.2.3', '1.2', '01.2.3', 'bad')))}, true)"
        return self.leaf("semver")

    def g_quantity(self, d: int) -> str:
        r = self.rng
        if r.random() < 0.3:
            target = self.expr("quantity", d)
            method = r.choice(("add", "sub"))
            return f"{target}.{method}({r.choice(('1', self.expr('quantity', d)))})"
        return self.leaf("quantity")

    def g_map(self, d: int) -> str:
        return self.leaf("map")

    def g_dyn(self, d: int) -> str:
        return self.rng.choice((f"dyn({self.expr('int', d)})", f"dyn({self.expr('string', d)})",
                                self.attr(STRING_NAMES + INT_NAMES)))

    def selector(self) -> str:
        self.vars.clear()
        r = self.rng.random()
        if r < 0.04:
            return self.expr(self.rng.choice(("int", "string", "map", "quantity", "dyn")), 2)  # not bool
        if r < 0.06:
            return self.deep(2)
        return self.expr("bool", self.rng.randint(1, 4))


def random_selectors(seed: int, count: int) -> list[str]:
    grammar = Grammar(random.Random(seed))
    seen: set[str] = set()
    out: list[str] = []
    attempts = 0
    while len(out) < count and attempts < count * 20:
        attempts += 1
        s = grammar.selector()
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


@dataclass(frozen=True, slots=True)
class GeneratedPair:
    selector: str
    device: Device
    kubernetes: str
    draguard: str
    k8s_detail: str
    dg_detail: str

    @property
    def agrees(self) -> bool:
        return self.kubernetes == self.draguard

    def describe(self) -> str:
        sel = self.selector if len(self.selector) < 300 else self.selector[:297] + "..."
        return (f"k8s={self.kubernetes} draguard={self.draguard} device={self.device.name} :: {sel}\n"
                f"    k8s: {self.k8s_detail[:240]}\n    draguard: {self.dg_detail[:240]}")


def corpus(seed: int, pairs: int) -> list[tuple[str, Device]]:
    """`pairs` (selector, device) pairs: each selector with DEVICES_PER_SELECTOR devices of a pool."""
    rng = random.Random(seed * 7919 + 1)
    pool = random_devices(rng, 48)
    selectors = random_selectors(seed, -(-pairs // DEVICES_PER_SELECTOR))
    out: list[tuple[str, Device]] = []
    for s in selectors:
        for device in [pool[0], *rng.sample(pool[1:], DEVICES_PER_SELECTOR - 1)]:
            out.append((s, device))
    return out[:pairs]


def oracle(binary: Path, items: list[tuple[str, Device]]) -> list[dict[str, object]]:
    """Kubernetes' verdict per pair, in one run of the oracle."""
    lines = [json.dumps({"id": i, "selector": s, "driver": d.driver, "device": oracle_device(d)})
             for i, (s, d) in enumerate(items)]
    res = subprocess.run([str(binary)], input="\n".join(lines) + "\n", capture_output=True, text=True,
                         timeout=600, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"celoracle failed ({res.returncode}): {res.stderr[-2000:]}")
    out: list[dict[str, object]] = [{} for _ in items]
    for line in res.stdout.splitlines():
        row = json.loads(line)
        out[row["id"]] = row
    return out


def k8s_outcome(row: dict[str, object]) -> tuple[str, str]:
    create = row["create"]
    assert isinstance(create, dict)
    if create["rejected"]:
        return "rejected", "; ".join(create.get("class") or create.get("claim") or [])
    if row.get("eval") == "match":
        return "selects", ""
    return "no", str(row.get("error", ""))


def draguard_outcome(selector: str, device: Device) -> tuple[str, str]:
    compiled = compile_or_issue(selector)
    if isinstance(compiled, CelIssue):
        if compiled.check in REJECTING:
            return "rejected", f"{compiled.check}: {compiled.message}"
        return "unsupported", f"{compiled.check}: {compiled.message}"
    try:
        selected = compiled.evaluate(device)
    except CelEvalError as exc:
        return ("undecided" if exc.limit else "no"), exc.message
    return ("selects" if selected else "no"), ""


def compare(binary: Path, items: list[tuple[str, Device]]) -> list[GeneratedPair]:
    rows = oracle(binary, items)
    out = []
    for (selector, device), row in zip(items, rows, strict=True):
        k, kd = k8s_outcome(row)
        d, dd = draguard_outcome(selector, device)
        out.append(GeneratedPair(selector, device, k, d, kd, dd))
    return out


def summary(pairs: list[GeneratedPair]) -> str:
    bad = [p for p in pairs if not p.agrees]
    kinds = Counter((p.kubernetes, p.draguard) for p in bad)
    false_rej = sum(p.draguard == "rejected" and p.kubernetes != "rejected" for p in pairs)
    rate = 100 * (1 - len(bad) / max(len(pairs), 1))
    return (f"pairs {len(pairs)}, agree {len(pairs) - len(bad)} ({rate:.2f} %), "
            f"false rejections {false_rej}; by (kubernetes, draguard): {dict(kinds)}")


def main(argv: list[str]) -> int:
    sys.setrecursionlimit(10000)
    seed = int(argv[0]) if argv else 31
    count = int(argv[1]) if len(argv) > 1 else 20000
    binary = Path(subprocess.run(["bash", "scripts/build-tools.sh", "--path", "celoracle"], check=True,
                                 capture_output=True, text=True).stdout.strip())
    pairs = compare(binary, corpus(seed, count))
    for p in pairs:
        if not p.agrees:
            print(p.describe())
    print(f"seed {seed}: {summary(pairs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
