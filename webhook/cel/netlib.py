"""Kubernetes' IP, CIDR and URL CEL libraries (k8s.io/apiserver/pkg/cel/library ip.go, cidr.go, urls.go).

Values travel as one-entry tagged maps, like Quantity and Semver (see library.py): `{"@ip": canonical}`,
`{"@cidr": "<address>/<bits>"}` and `{"@url": text}`, so `ip('::1') == ip('0::1')` compares the way
Kubernetes does. Parsing follows Go's netip / net/url rules where they differ from Python's: IPv4
with leading zeros, IPv4-mapped IPv6 and zones are refused, host names are not lower-cased.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

IP_TAG = "@ip"
CIDR_TAG = "@cidr"
URL_TAG = "@url"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Interface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


class NetError(ValueError):
    """A string that is not an IP, CIDR or URL as Kubernetes parses them."""


def _parse_ip(text: str) -> Address:
    if "%" in text:
        raise NetError(f"IP address with zone value is not allowed: {text}")
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise NetError(f"IP Address {text!r} parse error during conversion from string") from None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        raise NetError(f"IPv4-mapped IPv6 address is not allowed: {text}")
    return addr


def _parse_cidr(text: str) -> Interface:
    address, slash, bits = text.partition("/")
    if not slash or not bits.isdigit() or (len(bits) > 1 and bits[0] == "0"):
        raise NetError(f"network address parse error during conversion from string: {text!r}")
    addr = _parse_ip(address)
    if int(bits) > addr.max_prefixlen:
        raise NetError(f"network address parse error during conversion from string: {text!r}")
    return ipaddress.ip_interface(f"{addr}/{bits}")


def _ip_value(addr: Address) -> dict[str, str]:
    return {IP_TAG: str(addr)}


def _cidr_value(iface: Interface) -> dict[str, str]:
    return {CIDR_TAG: f"{iface.ip}/{iface.network.prefixlen}"}


def _tagged(value: object, tag: str, function: str) -> str:
    if isinstance(value, Mapping) and len(value) == 1 and tag in value:
        return str(value[tag])
    raise NetError(f"no such overload: {function}")


def _ip(value: object, function: str) -> Address:
    return _parse_ip(_tagged(value, IP_TAG, function))


def _cidr(value: object, function: str) -> Interface:
    return _parse_cidr(_tagged(value, CIDR_TAG, function))


def _is(parse: Callable[[str], object], text: str) -> bool:
    try:
        parse(text)
    except NetError:
        return False
    return True


def _is_canonical(text: str) -> bool:
    return str(_parse_ip(text)) == text


def _link_local_multicast(addr: Address) -> bool:
    if addr.version == 4:
        return addr in ipaddress.ip_network("224.0.0.0/24")
    return (int(addr) >> 112) & 0xFF0F == 0xFF02


def _global_unicast(addr: Address) -> bool:
    # Go's netip.Addr.IsGlobalUnicast: not Python's is_global (private ranges count here).
    if addr.version == 4 and addr == ipaddress.IPv4Address("255.255.255.255"):
        return False
    return not (addr.is_unspecified or addr.is_loopback or addr.is_multicast or addr.is_link_local)


def _contains_ip(prefix: object, other: object) -> bool:
    network = _cidr(prefix, "containsIP").network
    addr = _parse_ip(other) if isinstance(other, str) else _ip(other, "containsIP")
    return addr.version == network.version and addr in network


def _contains_cidr(prefix: object, other: object) -> bool:
    network = _cidr(prefix, "containsCIDR").network
    inner = (_parse_cidr(other) if isinstance(other, str) else _cidr(other, "containsCIDR")).network
    return inner.version == network.version and inner.subnet_of(network)  # type: ignore[arg-type]


# ---- URLs ----------------------------------------------------------------------------------------

_URL_ERROR = "URL parse error during conversion from string"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _check_request_uri(text: str) -> None:
    """Go's url.ParseRequestURI: an absolute URI or an absolute path, no fragment handling."""
    if not text:
        raise NetError("URL parse error during conversion from string: empty url")
    if any(ord(c) < 0x20 or c == "\x7f" for c in text):
        raise NetError("URL parse error during conversion from string: invalid control character in URL")
    if not (text.startswith("/") or _SCHEME.match(text)):
        raise NetError(f"{_URL_ERROR}: parse {text!r}: invalid URI for request")
    if _SCHEME.match(text):
        rest = text[text.index(":") + 1:]
        if not rest.startswith("/"):
            # An opaque URI (mailto:x) is accepted by Go; a host part must still parse.
            return
        if rest.startswith("//"):
            host = rest[2:].split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
            if " " in host:
                raise NetError(f"{_URL_ERROR}: invalid character in host {host!r}")
            port = _split_port(host)[1]
            if port and not port.isdigit():
                raise NetError(f"URL parse error during conversion from string: invalid port {port!r}")


