"""The differential CEL corpus: (selector, device) pairs by family, plus a seeded random generator.

Each family is a list of selectors; every selector is paired with every corpus device, so the
corpus has len(selectors) x len(DEVICES) pairs. Devices are built both as draguard's `Device` and
in the `resource.k8s.io/v1` JSON form tools/celoracle reads.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from webhook.dra.device import AttrValue, Device, Version

NV = "gpu.nvidia.com"
K8S = "resource.kubernetes.io"
FPGA = "fpga.example.com"
OTHER = "other.example.com"


def _device(name: str, driver: str, attributes: dict[str, dict[str, AttrValue]],
            capacity: dict[str, dict[str, str]], multi: bool = False) -> Device:
    return Device(driver=driver, pool="pool", name=name, node="node-1", attributes=attributes,
                  capacity=capacity, allow_multiple_allocations=multi)


DEVICES: tuple[Device, ...] = (
    _device("h100", NV, {
        NV: {"type": "gpu", "uuid": "GPU-7a1c", "productName": "NVIDIA H100 80GB HBM3",
             "architecture": "Hopper",
             "brand": "Nvidia", "index": 3, "minor": 3, "cudaComputeCapability": Version("9.0.0"),
             "driverVersion": Version("570.86.10"), "cudaDriverVersion": Version("12.8.0"),
             "addressingMode": "None", "migEnabled": False},
        K8S: {"pciBusID": "0000:1b:00.0"},
    }, {NV: {"memory": "81559Mi", "multiprocessors": "132"}}),
    _device("a100-mig", NV, {
        NV: {"type": "mig", "uuid": "MIG-0b2e", "parentUUID": "GPU-5d3f",
             "productName": "NVIDIA A100 80GB PCIe",
             "profile": "3g.40gb", "index": 0, "parentIndex": 1, "driverVersion": Version("550.54.15"),
             "cudaComputeCapability": Version("8.0.0")},
        K8S: {"pciBusID": "0000:3b:00.0"},
    }, {NV: {"memory": "40Gi", "multiprocessors": "42", "copyEngines": "3"}}),
    _device("l4-prerelease", NV, {
        NV: {"type": "gpu", "uuid": "GPU-99aa", "productName": "NVIDIA L4", "architecture": "Ada Lovelace",
             "index": 0, "driverVersion": Version("580.0.1-rc.1+build.7"), "migEnabled": True},
    }, {NV: {"memory": "23034Mi"}, K8S: {"power": "72"}}, multi=True),
    _device("fpga", FPGA, {
        FPGA: {"model": "u250", "productName": "NVIDIA A100 80GB PCIe", "lanes": -16, "enabled": True},
        OTHER: {"zone": "b"},
    }, {FPGA: {"luts": "1728k", "memory": "64Gi", "fraction": "500m"}}),
    _device("bare", "x.example.com", {}, {}),
)


def oracle_device(device: Device) -> dict[str, object]:
    """The device in resource.k8s.io/v1 JSON form (qualified attribute names)."""
    attributes: dict[str, dict[str, object]] = {}
    for domain, values in device.attributes.items():
        for name, value in values.items():
            if isinstance(value, bool):
                typed: dict[str, object] = {"bool": value}
            elif isinstance(value, int):
                typed = {"int": value}
            elif isinstance(value, Version):
                typed = {"version": str(value)}
            else:
                typed = {"string": value}
            attributes[f"{domain}/{name}"] = typed
    capacity = {f"{d}/{n}": {"value": v} for d, caps in device.capacity.items() for n, v in caps.items()}
    out: dict[str, object] = {"name": device.name, "attributes": attributes, "capacity": capacity}
    if device.allow_multiple_allocations:
        out["allowMultipleAllocations"] = True
    return out


@dataclass(frozen=True, slots=True)
class Case:
    family: str
    selector: str


A = f"device.attributes['{NV}']"
C = f"device.capacity['{NV}']"


def _attribute_lookups() -> Iterator[str]:
    domains = (NV, K8S, FPGA, OTHER, "missing.example.com")
    for domain in domains:
        base = f"device.attributes['{domain}']"
        for name in ("productName", "type", "model", "pciBusID", "zone", "nope"):
            yield f"{base}.{name} == 'NVIDIA A100 80GB PCIe'"
            yield f"{base}['{name}'].startsWith('NVIDIA')"
            yield f"{base}.{name} != 'u250'"
        for name in ("index", "lanes", "minor"):
            yield f"{base}.{name} == 3"
            yield f"{base}.{name} > 0"
            yield f"{base}.{name} <= -16"
        for name in ("migEnabled", "enabled"):
            yield f"{base}.{name}"
            yield f"!{base}.{name}"
            yield f"{base}.{name} == true"
    yield f"{A}.productName == 1"
    yield f"{A}.index == 'three'"
    yield f"{A}.index < 'three'"
    yield f"{A}.productName + '-x' == 'NVIDIA L4-x'"
    yield f"{A}.index + 1 == 4"
    yield f"{A}.index * 2 == 6"
    yield f"{A}.index / 0 == 1"
    yield f"{A}.index % 2 == 1"
    yield f"{A}.driverVersion == semver('570.86.10')"
    yield f"{A}.type in ['gpu', 'mig']"
    yield f"{A}.type in ['vgpu']"
    yield "device.driver == 'gpu.nvidia.com'"
    yield "device.driver in ['gpu.nvidia.com', 'fpga.example.com']"
    yield "device.driver.endsWith('.example.com')"
    yield "device.driver == 1"
    yield "device.driver"
    yield "device.foo == 1"
    yield "device.attributes"
    yield "device"
    yield "device.allowMultipleAllocations"
    yield "!device.allowMultipleAllocations"
    yield "device.allowMultipleAllocations == true && device.driver == 'gpu.nvidia.com'"
    yield "device.allowMultipleAllocations == 1"
    yield f"{A}.productName"
    yield f"{A}"
    yield "true"
    yield "false"
    yield "1 == 1"
    yield "null == null"
    yield f"{A}.productName == null"
    yield f"{A}.index == null"


def _capacity_lookups() -> Iterator[str]:
    for domain in (NV, K8S, FPGA, "missing.example.com"):
        base = f"device.capacity['{domain}']"
        for name in ("memory", "multiprocessors", "luts", "power", "nope"):
            yield f"{base}.{name}.compareTo(quantity('40Gi')) >= 0"
            yield f"{base}['{name}'].isGreaterThan(quantity('100'))"
            yield f"{base}.{name}.isLessThan(quantity('1Ti'))"
            yield f"{base}.{name} == quantity('40Gi')"
    yield f"{C}.memory > 1"
    yield f"{C}.memory == '40Gi'"
    yield f"{C}.memory.asInteger() > 1000000"
    yield f"{C}.memory.asApproximateFloat() > 1e9"
    yield f"{C}.memory.isInteger()"
    yield f"{C}.memory.sign() == 1"
    yield f"{C}.memory.add(quantity('1Gi')).compareTo(quantity('41Gi')) == 0"
    yield f"{C}.memory.sub(1024).isLessThan(quantity('40Gi'))"
    yield f"{C}.memory.add(1).isInteger()"
    yield f"{C}.memory"
    yield f"{C}.multiprocessors.asInteger() >= 42"
    yield f"{C}.multiprocessors.asInteger() >= 42.0"
    yield f"device.capacity['{FPGA}'].fraction.isInteger()"
    yield f"device.capacity['{FPGA}'].fraction.asApproximateFloat() == 0.5"
    yield f"device.capacity['{FPGA}'].fraction.asInteger() == 0"
    yield f"device.capacity['{FPGA}'].luts.asInteger() == 1728000"


def _unknown_and_maps() -> Iterator[str]:
    for domain in (NV, K8S, FPGA, OTHER, "missing.example.com", "nodots"):
        for kind in ("attributes", "capacity"):
            m = f"device.{kind}"
            yield f"'{domain}' in {m}"
            yield f"!('{domain}' in {m})"
            yield f"size({m}['{domain}']) == 0"
            yield f"size({m}['{domain}']) > 2"
            yield f"{m}['{domain}'].exists(k, k == 'memory')"
            yield f"{m}['{domain}'].all(k, k.size() < 20)"
            yield f"'{domain}' in {m} && {m}['{domain}'].exists(k, true)"
            yield f"!('{domain}' in {m}) || size({m}['{domain}']) > 0"
            yield f"!('{domain}' in {m}) && size({m}['{domain}']) == 0"
            yield f"has({m}['{domain}'].memory)"
            yield f"'productName' in {m}['{domain}']"
            yield f"{m}['{domain}'] == {{}}"
    for name in ("nodots", "gpu", "foo", "attributes"):
        yield f"has(device.attributes.{name})"
        yield f"has(device.capacity.{name})"
        yield f"!has(device.attributes.{name})"
        yield f"size(device.attributes.{name}) == 0"
    for kind in ("attributes", "capacity"):
        m = f"device.{kind}"
        yield f"size({m}) == 0"
        yield f"size({m}) == 1"
        yield f"size({m}) == 2"
        yield f"{m}.size() >= 2"
        yield f"{m}.exists(d, d == '{OTHER}')"
        yield f"{m}.exists(d, d.endsWith('.example.com'))"
        yield f"{m}.all(d, d.contains('.'))"
        yield f"{m}.all(d, size({m}[d]) > 0)"
        yield f"{m}.exists_one(d, d == '{NV}')"
        yield f"{m}.map(d, d).size() == 2"
        yield f"{m}.filter(d, d != '{K8S}').size() == 1"
        yield f"{m}['{OTHER}'].size() == 0 && '{OTHER}' in {m}"
        yield f"{m}['{NV}'].exists(k, k == 'memory') && !('{OTHER}' in {m})"
        yield f"size({m}) > 0 && {m}['missing.example.com'].size() == 0"
        yield f"{m} == {{}}"
        yield f"has({m})"
    yield "has(device.driver)"
    yield "has(device.foo)"
    yield f"has({A}.productName) && {A}.productName.startsWith('NVIDIA')"
    yield f"has({A}.profile) && {A}.profile == '3g.40gb'"
    yield f"!has({A}.profile)"
    yield f"'profile' in {A} ? {A}.profile.startsWith('3g') : true"
    yield f"{A}.exists(k, k == 'profile')"
    yield f"{A}.all(k, k != 'uuid')"
    yield f"size({A}) > 8"
    yield f"{A}.map(k, k).exists(k, k == 'index')"
    yield "device.attributes[device.driver].exists(k, k == 'productName')"
    yield "size(device.attributes[device.driver]) > 0"
    yield "device.attributes['gpu.nvidia.com' + ''].type == 'gpu'"
    # Keys spelled to confuse a text rewrite: brackets and quotes inside string literals.
    yield "device.attributes['x)]'].size() == 0 && '(' + ']' == '(]'"
    yield "device.attributes[\"it's\"].size() == 0 && device.attributes['''a]b'''].size() == 0"
    yield "device.attributes[r'a]b'].size() == 0 && device.capacity . other . size() == 0"
    yield "has(device.attributes.x) && device.attributes [ 'gpu.nvidia.com' ] . type == 'gpu'"


def _semver_quantity() -> Iterator[str]:
    dv = f"{A}.driverVersion"
    for v in ("550.0.0", "570.86.10", "580.0.0", "1.0.0-alpha", "580.0.1-rc.1"):
        yield f"{dv}.isGreaterThan(semver('{v}'))"
        yield f"{dv}.compareTo(semver('{v}')) <= 0"
        yield f"{dv}.isLessThan(semver('{v}'))"
    yield f"{dv}.major() >= 560"
    yield f"{dv}.minor() == 86"
    yield f"{dv}.patch() > 0"
    yield f"{dv} == '570.86.10'"
    yield f"{dv} == semver('570.86.10')"
    yield f"{dv} != semver('570.86.10')"
    yield f"{A}.cudaComputeCapability.isGreaterThan(semver('8.9.0'))"
    yield f"{A}.cudaComputeCapability.major() >= 9"
    yield f"{A}.cudaDriverVersion.isLessThan(semver('12.9.0'))"
    yield "semver('1.2.3').isLessThan(semver('1.10.0'))"
    yield "semver('1.2.3') == semver('1.2.3')"
    yield "semver('1.2.3+a') == semver('1.2.3+b')"
    yield "semver('1.0.0-alpha').isLessThan(semver('1.0.0'))"
    yield "semver('1.0.0-alpha.1').isLessThan(semver('1.0.0-alpha.beta'))"
    yield "semver('v1.2.3', true).major() == 1"
    yield "semver('1.2', true).minor() == 2"
    yield "semver('1.2').major() == 1"
    yield "semver('01.2.3').major() == 1"
    yield "semver('bad') == semver('bad')"
    yield "isSemver('1.2.3')"
    yield "isSemver('1.2')"
    yield "isSemver('v1.2.3', true)"
    yield "isSemver('1.2', true)"
    yield "isSemver(1)"
    yield "semver('1.2.3').compareTo(semver('1.2.4')) == -1"
    yield "semver('1.2.3') == '1.2.3'"
    yield "semver('99999999999999999999.0.0').major() > 0"
    for q in ("1Pi", "1Ei", "8Ei", "1.5", "100m", "1e3", "1E", "0.1", "-1Gi", "1k", "1Ki",
              "12345678901234567890"):
        yield f"quantity('{q}').isInteger()"
        yield f"quantity('{q}').asInteger() > 0"
        yield f"quantity('{q}').asApproximateFloat() > 0.0"
        yield f"quantity('{q}').sign() >= 0"
    yield "quantity('1Gi') == quantity('1024Mi')"
    yield "quantity('1Gi').compareTo(quantity('1G')) == 1"
    yield "quantity('1Gi').isGreaterThan(quantity('1G'))"
    yield "quantity('bad').isInteger()"
    yield "isQuantity('1Gi')"
    yield "isQuantity('1gi')"
    yield "isQuantity('')"
    yield "quantity('1').add(quantity('500m')).isInteger()"
    yield "quantity('1').add(1).asInteger() == 2"
    yield "quantity('1').sub(quantity('2')).sign() == -1"
    yield "sign(quantity('1'))"
    yield "sign(quantity('-1')) == -1"
    yield "quantity('1') < quantity('2')"
    yield "quantity('1Gi').asInteger() == 1073741824"
    yield "quantity('1Gi').asInteger() == 1073741824.0"


def _strings_regex() -> Iterator[str]:
    p = f"{A}.productName"
    yield f"{p}.matches('^NVIDIA (A|H)100')"
    yield f"{p}.matches('(?i)nvidia')"
    yield f"{p}.matches('[')"
    yield f"{p}.matches('\\\\d+GB')"
    yield f"{p}.matches('^NVIDIA L4$')"
    yield f"{p}.contains('80GB')"
    yield f"{p}.endsWith('HBM3')"
    yield f"{p}.lowerAscii().contains('h100')"
    yield f"{p}.upperAscii() == 'NVIDIA L4'"
    yield f"{p}.replace('NVIDIA ', '') == 'L4'"
    yield f"{p}.replace('A', 'B', 1).startsWith('NVIDIB')"
    yield f"{p}.split(' ').size() >= 2"
    yield f"{p}.split(' ')[1] == 'H100'"
    yield f"{p}.split(' ', 2)[1].startsWith('A')"
    yield f"{p}.substring(7) == 'L4'"
    yield f"{p}.substring(7, 11) == 'H100'"
    yield f"{p}.substring(30) == ''"
    yield f"{p}.substring(3, 1) == ''"
    yield f"{p}.indexOf('1') >= 0"
    yield f"{p}.indexOf('N', 1) == -1"
    yield f"{p}.indexOf('x', 50) == -1"
    yield "'abc'.indexOf('c', 5) == -1"
    yield "'abc'.indexOf('c', 3) == -1"
    yield "'abc'.indexOf('', 3) == 3"
    yield "'abc'.lastIndexOf('c') == 2"
    yield "'abc'.lastIndexOf('c', 1) == -1"
    yield "'abc'.lastIndexOf('c', 5) == -1"
    yield "'abc'.indexOf('c', -1) == -1"
    yield "'abcabc'.lastIndexOf('c', 4) == 2"
    yield "'abcabc'.indexOf('c', 3) == 5"
    yield "'héllo'.indexOf('l', 3) == 3 && 'héllo'.lastIndexOf('l', 2) == 2"
    yield "'abc'.lastIndexOf('', 1) == 1 && 'abc'.indexOf('', 4) == -1"
    yield f"{p}.lastIndexOf('0') > 0"
    yield f"{p}.charAt(0) == 'N'"
    yield f"{p}.charAt(100) == ''"
    yield "'  x '.trim() == 'x'"
    yield "['a', 'b'].join('-') == 'a-b'"
    yield "['a', 'b'].join() == 'ab'"
    yield f"{p}.split(' ').join('_') == 'NVIDIA_L4'"
    yield "'%s-%d'.format(['a', 1]) == 'a-1'"
    yield "'%.2f'.format([1.5]) == '1.50'"
    yield "'%x'.format([255]) == 'ff'"
    yield "'%o'.format([8]) == '10'"
    yield "'%b'.format([5]) == '101'"
    yield "'%e'.format([1234.5]) == '1.234500e+03'"
    yield "'%s'.format([[1, 2]]) == '[1, 2]'"
    yield "'%s'.format([{'a': 1}]) == '{\"a\": 1}'"
    yield "'%s'.format([1.0]) == '1'"
    yield "'%d'.format(['x']) == 'x'"
    yield "'%s %s'.format(['a']) == 'a'"
    yield "strings.quote('a\"b') == '\"a\\\\\"b\"'"
    yield "'abc'.reverse() == 'cba'"
    yield "'héllo'.size() == 5"
    yield "size('héllo') == 5"
    yield "b'abc'.size() == 3"
    yield "'x'.find('x') == 'x'"
    yield f"{p}.find('[0-9]+') == '100'"
    yield f"{p}.findAll('[0-9]+').size() == 2"
    yield f"{p}.findAll('[0-9]+', 1) == ['100']"
    yield "'abc' < 'abd'"
    yield "'a' + 'b' == 'ab'"
    yield "'\\u00e9' == 'é'"
    yield "r'\\d' == '\\\\d'"
    yield "'''multi\nline''' != ''"
    yield "\"double\" == 'double'"
    yield "'abc'.startsWith('')"
    yield "string(1) == '1'"
    yield "string(1.5) == '1.5'"
    yield "string(true) == 'true'"
    yield "int('12') == 12"
    yield "int('x') == 1"
    yield "double('1.5') == 1.5"
    yield "'x'.matches(1)"


def _comprehensions_cost() -> Iterator[str]:
    for n in (4, 8, 16, 32, 64, 100, 128):
        lst = "[" + ", ".join(str(i) for i in range(n)) + "]"
        yield f"{lst}.all(x, x >= 0)"
        yield f"{lst}.all(x, {lst}.all(y, x + y >= 0))"
        yield f"{lst}.exists(x, {lst}.exists(y, {lst}.exists(z, x + y + z == -1)))"
        yield f"{lst}.map(x, x * 2).filter(x, x > 10).size() >= 0"
    for n in (40, 42, 44, 46, 48):
        # Kubernetes' estimate is about 10.5 n^3: from ~670,000 to ~1,160,000, around the limit.
        lst = "[" + ", ".join(str(i) for i in range(n)) + "]"
        yield f"{lst}.exists(x, {lst}.exists(y, {lst}.exists(z, x + y + z == -1)))"
    for depth in range(1, 9):
        inner = "true"
        for i in range(depth):
            inner = f"{A}.all(k{i}, {inner})"
        yield inner
        inner = "true"
        for i in range(depth):
            inner = f"device.attributes.all(d{i}, {inner})"
        yield inner
        inner = "true"
        for i in range(depth):
            inner = f"[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x{i}, {inner})"
        yield inner
    for depth in range(1, 6):
        inner = "k0.size() > 0"
        for i in range(depth):
            inner = f"{A}.productName.split(' ').all(k{i}, {inner})"
        yield inner
    yield f"{A}.productName.split('').all(c, c != '!')"
    yield f"{A}.productName.split(' ').exists(w, w == 'H100')"
    yield f"{A}.productName.split(' ').map(w, w.size()).exists(n, n > 4)"
    yield f"{A}.productName.split(' ').all(a, {A}.productName.split(' ').all(b, a.size() + b.size() > 0))"
    yield f"{A}.map(k, {A}.map(j, k + j)).size() > 0"
    yield f"{A}.all(k, {A}.all(j, {A}.all(i, {A}.all(h, k != '')))) "
    yield "device.attributes.all(d, device.attributes[d].all(k, k != ''))"
    yield "device.capacity.all(d, device.capacity[d].all(k, device.capacity[d][k].sign() >= 0))"
    yield "cel.bind(x, [1, 2, 3], x.all(y, y > 0))"
    yield f"cel.bind(a, {A}, a.productName.startsWith('NVIDIA'))"
    yield f"cel.bind(a, {A}, has(a.profile))"
    yield "cel.bind(x, 1, cel.bind(y, 2, x + y == 3))"
    yield "[[1, 2], [3]].all(l, l.all(x, x > 0))"
    yield "{'a': 1, 'b': 2}.all(k, k.size() == 1)"
    yield "{'a': 1, 'b': 2}.exists_one(k, k == 'a')"
    yield "[1, 2, 3].exists_one(x, x > 1)"
    yield "[1, 2, 3].map(x, x > 1, x * 10) == [20, 30]"
    yield "[1, 2, 3].filter(x, x > 1) == [2, 3]"
    yield "[1, 2, 3].all(x, x > 0) && [].all(x, false)"
    yield "[].exists(x, true)"
    yield "[1, 2, 3].map(x, [x, x]).size() == 3"
    yield "['a', 'b'].join('-') == 'a-b' && ['a'].all(x, x.split('').size() == 1)"
    yield f"{A}.productName.split(' ').join('-').size() > 0"
    yield "[1, 2].all(x, ['a', 'b'].join('-').size() > 0)"


def _numeric_mixing() -> Iterator[str]:
    pairs = ("1", "2u", "1.0", "2.5", "-1", "0u", "9223372036854775807", "18446744073709551615u", "1e300")
    ops = ("<", "<=", ">", ">=", "==", "!=")
    for i, a in enumerate(pairs):
        for b in pairs[i:]:
            for op in ops[:4] if a != b else ops[4:]:
                yield f"{a} {op} {b}"
    yield "1 + 1u == 2"
    yield "1 + 1.0 == 2.0"
    yield "1u + 1u == 2u"
    yield "2.0 * 3.0 == 6.0"
    yield "int(2.7) == 2"
    yield "uint(2) == 2u"
    yield "double(2) == 2.0"
    yield "uint(-1) == 0u"
    yield "int(1e20) == 1"
    yield "9223372036854775807 + 1 > 0"
    yield "-9223372036854775808 < 0"
    yield "1 / 0 == 0"
    yield "1.0 / 0.0 > 1e308"
    yield "5 % 3 == 2"
    yield "-5 % 3 == -2"
    yield "7 / 2 == 3"
    yield "0x10 == 16"
    yield "1e3 == 1000.0"
    yield "1e3 == 1000"
    yield f"size({A}) < 64.0"
    yield f"size({A}) < 64u"
    yield f"{A}.index < 5.0"
    yield f"{A}.index > 2u"
    yield f"{A}.index == 3.0"
    yield f"{A}.index == 3u"
    yield f"{A}.index in [3.0, 4.0]"
    yield f"{A}.index in [3u]"
    yield "[1, 2.0].size() == 2"
    yield "1 in [1.0]"
    yield "{1: 'a'}[1u] == 'a'"
    yield "{1: 'a'}[1.0] == 'a'"
    yield "dyn(1) == 1.0"
    yield "dyn(1) < 2.5"
    yield "math.greatest(1, 2) == 2"
    yield "math.abs(-1) == 1"


def _literals() -> Iterator[str]:
    yield "[1, 'a'].size() == 2"
    yield "[1, 2, 3].size() == 3"
    yield "[1, [2]].size() == 2"
    yield "[dyn(1), 'a'].size() == 2"
    yield "['a', null].size() == 2"
    yield "[1, null].size() == 2"
    yield "{'a': 1, 'b': 'x'}.size() == 2"
    yield "{'a': 1, 2: 'x'}.size() == 2"
    yield "{'a': 1}.a == 1"
    yield "{'a': 1}['b'] == 1"
    yield "{'a': 1, 'a': 2}.size() == 1"
    yield "[1, 2] + [3] == [1, 2, 3]"
    yield "[1, 2] + ['a'] == [1]"
    yield "[1, 2][2] == 1"
    yield "[1, 2][-1] == 1"
    yield "[1, 2][0] == 1"
    yield "b'ab' == b'ab'"
    yield "b'\\xff'.size() == 1"
    yield "bytes('a') == b'a'"
    yield "duration('1s') < duration('2s')"
    yield "timestamp('2024-01-01T00:00:00Z') < timestamp('2025-01-01T00:00:00Z')"
    yield "type(1) == int"
    yield "type('a') == string"
    yield "type(device) == map"
    yield "type(device.driver) == string"
    yield "null_type == type(null)"
    yield "true && false || true"
    yield "true ? 1 : 'a'"
    yield "(true ? 1 : 2) == 1"
    yield "!true == false"
    yield "!!true"
    yield "-(-1) == 1"
    yield "--1 == 1"
    yield "1 == 1 == true"
    yield "'a' in {'a': 1}"
    yield "1 in [1, 2]"
    yield "'a' in ['a', 1]"
    yield "optional.of(1).hasValue()"
    yield "optional.none().orValue(2) == 2"
    yield f"{A}.?profile.orValue('none') == 'none'"
    yield f"{A}[?'profile'].hasValue()"
    yield "{'a': 1}.?a.orValue(0) == 1"
    yield "[1, 2][?5].orValue(0) == 0"
    yield "google.protobuf.Duration{seconds: 1} == duration('1s')"
    yield "Foo{a: 1}.a == 1"
    yield "x == 1"
    yield "'unterminated"
    yield "1 +"
    yield ""
    yield "   "
    yield "(1 == 1"
    yield "1 == 1)"
    yield "device.attributes['gpu.nvidia.com'].productName == 'a' &&"
    yield "@invalid"
    yield "'a' * 2 == 'aa'"
    yield "1 = 1"
    yield "true || device.driver"
    yield "1"
    yield "'true'"
    yield "[true]"


def _extensions() -> Iterator[str]:
    yield "sets.contains([1, 2, 3], [1])"
    yield "sets.contains(['a'], ['b'])"
    yield "sets.intersects([1, 2], [2, 3])"
    yield "sets.equivalent([1, 2], [2, 1, 1])"
    yield f"sets.contains(['gpu', 'mig'], [{A}.type])"
    yield "lists.range(4) == [0, 1, 2, 3]"
    yield "lists.range(3).all(i, i < 3)"
    yield "[3, 1, 2].sort() == [1, 2, 3]"
    yield "['b', 'a'].sort()[0] == 'a'"
    yield "[{'n': 2}, {'n': 1}].sortBy(x, x.n)[0].n == 1"
    yield "[1, 2, 3].reverse() == [3, 2, 1]"
    yield "[1, 2, 2].distinct() == [1, 2]"
    yield "[[1], [2, [3]]].flatten() == [1, 2, [3]]"
    yield "[[1], [2, [3]]].flatten(2) == [1, 2, 3]"
    yield "[1, 2, 3, 4].slice(1, 3) == [2, 3]"
    yield "[1, 2, 3].first().orValue(0) == 1"
    yield "[1, 2, 3].last().value() == 3"
    yield "[1, 2, 3].sum() == 6"
    yield "[1.5, 2.5].sum() == 4.0"
    yield "[].sum() == 0"
    yield "[1, 2, 3].min() == 1"
    yield "[1, 2, 3].max() == 3"
    yield "[].min() == 0"
    yield "[1, 2, 3].isSorted()"
    yield "[3, 1].isSorted()"
    yield "[1, 2, 3].indexOf(2) == 1"
    yield "[1, 2, 3].lastIndexOf(4) == -1"
    yield "['a', 'b', 'a'].lastIndexOf('a') == 2"
    yield f"{A}.productName.split(' ').indexOf('H100') == 1"
    yield "isIP('10.0.0.1')"
    yield "ip('10.0.0.1').family() == 4"
    yield "ip('::1').isLoopback()"
    yield "ip('fe80::1').isLinkLocalUnicast()"
    yield "isIP('10.0.0.300')"
    yield "ip('10.0.0.1') == ip('10.0.0.1')"
    yield "cidr('10.0.0.0/8').containsIP(ip('10.1.2.3'))"
    yield "cidr('10.0.0.0/8').containsIP('10.1.2.3')"
    yield "cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16')"
    yield "cidr('10.1.2.3/8').masked() == cidr('10.0.0.0/8')"
    yield "cidr('10.0.0.0/8').prefixLength() == 8"
    yield "isCIDR('10.0.0.0/33')"
    yield "cidr('10.0.0.0/8').ip() == ip('10.0.0.0')"
    yield "ip.isCanonical('10.0.0.1')"
    yield "ip('10.0.0.1').isGlobalUnicast()"
    yield "url('https://example.com:8443/a?b=c').getHost() == 'example.com:8443'"
    yield "url('https://example.com:8443/a?b=c').getHostname() == 'example.com'"
    yield "url('https://example.com:8443/a?b=c').getPort() == '8443'"
    yield "url('https://example.com/a%20b').getEscapedPath() == '/a%20b'"
    yield "url('https://example.com/?b=c&b=d').getQuery()['b'] == ['c', 'd']"
    yield "url('https://example.com').getScheme() == 'https'"
    yield "isURL('not a url')"
    yield "isURL('https://example.com')"
    yield f"{A}.all(k, v, v != '')"
    yield f"{A}.exists(k, v, k == 'type' && v == 'gpu')"
    yield f"{A}.existsOne(k, v, k == 'type')"
    yield f"{A}.exists_one(k, k == 'type')"
    yield "[10, 20].all(i, v, v > i)"
    yield "[10, 20].exists(i, v, i == 1 && v == 20)"
    yield "[1, 2].transformList(i, v, v * 2) == [2, 4]"
    yield "[1, 2].transformList(i, v, i > 0, v * 2) == [4]"
    yield "{'a': 1}.transformMap(k, v, v + 1) == {'a': 2}"
    yield "[1, 2].transformMap(i, v, v) == {0: 1, 1: 2}"
    yield "{'a': 1}.transformMapEntry(k, v, {v: k}) == {1: 'a'}"
    yield "[1, 2, 3].includes(2)"
    yield "authorizer.path('/healthz').check('get').allowed()"
    yield "base64.encode(b'a') == 'YQ=='"
    yield "'a'.encode() == b'a'"
    yield "strings.quote('x') == '\"x\"'"
    yield "'a,b'.split(',').join(',') == 'a,b'"
    yield "['b', 'a'].sortBy(x, x) == ['a', 'b']"
    yield f"[{A}.productName].exists(p, p.matches('H100'))"
    yield "optional.ofNonZeroValue('').hasValue()"


def _long_and_deep() -> Iterator[str]:
    term = f"{A}.productName != 'x'"
    for n in (2, 10, 50, 100, 200, 400, 800):
        yield " && ".join([term] * n)
        yield "(" + " || ".join([f"{A}.index == {i}" for i in range(n)]) + ")"
    for n in (10, 31, 32, 33, 64, 100, 150, 200, 249, 250, 251, 300):
        yield "(" * n + "true" + ")" * n
        yield "1" + " + 1" * n + " > 0"
        yield "!" * n + "true"
    for n in (10, 30, 60, 90, 120):
        inner = "true"
        for _ in range(n):
            inner = f"[{inner}][0]"
        yield inner
    for size in (1000, 5000, 10000, 10230, 10240, 10241, 12000):
        body = f"{A}.productName != '"
        pad = size - len(body) - 1
        yield body + "x" * max(pad, 0) + "'"
    yield " ".join(["true"] + ["&& true"] * 3000)
    yield "'" + "é" * 5200 + "' != ''"


FAMILIES = {
    "attribute-lookups": _attribute_lookups,
    "capacity-lookups": _capacity_lookups,
    "unknown-domains-maps": _unknown_and_maps,
    "semver-quantity": _semver_quantity,
    "strings-regex": _strings_regex,
    "comprehensions-cost": _comprehensions_cost,
    "numeric-mixing": _numeric_mixing,
    "literals": _literals,
    "extensions": _extensions,
    "long-deep": _long_and_deep,
}


# ---- seeded random selectors ---------------------------------------------------------------------

_ATOMS = (
    f"{A}.productName.startsWith('NVIDIA H')",
    f"{A}.type == 'mig'",
    f"{A}.index >= 1",
    f"{A}.index < 2.5",
    f"{A}.driverVersion.isGreaterThan(semver('560.0.0'))",
    f"{C}.memory.compareTo(quantity('40Gi')) >= 0",
    f"has({A}.profile)",
    f"'{OTHER}' in device.attributes",
    f"size(device.attributes['{OTHER}']) == 0",
    f"device.attributes['{FPGA}'].model == 'u250'",
    "device.driver == 'gpu.nvidia.com'",
    "device.driver.endsWith('example.com')",
    f"{A}.productName.matches('[0-9]{{3}}')",
    f"{A}.exists(k, k == 'migEnabled')",
    f"device.capacity.exists(d, d == '{K8S}')",
    f"{A}.migEnabled",
    f"{A}.profile == '3g.40gb'",
    f"{A}.brand == 'Nvidia'",
    "device.allowMultipleAllocations",
    "1 < 2u",
    f"size({A}) > 5u",
    f"{A}.productName.split(' ').size() == 3",
    f"{A}.?profile.hasValue()",
    "[1, 2, 3].sum() == 6",
    "sets.contains(['gpu', 'mig'], ['gpu'])",
    f"{A}.exists(k, v, k == 'type' && v == 'gpu')",
)


def _random_expr(rng: random.Random, depth: int) -> str:
    if depth <= 0 or rng.random() < 0.3:
        return rng.choice(_ATOMS)
    shape = rng.randrange(5)
    a = _random_expr(rng, depth - 1)
    b = _random_expr(rng, depth - 1)
    if shape == 0:
        return f"({a} && {b})"
    if shape == 1:
        return f"({a} || {b})"
    if shape == 2:
        return f"!({a})"
    if shape == 3:
        return f"({a} ? {b} : {_random_expr(rng, depth - 1)})"
    return f"({a} == {b})"


def random_selectors(count: int, seed: int = 16) -> list[str]:
    rng = random.Random(seed)
    return [_random_expr(rng, rng.randrange(1, 5)) for _ in range(count)]


def cases(random_count: int = 120) -> list[Case]:
    out: list[Case] = []
    seen: set[str] = set()
    for family, make in FAMILIES.items():
        for selector in make():
            if selector not in seen:
                seen.add(selector)
                out.append(Case(family, selector))
    for selector in random_selectors(random_count):
        if selector not in seen:
            seen.add(selector)
            out.append(Case("random", selector))
    return out
