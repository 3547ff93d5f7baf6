"""A simulated NVIDIA device plugin: the GPUs of a simulated topology as `nvidia.com/gpu`.

It speaks the kubelet's device plugin API (v1beta1) over gRPC on unix sockets, as NVIDIA's
k8s-device-plugin does: it serves `DevicePlugin` on its own socket in the kubelet's
`device-plugins/` directory and registers through the kubelet's `kubelet.sock`. Devices are the
GPUs' UUIDs; `Allocate` answers what NVIDIA's plugin answers with `--pass-device-specs`: the
UUIDs in `NVIDIA_VISIBLE_DEVICES` and the device nodes (`/dev/nvidiactl`, `/dev/nvidia-uvm`,
`/dev/nvidia<minor>`), here the mknod'ed nodes of the simulated driver root. Health follows NVML's
event wait (an XID outside the application-error set, or a lost GPU, makes a GPU Unhealthy).

Only for nodes that do not run draguard's DRA driver: the two must never hand out the same GPUs
(the driver's coexistence guard refuses a node with `nvidia.com/gpu` capacity).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ..proto import deviceplugin_v1beta1_pb2 as pb
from . import (
    EVENT_XID_CRITICAL,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_TIMEOUT,
    SimNVMLError,
    TopologyError,
    load_topology,
)
from .driverroot import make_driver_root

log = logging.getLogger("draguard.driver.sim.deviceplugin")

API_VERSION = "v1beta1"
RESOURCE = "nvidia.com/gpu"
KUBELET_SOCKET = "kubelet.sock"
SERVICE = "v1beta1.DevicePlugin"
REGISTER = "/v1beta1.Registration/Register"
ENDPOINT = "draguard-sim-nvidia-gpu.sock"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
# XIDs NVIDIA's plugin ignores by default: application errors that leave the GPU usable.
BENIGN_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# A kubelet asks for one pod's containers at a time; anything past these bounds is not a kubelet.
MAX_CONTAINERS = 64
MAX_MESSAGE = 1 << 20


@dataclass(frozen=True)
class Gpu:
    uuid: str
    minor: int


class DevicePlugin:
    """The `DevicePlugin` service over one simulated NVML (a `driver.sim.SimulatedNvml`)."""

    def __init__(self, nvml: Any, driver_root: Path) -> None:
        self.nvml = nvml
        self.driver_root = driver_root
        nvml.nvmlInit()
        self.gpus: dict[str, Gpu] = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(h)
            self.gpus[uuid] = Gpu(uuid, nvml.nvmlDeviceGetMinorNumber(h))
        self.health = dict.fromkeys(self.gpus, HEALTHY)
        self._changed = threading.Condition()
        self._version = 0
        self.stopping = threading.Event()

    # ---- health --------------------------------------------------------------------------------
    def set_health(self, uuid: str, health: str, why: str) -> None:
        with self._changed:
            if self.health.get(uuid) == health:
                return
            self.health[uuid] = health
            self._version += 1
            self._changed.notify_all()
        log.warning("GPU %s is now %s: %s", uuid, health, why)

    def watch_health(self, timeout_ms: int = 1000) -> None:
        """Follow NVML's XID events until `stopping` is set (run in a thread)."""
        nvml = self.nvml
        events = nvml.nvmlEventSetCreate()
        for i in range(nvml.nvmlDeviceGetCount()):
            nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(i), EVENT_XID_CRITICAL, events)
        while not self.stopping.is_set():
            try:
                ev = nvml.nvmlEventSetWait_v2(events, timeout_ms)
            except SimNVMLError as exc:
                if exc.value == NVML_ERROR_TIMEOUT:
                    continue
                if exc.value == NVML_ERROR_GPU_IS_LOST:
                    self._find_lost()
                    # Stop waiting on what is gone: the wait would answer GPU_IS_LOST at once again.
                    events = nvml.nvmlEventSetCreate()
                    for uuid, state in self.health.items():
                        if state == HEALTHY:
                            nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByUUID(uuid),
                                                          EVENT_XID_CRITICAL, events)  # fmt: skip
                    continue
                log.error("NVML event wait failed: %s", exc)
                self.stopping.wait(1.0)
                continue
            uuid = nvml.nvmlDeviceGetUUID(ev.device)
            if ev.eventData in BENIGN_XIDS:
                log.info("GPU %s: XID %d (an application error) ignored", uuid, ev.eventData)
                continue
            self.set_health(uuid, UNHEALTHY, f"XID {ev.eventData}")

    def _find_lost(self) -> None:
        for uuid in self.gpus:
            try:
                self.nvml.nvmlDeviceGetMinorNumber(self.nvml.nvmlDeviceGetHandleByUUID(uuid))
            except SimNVMLError as exc:
                if exc.value == NVML_ERROR_GPU_IS_LOST:
                    self.set_health(uuid, UNHEALTHY, "lost (fell off the bus)")

    # ---- the service ---------------------------------------------------------------------------
    def handler(self) -> grpc.GenericRpcHandler:
        # GetPreferredAllocation and PreStartContainer are left out: the options say neither is
        # offered, so the kubelet never calls them (an unknown method answers UNIMPLEMENTED).
        methods = {
            "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
                self.GetDevicePluginOptions,
                request_deserializer=pb.Empty.FromString,
                response_serializer=pb.DevicePluginOptions.SerializeToString,
            ),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self.ListAndWatch,
                request_deserializer=pb.Empty.FromString,
                response_serializer=pb.ListAndWatchResponse.SerializeToString,
            ),
            "Allocate": grpc.unary_unary_rpc_method_handler(
                self.Allocate,
                request_deserializer=pb.AllocateRequest.FromString,
                response_serializer=pb.AllocateResponse.SerializeToString,
            ),
        }
        return grpc.method_handlers_generic_handler(SERVICE, methods)

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    def _list(self) -> Any:
        return pb.ListAndWatchResponse(
            devices=[pb.Device(ID=u, health=self.health[u]) for u in sorted(self.gpus)]
        )

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        with self._changed:
            seen = self._version
            first = self._list()
        yield first
        while context.is_active() and not self.stopping.is_set():
            with self._changed:
                self._changed.wait(timeout=1.0)
                if self._version == seen:
                    continue
                seen = self._version
                update = self._list()
            yield update

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        asked = len(request.container_requests)
        if asked > MAX_CONTAINERS:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{asked} container requests; at most {MAX_CONTAINERS}"
            )
        out = pb.AllocateResponse()
        for n, creq in enumerate(request.container_requests):
            ids = list(creq.devices_ids)
            if not ids:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"container request {n} names no device")
            unknown = [i for i in ids if i not in self.gpus]
            if unknown:
                shown = ", ".join(repr(i[:64]) for i in unknown[:3])
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"container request {n}: unknown device {shown} ({len(unknown)} unknown); "
                              f"this plugin serves {len(self.gpus)} GPUs by UUID")  # fmt: skip
            if len(set(ids)) != len(ids):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"container request {n} repeats a device")
            resp = out.container_responses.add()
            resp.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
            nodes = ["nvidiactl", "nvidia-uvm", *(f"nvidia{self.gpus[i].minor}" for i in ids)]
            for name in nodes:
                host = str(self.driver_root / "dev" / name)
                resp.devices.add(container_path=f"/dev/{name}", host_path=host, permissions="rw")
            log.info("allocated %s", ",".join(ids))
        return out


