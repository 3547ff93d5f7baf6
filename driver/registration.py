"""Kubelet plugin registration: the `pluginregistration.Registration` service and socket names.

During a rolling update of the plugin DaemonSet the old and the new pod run side by side; each
uses sockets named after its pod UID (`<driver>-<podUID>-reg.sock`, `dra-<podUID>.sock`), so
neither removes the other's socket and kubelet always has one plugin to talk to.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from .proto import pluginregistration_pb2 as reg_pb2

log = logging.getLogger("draguard.driver.registration")

SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # newest first: kubelet takes the first it knows
# The optional health service is advertised in the same list: kubelet 1.37 opens the health stream
# only for a plugin whose registration names one of these (its pickHealthService).
HEALTH_VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
PLUGIN_TYPE = "DRAPlugin"
# sun_path is 108 bytes on Linux, its terminating NUL included.
MAX_SOCKET_PATH = 107


@dataclass(frozen=True)
class SocketPaths:
    registration: Path
    dra: Path


def socket_paths(plugin_dir: str | Path, registry_dir: str | Path, driver_name: str,
                 pod_uid: str | None = None) -> SocketPaths:  # fmt: skip
    """Where the two sockets live; per-pod-UID names when `pod_uid` is set (rolling updates)."""
    if pod_uid:
        return SocketPaths(
            Path(registry_dir) / f"{driver_name}-{pod_uid}-reg.sock", Path(plugin_dir) / f"dra-{pod_uid}.sock"
        )
    return SocketPaths(Path(registry_dir) / f"{driver_name}-reg.sock", Path(plugin_dir) / "dra.sock")


class SocketPathError(ValueError):
    """A socket path the kernel cannot bind (too long for sun_path)."""


def check_socket_paths(paths: SocketPaths) -> None:
    """Refuse, naming the path, its length and the setting to change, a socket path over the limit."""
    for path, setting in ((paths.dra, "--plugin-dir"), (paths.registration, "--registry-dir")):
        n = len(os.fsencode(path))
        if n > MAX_SOCKET_PATH:
            raise SocketPathError(
                f"unix socket path {path} is {n} bytes; Linux allows at most {MAX_SOCKET_PATH} "
                f"(sun_path is 108 bytes with its terminating NUL). Shorten {setting} (the kubelet's "
                "default /var/lib/kubelet/plugins and plugins_registry fit; a kubelet --root-dir "
                "moves them) or use a shorter --pod-uid"
            )


REGISTRATION_SERVICE = "pluginregistration.Registration"


class RegistrationServicer:
    """Answers kubelet's GetInfo and records what kubelet reports back."""

    def __init__(
        self, driver_name: str, endpoint: str, versions: tuple[str, ...] = SUPPORTED_VERSIONS
    ) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.versions = versions
        self.registered = asyncio.Event()
        self.last_error = ""

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=list(self.versions),
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            log.info("kubelet registered plugin %s (endpoint %s)", self.driver_name, self.endpoint)
            self.last_error = ""
            self.registered.set()
        else:
            self.last_error = request.error
            log.error("kubelet refused plugin %s: %s", self.driver_name, request.error)
        return reg_pb2.RegistrationStatusResponse()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            REGISTRATION_SERVICE,
            {
                "GetInfo": grpc.unary_unary_rpc_method_handler(
                    self.GetInfo,
                    request_deserializer=reg_pb2.InfoRequest.FromString,
                    response_serializer=reg_pb2.PluginInfo.SerializeToString,
                ),
                "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                    self.NotifyRegistrationStatus,
                    request_deserializer=reg_pb2.RegistrationStatus.FromString,
                    response_serializer=reg_pb2.RegistrationStatusResponse.SerializeToString,
                ),
            },
        )