def _split_port(host: str) -> tuple[str, str]:
    if host.startswith("["):
        end = host.find("]")
        if end == -1:
            return host, ""
        rest = host[end + 1:]
        return host[1:end], rest[1:] if rest.startswith(":") else ""
    name, colon, port = host.rpartition(":")
    return (name, port) if colon else (host, "")


def _url(text: str) -> dict[str, str]:
    _check_request_uri(text)
    return {URL_TAG: text}


def _is_url(text: str) -> bool:
    return _is(_check_request_uri, text)


def _host(value: object) -> str:
    text = _tagged(value, URL_TAG, "getHost")
    parts = urlsplit(text)
    return parts.netloc.rpartition("@")[2]


def _escaped_path(value: object) -> str:
    return urlsplit(_tagged(value, URL_TAG, "getEscapedPath")).path.replace(" ", "%20")


def _query(value: object) -> dict[str, list[str]]:
    return parse_qs(urlsplit(_tagged(value, URL_TAG, "getQuery")).query, keep_blank_values=True)


# (name, params, result, impl, member)
SPECS: tuple[tuple[str, tuple[str, ...], str, Callable[..., Any], bool], ...] = (
    ("ip", ("string",), "tagged", lambda s: _ip_value(_parse_ip(s)), False),
    ("isIP", ("string",), "bool", lambda s: _is(_parse_ip, s), False),
    ("ip.isCanonical", ("string",), "bool", _is_canonical, False),
    ("family", ("tagged",), "int", lambda v: _ip(v, "family").version, True),
    ("isUnspecified", ("tagged",), "bool", lambda v: _ip(v, "isUnspecified").is_unspecified, True),
    ("isLoopback", ("tagged",), "bool", lambda v: _ip(v, "isLoopback").is_loopback, True),
    ("isLinkLocalMulticast", ("tagged",), "bool",
     lambda v: _link_local_multicast(_ip(v, "isLinkLocalMulticast")), True),
    ("isLinkLocalUnicast", ("tagged",), "bool", lambda v: _ip(v, "isLinkLocalUnicast").is_link_local, True),
    ("isGlobalUnicast", ("tagged",), "bool", lambda v: _global_unicast(_ip(v, "isGlobalUnicast")), True),
    ("cidr", ("string",), "tagged", lambda s: _cidr_value(_parse_cidr(s)), False),
    ("isCIDR", ("string",), "bool", lambda s: _is(_parse_cidr, s), False),
    ("containsIP", ("tagged", "tagged"), "bool", _contains_ip, True),
    ("containsIP", ("tagged", "string"), "bool", _contains_ip, True),
    ("containsCIDR", ("tagged", "tagged"), "bool", _contains_cidr, True),
    ("containsCIDR", ("tagged", "string"), "bool", _contains_cidr, True),
    ("ip", ("tagged",), "tagged", lambda v: _ip_value(_cidr(v, "ip").ip), True),
    ("masked", ("tagged",), "tagged",
     lambda v: _cidr_value(ipaddress.ip_interface(str(_cidr(v, "masked").network))), True),
    ("prefixLength", ("tagged",), "int", lambda v: _cidr(v, "prefixLength").network.prefixlen, True),
    ("url", ("string",), "tagged", _url, False),
    ("isURL", ("string",), "bool", _is_url, False),
    ("getScheme", ("tagged",), "string", lambda v: urlsplit(_tagged(v, URL_TAG, "getScheme")).scheme, True),
    ("getHost", ("tagged",), "string", _host, True),
    ("getHostname", ("tagged",), "string", lambda v: _split_port(_host(v))[0], True),
    ("getPort", ("tagged",), "string", lambda v: _split_port(_host(v))[1], True),
    ("getEscapedPath", ("tagged",), "string", _escaped_path, True),
    ("getQuery", ("tagged",), "map(string,list(string))", _query, True),
)

KINDS = {IP_TAG: "net.IP", CIDR_TAG: "net.CIDR", URL_TAG: "kubernetes.URL"}
