"""Prometheus metrics of the kubelet plugin (served on --metrics-port, path /metrics)."""

from __future__ import annotations

from typing import Any, Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# The operations and results the driver counts. Call sites name them through `error()`,
# `prepared()`, `unprepared()` and `published()`, so mypy refuses a name that would start without
# its zero series.
Operation = Literal["publish", "prepare", "unprepare", "nvml"]
Result = Literal["success", "error"]
OPERATIONS: tuple[Operation, ...] = get_args(Operation)
RESULTS: tuple[Result, ...] = get_args(Result)

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class DriverMetrics:
    """All driver metrics on their own registry (several drivers can live in one test process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.prepare = Counter(
            "dra_plugin_prepare", "Claims handled by NodePrepareResources, by result.", ["result"], registry=r
        )
        self.unprepare = Counter(
            "dra_plugin_unprepare",
            "Claims handled by NodeUnprepareResources, by result.",
            ["result"],
            registry=r,
        )
        self.prepare_seconds = Histogram(
            "dra_plugin_prepare_duration_seconds", "Time to prepare one claim.", buckets=_BUCKETS, registry=r
        )
        self.unprepare_seconds = Histogram(
            "dra_plugin_unprepare_duration_seconds",
            "Time to unprepare one claim.",
            buckets=_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "dra_plugin_errors", "Errors of the driver, by operation.", ["operation"], registry=r
        )
        self.devices = Gauge(
            "dra_plugin_devices_published",
            "Devices published in ResourceSlices, by type.",
            ["type"],
            registry=r,
        )
        self.nvml_errors = Counter(
            "dra_plugin_nvml_errors", "Failed NVML calls, by call.", ["call"], registry=r
        )
        self.slice_publishes = Counter(
            "dra_plugin_slice_publishes", "ResourceSlice publish attempts, by result.", ["result"], registry=r
        )
        for t in ("gpu", "mig"):
            self.devices.labels(type=t).set(0)
        # Every series an alert reads through increase() exists at 0 from the start: a series' first
        # sample is no increase, so errors that create it (the first 5 within a minute) would not fire.
        for res in RESULTS:
            self.prepare.labels(result=res)
            self.unprepare.labels(result=res)
            self.slice_publishes.labels(result=res)
        for operation in OPERATIONS:
            self.errors.labels(operation=operation)

    def error(self, operation: Operation) -> None:
        self.errors.labels(operation=operation).inc()

    def nvml_error(self, call: str) -> None:
        self.nvml_errors.labels(call=call).inc()
        self.error("nvml")

    def prepared(self, ok: bool, seconds: float) -> None:
        """One claim through NodePrepareResources; a failure is also a `prepare` error."""
        self.prepare_seconds.observe(seconds)
        self.prepare.labels(result="success" if ok else "error").inc()
        if not ok:
            self.error("prepare")

    def unprepared(self, ok: bool, seconds: float) -> None:
        """One claim through NodeUnprepareResources; a failure is also an `unprepare` error."""
        self.unprepare_seconds.observe(seconds)
        self.unprepare.labels(result="success" if ok else "error").inc()
        if not ok:
            self.error("unprepare")

    def published(self, ok: bool) -> None:
        """One ResourceSlice publish attempt; a failure is also a `publish` error."""
        self.slice_publishes.labels(result="success" if ok else "error").inc()
        if not ok:
            self.error("publish")

    def set_devices(self, counts: dict[str, int]) -> None:
        for t in set(counts) | {"gpu", "mig"}:
            self.devices.labels(type=t).set(counts.get(t, 0))

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Start the /metrics HTTP endpoint in a background thread; returns the server."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
