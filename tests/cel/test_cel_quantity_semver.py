"""Kubernetes Quantity and strict semver: parsing, arithmetic and ordering against known values."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from webhook.dra.quantity import Quantity
from webhook.dra.semver import Semver, coerce_semver, is_semver


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1", 1),
        ("80Gi", 80 * 2**30),
        ("1Ki", 1024),
        ("1Mi", 2**20),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("500m", Fraction(1, 2)),
        ("1u", Fraction(1, 10**6)),
        ("1n", Fraction(1, 10**9)),
        ("1.5Gi", 3 * 2**29),
        ("0.5", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("+2", 2),
        ("-2Ki", -2048),
        ("1e3", 1000),
        ("1E3", 1000),
        ("2e-3", Fraction(2, 1000)),
        ("1.5e1", 15),
        ("12e+2", 1200),
    ],
)
def test_parse_known_values(text: str, value: int | Fraction) -> None:
    assert Quantity.parse(text).value == Fraction(value)


def test_precision_finer_than_nano_rounds_up() -> None:
    # apimachinery rounds up to the next nano-unit.
    assert Quantity.parse("0.1n").value == Fraction(1, 10**9)
    assert Quantity.parse("1.0000000001").value == Fraction(1_000_000_001, 10**9)


@pytest.mark.parametrize(
    "text", ["", "Gi", "1Gb", "1 Gi", "1.2.3", "--1", "1Kii", "abc", "1e", "1ee3", "0x10"]
)
def test_parse_rejects_with_clear_message(text: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity") as info:
        Quantity.parse(text)
    assert repr(text) in str(info.value) or text == ""


def test_compare_across_suffixes() -> None:
    assert Quantity.parse("1Gi") == Quantity.parse("1024Mi")
    assert Quantity.parse("1G") < Quantity.parse("1Gi")
    assert Quantity.parse("80Gi").compare(Quantity.parse("40Gi")) == 1
    assert Quantity.parse("40Gi").compare(Quantity.parse("80Gi")) == -1
    assert Quantity.parse("1k").compare(Quantity.parse("1000")) == 0


def test_arithmetic_and_conversions() -> None:
    q = Quantity.parse("1.5Gi").add(Quantity.parse("512Mi"))
    assert q.as_integer() == 2 * 2**30
    assert Quantity.parse("1").add(2).as_integer() == 3
    assert Quantity.parse("1").sub(Quantity.parse("3")).sign() == -1
    assert Quantity.parse("0").sign() == 0
    assert Quantity.parse("500m").sign() == 1
    assert Quantity.parse("1.5").is_integer() is False
    assert Quantity.parse("9223372036854775807").is_integer() is True
    assert Quantity.parse("9223372036854775808").is_integer() is False
    assert Quantity.parse("250m").as_approximate_float() == 0.25
    with pytest.raises(ValueError, match="cannot convert value to integer"):
        Quantity.parse("1.5").as_integer()


@pytest.mark.parametrize(("text", "shown"), [("80Gi", "80Gi"), ("1024Mi", "1Gi"), ("1500m", "1500m"),
                                              ("2000", "2k"), ("0", "0"), ("-1Ki", "-1Ki")])
def test_canonical_text(text: str, shown: str) -> None:
    assert str(Quantity.parse(text)) == shown


@pytest.mark.parametrize(
    "text", ["0.0.0", "1.2.3", "10.20.30", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-0.3.7", "1.0.0-x.7.z.92",
             "1.0.0+20130313144700", "1.0.0-beta+exp.sha.5114f85", "1.0.0-alpha-a.b-c"],
)
def test_semver_accepts_valid(text: str) -> None:
    assert is_semver(text)
    assert str(Semver.parse(text)) == text


@pytest.mark.parametrize(
    "text", ["", "1", "1.2", "01.2.3", "1.02.3", "1.2.03", "v1.2.3", "1.2.3-01", "1.2.3-", "1.2.3+",
             "1.2.3-a..b", "535.104.05", " 1.2.3", "1.2.3.4"],
)
def test_semver_rejects_invalid(text: str) -> None:
    assert not is_semver(text)
    with pytest.raises(ValueError, match="invalid semver"):
        Semver.parse(text)


def test_semver_error_suggests_coercion() -> None:
    with pytest.raises(ValueError, match=r"did you mean '535\.104\.5'"):
        Semver.parse("535.104.05")


def test_semver_precedence_follows_the_spec() -> None:
    # The ordering example from semver.org section 11.
    chain = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
             "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "2.0.0", "2.1.0", "2.1.1"]
    versions = [Semver.parse(v) for v in chain]
    for lower, higher in itertools.pairwise(versions):
        assert lower.compare(higher) == -1
        assert higher.compare(lower) == 1
    assert Semver.parse("1.0.0+build.1").compare(Semver.parse("1.0.0+build.2")) == 0
    assert Semver.parse("550.54.15") > Semver.parse("550.0.0")
    v = Semver.parse("12.4.1")
    assert (v.major, v.minor, v.patch) == (12, 4, 1)


@pytest.mark.parametrize(
    ("loose", "strict"),
    [("535.104.05", "535.104.5"), ("8.0", "8.0.0"), ("12", "12.0.0"), ("v1.2.3", "1.2.3"), ("9.0", "9.0.0"),
     ("550.54.15", "550.54.15"), ("1.2.3-rc.01", "1.2.3-rc.1"), ("12.4.0+cuda", "12.4.0+cuda")],
)
def test_coerce_semver(loose: str, strict: str) -> None:
    assert coerce_semver(loose) == strict
    assert is_semver(coerce_semver(loose))


@pytest.mark.parametrize("text", ["", "abc", "1..2", "1.2.3.4", "N/A"])
def test_coerce_semver_rejects_non_versions(text: str) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        coerce_semver(text)
