"""A small review never waits behind a big one: big objects are parsed and judged off the event loop.

The big review is held at a gate inside the real review function (a threading.Event, so a review
on the event loop would freeze the loop with it); the small review sent meanwhile must be answered.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.server.test_listen import big_review, post, running, small_review
from webhook.server import admission


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """(entered, release): the first review of a big object stops at the gate until released."""
    entered, release = threading.Event(), threading.Event()
    real = admission.review

    def gated(endpoint: str, request: Any, *args: Any, **kwargs: Any) -> Any:
        padding = (((request.get("object") or {}).get("metadata") or {}).get("annotations") or {}).get(
            "example.com/padding", ""
        )
        if padding and not entered.is_set():
            entered.set()
            assert release.wait(60), "the test never released the big review"
        return real(endpoint, request, *args, **kwargs)

    monkeypatch.setattr(admission, "review", gated)
    return entered, release


async def test_a_small_review_is_answered_while_a_big_one_is_judged(
    tmp_path: Path, cert_dir: Path, gate: tuple[threading.Event, threading.Event]
) -> None:
    entered, release = gate
    ca = cert_dir / "ca.crt"
    async with running(tmp_path, cert_dir) as (port, _wh):
        big = asyncio.create_task(post(port, ca, big_review()))
        try:
            while not entered.is_set():
                assert not big.done(), big.result()
                await asyncio.sleep(0.01)
            # The big review is in the middle of being judged; a small one is answered meanwhile.
            status, doc = await asyncio.wait_for(post(port, ca, small_review()), 30)
            assert status == 200
            assert any("migrate/legacy-gpu" in w for w in doc["response"]["warnings"])
            assert not big.done()
        finally:
            release.set()
        status, doc = await asyncio.wait_for(big, 30)
        assert status == 200  # the big pod is judged as fully as a small one
        assert any("migrate/legacy-gpu" in w for w in doc["response"]["warnings"])


async def test_an_error_in_a_big_review_is_an_answer_not_a_dead_worker(
    tmp_path: Path, cert_dir: Path
) -> None:
    """A big body that is not a review gets the same 400 a small one gets, from the worker thread."""
    ca = cert_dir / "ca.crt"
    async with running(tmp_path, cert_dir) as (port, _wh):
        body = b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "x": "' + b"y" * (
            300 * 1024
        ) + b'"}'
        for _ in range(3):  # more than the pool's workers: none is lost to the error
            status, _doc = await asyncio.wait_for(_post_raw(port, ca, body), 30)
            assert status == 400
        status, doc = await asyncio.wait_for(post(port, ca, small_review()), 30)
        assert status == 200 and doc["response"]["warnings"]


async def _post_raw(port: int, ca: Path, body: bytes) -> tuple[int, str]:
    import ssl

    import aiohttp

    ctx = ssl.create_default_context(cafile=str(ca))
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"https://127.0.0.1:{port}/validate", data=body, headers={"Content-Type": "application/json"},
               ssl=ctx) as r,  # fmt: skip
    ):
        return r.status, await r.text()
