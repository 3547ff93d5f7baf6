"""A small closed-loop load generator for the webhook (aiohttp client, keep-alive, TLS).

Used by the load and certificate-rotation tests and by bench/webhook_concurrency.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class LoadResult:
    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    bad_uid: int = 0
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    rss_samples: list[tuple[float, float]] = field(default_factory=list)  # (t, MiB)

    @property
    def five_xx(self) -> int:
        return sum(n for s, n in self.statuses.items() if s >= 500)

    @property
    def failed(self) -> int:
        return self.five_xx + sum(self.errors.values()) + self.bad_uid

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0

    def pct_ms(self, q: float) -> float:
        s = sorted(self.latencies)
        if not s:
            return float("nan")
        return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))] * 1000

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.sent,
            "seconds": round(self.seconds, 2),
            "rate_per_s": round(self.rate, 1),
            "p50_ms": round(self.pct_ms(50), 2),
            "p99_ms": round(self.pct_ms(99), 2),
            "max_ms": round(self.pct_ms(100), 2),
            "statuses": dict(self.statuses),
            "errors": dict(self.errors),
            "bad_uid": self.bad_uid,
        }


async def run_load(
    url: str,
    bodies: Sequence[bytes],
    *,
    ssl_context: ssl.SSLContext,
    concurrency: int = 8,
    max_requests: int = 20000,
    max_seconds: float = 60.0,
    min_requests: int = 0,
    min_seconds: float = 0.0,
    fresh_connections: bool = False,
    sample: Callable[[], float] | None = None,
    paths: Sequence[str] = ("/validate",),
) -> LoadResult:
    """Closed loop: `concurrency` workers post bodies until the limits say stop.

    Stops when (max_requests or max_seconds is reached) and min_requests/min_seconds are met.
    `fresh_connections` opens a new TLS connection per request (each sees the current certificate).
    `sample` is called about once a second (e.g. the server's RSS in MiB).
    """
    res = LoadResult()
    counter = 0
    t0 = time.perf_counter()
    stop = False

    def done() -> bool:
        el = time.perf_counter() - t0
        over = counter >= max_requests or el >= max_seconds
        enough = counter >= min_requests and el >= min_seconds
        return (over and enough) or el >= max(max_seconds, min_seconds) * 10

    # Aborting closed TLS connections on close: Debian bookworm's Python 3.11.2 raises AttributeError
    # in asyncio's SSL transport there (its `_ssl_protocol` is already None); later 3.11s do not.
    connector = aiohttp.TCPConnector(
        ssl=ssl_context, limit=concurrency, force_close=fresh_connections,
        enable_cleanup_closed=sys.version_info >= (3, 11, 4),
    )  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker(w: int) -> None:
            nonlocal counter, stop
            while not stop:
                if done():
                    stop = True
                    return
                i = counter
                counter += 1
                body = bodies[i % len(bodies)]
                path = paths[i % len(paths)]
                t1 = time.perf_counter()
                try:
                    async with session.post(
                        url + path, data=body, headers={"Content-Type": "application/json"}
                    ) as r:
                        data = await r.read()
                        res.statuses[r.status] += 1
                        if r.status == 200:
                            want = json.loads(body)["request"]["uid"]
                            if json.loads(data)["response"]["uid"] != want:
                                res.bad_uid += 1
                except (TimeoutError, aiohttp.ClientError, OSError) as e:
                    res.errors[type(e).__name__] += 1
                res.latencies.append(time.perf_counter() - t1)
                res.sent += 1

        async def sampler() -> None:
            while not stop and sample is not None:
                res.rss_samples.append((time.perf_counter() - t0, sample()))
                await asyncio.sleep(1.0)

        tasks = [asyncio.create_task(worker(w)) for w in range(concurrency)]
        samp = asyncio.create_task(sampler())
        await asyncio.gather(*tasks)
        stop = True
        await samp
    res.seconds = time.perf_counter() - t0
    if sample is not None:
        res.rss_samples.append((res.seconds, sample()))
    return res
