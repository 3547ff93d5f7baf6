"""The kubelet plugin: DRA service (v1 and v1beta1) and registration, gRPC asyncio on unix sockets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from .devices import DriverDevice
from .proto import dra_health_v1_pb2, dra_health_v1alpha1_pb2, dra_v1_pb2, dra_v1beta1_pb2
from .registration import (
    HEALTH_VERSIONS,
    SUPPORTED_VERSIONS,
    RegistrationServicer,
    SocketPaths,
    check_socket_paths,
    socket_paths,
)
from .state import ClaimRef, DeviceState

log = logging.getLogger("draguard.driver.plugin")


DRA_SERVICES = {
    "v1": "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    "v1beta1": "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
}


HEALTH_SERVICES = dict(zip(("v1", "v1alpha1"), HEALTH_VERSIONS, strict=True))


class HealthFeed:
    """The health of every published device, for the kubelet's DRA health stream (KEP-4680).

    `unhealthy(device)` gives the reason a device is unhealthy (None: healthy); the stream sends the
    complete list at once, again within `poll` seconds of any change, and at least every `resend`.
    """

    def __init__(
        self,
        pool: str,
        devices: Callable[[], Sequence[DriverDevice]],
        unhealthy: Callable[[DriverDevice], str | None],
        *,
        poll: float = 1.0,
        resend: float = 30.0,
    ) -> None:
        self.pool = pool
        self.devices = devices
        self.unhealthy = unhealthy
        self.poll = poll
        self.resend = resend

    def state(self) -> list[tuple[str, str | None]]:
        return [(d.name, self.unhealthy(d)) for d in sorted(self.devices(), key=lambda d: d.name)]


class HealthServicer:
    """NodeWatchResources for one API version of the health service."""

    def __init__(self, feed: HealthFeed, version: str) -> None:
        self.feed = feed
        self.version = version
        self.pb: ModuleType = dra_health_v1_pb2 if version == "v1" else dra_health_v1alpha1_pb2

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            HEALTH_SERVICES[self.version],
            {
                "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
                    self.NodeWatchResources,
                    request_deserializer=self.pb.NodeWatchResourcesRequest.FromString,
                    response_serializer=self.pb.NodeWatchResourcesResponse.SerializeToString,
                )
            },
        )

    def _message(self, state: list[tuple[str, str | None]]) -> Any:
        pb, now = self.pb, int(time.time())
        # The kubelet turns a device Unknown when no report came within this timeout; its default
        # (30 s) equals the resend interval, so a steady device could flicker to Unknown.
        timeout = int(3 * self.feed.resend)
        resp = pb.NodeWatchResourcesResponse()
        for name, why in state:
            resp.devices.add(
                device=pb.DeviceIdentifier(pool_name=self.feed.pool, device_name=name),
                health=pb.UNHEALTHY if why else pb.HEALTHY, last_updated_time=now, message=(why or "")[:1024],
                health_check_timeout_seconds=timeout,
            )  # fmt: skip
        return resp

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        last, sent_at = None, 0.0
        while True:
            state = await asyncio.to_thread(self.feed.state)
            if state != last or time.monotonic() - sent_at >= self.feed.resend:
                yield self._message(state)
                last, sent_at = state, time.monotonic()
            await asyncio.sleep(self.feed.poll)


class DraServicer:
    """One implementation behind both API versions; `pb` is the version's message module."""

    def __init__(self, state: DeviceState, version: str) -> None:
        self.state = state
        self.version = version
        self.pb: ModuleType = dra_v1_pb2 if version == "v1" else dra_v1beta1_pb2
        self.share_ids = version == "v1"  # Device.share_id exists only in v1

    def handler(self) -> grpc.GenericRpcHandler:
        pb = self.pb
        return grpc.method_handlers_generic_handler(
            DRA_SERVICES[self.version],
            {
                "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
                    self.NodePrepareResources,
                    request_deserializer=pb.NodePrepareResourcesRequest.FromString,
                    response_serializer=pb.NodePrepareResourcesResponse.SerializeToString,
                ),
                "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
                    self.NodeUnprepareResources,
                    request_deserializer=pb.NodeUnprepareResourcesRequest.FromString,
                    response_serializer=pb.NodeUnprepareResourcesResponse.SerializeToString,
                ),
            },
        )

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        resp = self.pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.name, claim.uid)
            outcome = await asyncio.to_thread(self.state.prepare, ref)
            entry = resp.claims[claim.uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            for d in outcome.devices:
                dev = entry.devices.add(
                    request_names=d.requests, pool_name=d.pool_name, device_name=d.device_name,
                    cdi_device_ids=d.cdi_device_ids,
                )  # fmt: skip
                if self.share_ids and d.share_id:
                    dev.share_id = d.share_id
        return resp

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        resp = self.pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.name, claim.uid)
            error = await asyncio.to_thread(self.state.unprepare, ref)
            entry = resp.claims[claim.uid]
            if error:
                entry.error = error
        return resp


def _prepare_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a socket left by a crashed run of this same pod


class PluginServer:
    """Serves the DRA service on the plugin socket and registration on the registry socket."""

    def __init__(
        self,
        state: DeviceState,
        *,
        driver_name: str,
        plugin_dir: str | Path,
        registry_dir: str | Path,
        pod_uid: str | None = None,
        health: HealthFeed | None = None,
    ) -> None:
        self.state = state
        self.health = health
        self.driver_name = driver_name
        self.paths: SocketPaths = socket_paths(plugin_dir, registry_dir, driver_name, pod_uid)
        check_socket_paths(self.paths)
        versions = SUPPORTED_VERSIONS + (HEALTH_VERSIONS if health is not None else ())
        self.registration = RegistrationServicer(driver_name, str(self.paths.dra), versions)
        self._dra_server: grpc.aio.Server | None = None
        self._reg_server: grpc.aio.Server | None = None

    async def start(self) -> None:
        _prepare_socket(self.paths.dra)
        _prepare_socket(self.paths.registration)
        dra = grpc.aio.server()
        handlers = [DraServicer(self.state, "v1").handler(), DraServicer(self.state, "v1beta1").handler()]
        if self.health is not None:  # on the same socket, where the kubelet looks for it
            handlers += [HealthServicer(self.health, v).handler() for v in HEALTH_SERVICES]
        dra.add_generic_rpc_handlers(handlers)
        dra.add_insecure_port(f"unix://{self.paths.dra}")
        await dra.start()
        self._dra_server = dra
        # Registration last: kubelet connects to the DRA socket as soon as it sees this one.
        reg = grpc.aio.server()
        reg.add_generic_rpc_handlers([self.registration.handler()])
        reg.add_insecure_port(f"unix://{self.paths.registration}")
        await reg.start()
        self._reg_server = reg
        log.info("serving %s: DRA socket %s, registration socket %s", self.driver_name, self.paths.dra,
                 self.paths.registration)  # fmt: skip

    async def stop(self, grace: float = 5.0) -> None:
        for server in (self._reg_server, self._dra_server):
            if server is not None:
                await server.stop(grace)
        self._reg_server = self._dra_server = None
        for p in (self.paths.registration, self.paths.dra):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)

    async def wait(self) -> None:
        if self._dra_server is not None:
            await self._dra_server.wait_for_termination()