class Server:
    """The plugin's gRPC server in the kubelet's device-plugins directory, and its registration.

    The kubelet empties that directory when it starts; `keep_registered` notices its own socket
    gone (or a new kubelet.sock) and serves and registers again, as NVIDIA's plugin does.
    """

    def __init__(self, plugin: DevicePlugin, kubelet_dir: Path, endpoint: str = ENDPOINT,
                 resource: str = RESOURCE) -> None:  # fmt: skip
        self.plugin = plugin
        self.dir = kubelet_dir
        self.endpoint = endpoint
        self.resource = resource
        self.socket = kubelet_dir / endpoint
        self._server: grpc.Server | None = None
        self._kubelet_ino: int | None = None

    def serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8),
            options=[("grpc.max_receive_message_length", MAX_MESSAGE)],
        )
        server.add_generic_rpc_handlers((self.plugin.handler(),))
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def register(self, timeout: float = 10.0) -> None:
        kubelet = self.dir / KUBELET_SOCKET
        with grpc.insecure_channel(f"unix://{kubelet}") as ch:
            register = ch.unary_unary(
                REGISTER, request_serializer=pb.RegisterRequest.SerializeToString,
                response_deserializer=pb.Empty.FromString,
            )  # fmt: skip
            req = pb.RegisterRequest(version=API_VERSION, endpoint=self.endpoint, resource_name=self.resource,
                                     options=pb.DevicePluginOptions())  # fmt: skip
            register(req, timeout=timeout)
        self._kubelet_ino = kubelet.stat().st_ino
        log.info("registered %s with the kubelet at %s (endpoint %s)", self.resource, kubelet, self.endpoint)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    def _kubelet_changed(self) -> bool:
        try:
            ino = (self.dir / KUBELET_SOCKET).stat().st_ino
        except FileNotFoundError:
            return False  # no kubelet now: register when a new one appears
        return ino != self._kubelet_ino or not self.socket.is_socket()

    def keep_registered(self, stop: threading.Event, interval: float = 0.5) -> None:
        """Serve and register, and again whenever the kubelet restarts, until `stop` is set."""
        while not stop.is_set():
            if not (self.dir / KUBELET_SOCKET).is_socket():
                pass  # no kubelet (yet, or restarting): it makes the directory and its socket
            elif self._server is None or self._kubelet_changed():
                try:
                    self.stop()
                    self.serve()
                    self.register()
                except (grpc.RpcError, OSError, RuntimeError) as exc:  # RuntimeError: bind failed
                    log.warning("registration with the kubelet failed (retrying): %s", exc)
                    self._kubelet_ino = None
            stop.wait(interval)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m driver.sim.deviceplugin",
        description="Simulated NVIDIA device plugin: a simulated topology's GPUs as nvidia.com/gpu.",
    )
    ap.add_argument("--topology", required=True, help="simulated NVML topology (file or shipped name)")
    ap.add_argument("--kubelet-dir", type=Path, required=True,
                    help="the kubelet's device-plugins directory (holds kubelet.sock)")  # fmt: skip
    ap.add_argument("--driver-root", type=Path, required=True,
                    help="where to lay out the simulated driver root (mknod in dev/ needs root)")  # fmt: skip
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        nvml = load_topology(args.topology)
    except TopologyError as exc:
        print(f"device plugin: {exc}", file=sys.stderr)
        return 2
    sock = args.kubelet_dir / ENDPOINT
    if len(str(sock)) > 107:
        print(f"device plugin: socket path {sock} is {len(str(sock))} bytes; unix sockets allow 107 "
              "(shorten --kubelet-dir)", file=sys.stderr)  # fmt: skip
        return 2
    info = make_driver_root(args.driver_root, nvml)
    plugin = DevicePlugin(nvml, args.driver_root)
    made = set(map(str, info["deviceNodes"]))  # type: ignore[call-overload]
    missing = [f"/dev/nvidia{g.minor}" for g in plugin.gpus.values() if f"/dev/nvidia{g.minor}" not in made]
    if missing:
        print(f"device plugin: could not mknod {', '.join(missing)} under {args.driver_root}/dev "
              "(needs root)", file=sys.stderr)  # fmt: skip
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    health = threading.Thread(target=plugin.watch_health, name="health", daemon=True)
    health.start()
    server = Server(plugin, args.kubelet_dir)
    log.info("serving %d simulated GPUs as %s (pid %d)", len(plugin.gpus), RESOURCE, os.getpid())
    try:
        server.keep_registered(stop)
    finally:
        plugin.stopping.set()
        server.stop()
        health.join(timeout=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
