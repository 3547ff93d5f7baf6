"""The quota ledger's own data: names, encoding, and what a damaged ledger does (the race itself runs
against a real API server in tests/e2e/test_quota_replicas.py)."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from webhook.engine.quota import budget_group
from webhook.policy.load import load_policies
from webhook.server.ledger import LedgerEntry, decode, encode, ledger_name, safe, usage_of, valid_key

SHIPPED = load_policies(Path(__file__).resolve().parents[2] / "policies")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_entries_round_trip() -> None:
    entries = {
        "team-a/c1": LedgerEntry({"gpu.nvidia.com-a100": 2}, Fraction(2), 1.5, "uid-1"),
        "team-a/c2": LedgerEntry({"gpu.nvidia.com-a100-mig-3g20gb": 3}, Fraction(9, 7), 2.0),
    }
    assert decode(encode(entries)) == entries


def test_a_damaged_ledger_drops_only_the_bad_entries() -> None:
    good = encode({"ns/ok": LedgerEntry({"c": 1}, Fraction(1), 1.0, "u")})
    assert decode("not json") == {}
    assert decode('["a list"]') == {}
    mixed = good[:-1] + ',"ns/bad":[{"c":"x"},[1,0],1,""],"ns/short":[1]}'
    assert set(decode(mixed)) == {"ns/ok"}


@given(st.text(min_size=1, max_size=300))
@example("0" * 38)  # the longest readable part once fit exactly 64 characters
@example(":::")  # nothing readable is left
def test_ledger_names_are_valid_and_distinct(group: str) -> None:
    name = ledger_name(group)
    assert len(name) <= 63 and _DNS_SUBDOMAIN.match(name), name
    assert ledger_name(group + "x") != name


def test_one_ledger_holds_every_scope_a_claim_charges() -> None:
    labels = {"vision-a": {"draguard.io/team": "cv"}, "vision-b": {"draguard.io/team": "cv"}}
    # A team namespace's claims live in the team's ledger (namespace and team budgets in one write).
    assert budget_group(SHIPPED, "vision-a", labels["vision-a"]) == "team:cv"
    assert budget_group(SHIPPED, "team-ml", None) == "team-ml"
    # The shipped default budget covers unlabelled namespaces too.
    assert budget_group(SHIPPED, "scratch", {}) == "scratch"
    entries = {
        "vision-a/c": LedgerEntry({"gpu.nvidia.com-h100": 4}, Fraction(4), 1.0, "u1"),
        "vision-b/d": LedgerEntry({"gpu.nvidia.com-h100": 2}, Fraction(2), 1.0, "u2"),
    }
    usage = usage_of(entries, labels, ["draguard.io/team"])
    assert usage.gpu_equivalents["team:cv"] == 6.0
    assert usage.devices[("vision-a", "gpu.nvidia.com-h100")] == 4
    without = usage_of(entries, labels, ["draguard.io/team"], skip="vision-a/c")
    assert without.gpu_equivalents["team:cv"] == 2.0


def test_only_names_the_api_server_accepts_make_a_ledger_key() -> None:
    assert valid_key("team-a/gpu.job-1")
    for key in (
        "team-a/../../../../../../healthz",
        "team-a/Upper",
        "team-a/" + "a" * 254,
        "team-a/",
        "/c",
        "a" * 64 + "/c",  # a namespace is a DNS label: 63 characters at most
        "team.a/c",
        "team-a/c/d",
        "no-slash",
        "team-a/c\n",
    ):
        assert not valid_key(key), key


@given(st.text(max_size=400))
@example("\x1b[2J\r\nforged line" + "y" * 500)
def test_what_a_log_line_gets_of_a_name_is_short_and_printable(text: str) -> None:
    out = safe(text)
    assert len(out) <= 83 and out.isprintable(), out
    if text.isprintable() and len(text) <= 80:
        assert out == text
