"""What the caBundle injector writes, for configurations as the API server (or an attacker) serves them."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest

from webhook.certs import generate_ca
from webhook.server.cainject import fingerprints, patch_ops

NOW = dt.datetime.now(dt.UTC)


def _cfg(*bundles: str | None) -> dict[str, Any]:
    hooks = []
    for i, b in enumerate(bundles):
        cc: dict[str, Any] = {"url": "https://127.0.0.1:9443/validate"}
        if b is not None:
            cc["caBundle"] = b
        hooks.append({"name": f"h{i}.draguard.io", "clientConfig": cc})
    return {"webhooks": hooks}


def _b64(*pems: bytes) -> str:
    return base64.b64encode(b"".join(pems)).decode()


@pytest.fixture(scope="module")
def cas() -> tuple[bytes, bytes]:
    return generate_ca()[0], generate_ca()[0]


def test_missing_wiped_or_garbage_bundles_are_written_with_a_name_guard(cas: tuple[bytes, bytes]) -> None:
    ca, _ = cas
    ops = patch_ops(_cfg(None, "", "bm90IGEgY2VydA==", "%%%not-base64", _b64(ca)), ca, NOW)
    # Four webhooks need it (the fifth already trusts the CA); each write follows a test of its name.
    assert [o["op"] for o in ops] == ["test", "add"] * 4
    assert [o["value"] for o in ops[0::2]] == [
        "h0.draguard.io",
        "h1.draguard.io",
        "h2.draguard.io",
        "h3.draguard.io",
    ]
    assert {o["value"] for o in ops[1::2]} == {_b64(ca)}
    assert all(o["path"].endswith("/clientConfig/caBundle") for o in ops[1::2])


def test_a_bundle_that_already_holds_our_cas_is_left_alone(cas: tuple[bytes, bytes]) -> None:
    new, old = cas
    # A replica with the older mount (old CA only) does not undo the rotated bundle [new, old] ...
    assert patch_ops(_cfg(_b64(new, old)), old, NOW) == []
    # ... while the replica with the rotated mount adds the new CA where it is missing.
    ops = patch_ops(_cfg(_b64(old)), new + old, NOW)
    assert ops[1]["value"] == _b64(new, old)


def test_nothing_is_written_from_an_unusable_local_bundle(cas: tuple[bytes, bytes]) -> None:
    assert patch_ops(_cfg(None), b"", NOW) == []
    assert (
        patch_ops(_cfg(None), b"-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n", NOW) == []
    )
    # Expired CAs do not count: a bundle of only expired CAs injects nothing.
    ca, _ = cas
    assert fingerprints(ca, NOW + dt.timedelta(days=365 * 50)) == frozenset()
    assert patch_ops(_cfg(None), ca, NOW + dt.timedelta(days=365 * 50)) == []


def test_hostile_shapes_do_not_raise(cas: tuple[bytes, bytes]) -> None:
    ca, _ = cas
    for cfg in ({}, {"webhooks": None}, {"webhooks": ["x", 3, None]}, {"webhooks": [{"name": "a"}]}):
        patch_ops(cfg, ca, NOW)  # type: ignore[arg-type]
    assert len(patch_ops({"webhooks": [{"name": "a", "clientConfig": None}]}, ca, NOW)) == 2
