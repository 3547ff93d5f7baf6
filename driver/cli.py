"""`draguard driver inventory` and `draguard driver run`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

import yaml

from driver.schema import DRIVER_NAME

log = logging.getLogger("draguard.driver")

DEFAULT_PLUGIN_DIR = f"/var/lib/kubelet/plugins/{DRIVER_NAME}"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_CDI_ROOT = "/var/run/cdi"


def _add_source(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--sim", metavar="TOPOLOGY.yaml",
                   help="simulate NVML from a topology file (or a shipped name such as h100-8x-nvlink); "
                        "env DRAGUARD_NVML_SIM does the same")  # fmt: skip
    g.add_argument("--real", action="store_true", help="use the real NVML even if DRAGUARD_NVML_SIM is set")


def register(subparsers: Any) -> None:
    drv = subparsers.add_parser("driver", help="the bundled NVML-backed DRA driver (kubelet plugin)")
    sub = drv.add_subparsers(dest="driver_command", metavar="SUBCOMMAND")

    inv = sub.add_parser("inventory", help="print the ResourceSlices this node would publish")
    _add_source(inv)
    inv.add_argument("--node-name", default=None, help="pool/node name (default: $NODE_NAME or the hostname)")
    inv.add_argument("--driver-name", default=DRIVER_NAME)
    inv.add_argument("--api-version", choices=("v1", "v1beta2", "v1beta1"), default="v1")
    inv.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    inv.set_defaults(func=cmd_inventory)

    run = sub.add_parser("run", help="run the kubelet plugin on this node")
    _add_source(run)
    run.add_argument(
        "--node-name", default=os.environ.get("NODE_NAME"), help="this node's name (env NODE_NAME)"
    )
    run.add_argument("--driver-name", default=DRIVER_NAME)
    run.add_argument("--plugin-dir", default=None, help=f"default {DEFAULT_PLUGIN_DIR} (per driver name)")
    run.add_argument("--registry-dir", default=DEFAULT_REGISTRY_DIR)
    run.add_argument("--cdi-root", default=DEFAULT_CDI_ROOT)
    run.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                     help="kubeconfig file; in-cluster config when omitted")  # fmt: skip
    run.add_argument("--metrics-port", type=int, default=9400, help="0 disables the metrics endpoint")
    run.add_argument("--pod-uid", default=os.environ.get("POD_UID"),
                     help="this pod's UID (env POD_UID): per-pod sockets for rolling updates")  # fmt: skip
    run.add_argument("--api-version", choices=("v1", "v1beta2", "v1beta1"), default=None,
                     help="resource.k8s.io version to write (default: newest the server offers)")  # fmt: skip
    run.add_argument("--resync-seconds", type=float, default=300.0,
                     help="re-read NVML and republish slices this often")  # fmt: skip
    run.set_defaults(func=cmd_run)
    drv.set_defaults(func=lambda _a: (drv.print_help(sys.stderr), 2)[1])


def _err(msg: str) -> int:
    print(f"draguard driver: {msg}", file=sys.stderr)
    return 1


def _open(args: argparse.Namespace, on_error: Any = None) -> Any:
    from driver.nvml import open_nvml

    return open_nvml(args.sim, args.real, on_error)


def cmd_inventory(args: argparse.Namespace) -> int:
    from driver.devices import build_devices
    from driver.nvml import NvmlCallError, NvmlUnavailable
    from driver.sim import TopologyError
    from driver.slices import SliceValidationError, build_slices, validate_slices

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    node_name = args.node_name or os.environ.get("NODE_NAME") or socket.gethostname().lower()
    try:
        nvml = _open(args)
        node = nvml.enumerate()
        devices = build_devices(node, args.driver_name)
        slices = build_slices(devices, node_name=node_name, driver_name=args.driver_name, generation=0,
                              version=args.api_version,
                              simulated_source=node.source if node.simulated else None)  # fmt: skip
        validate_slices(slices)
    except (NvmlUnavailable, NvmlCallError, TopologyError, SliceValidationError, ValueError) as exc:
        return _err(str(exc))
    doc = {"apiVersion": "v1", "kind": "List", "items": slices}
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        print(yaml.safe_dump(doc, sort_keys=False, width=120), end="")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.node_name:
        return _err("--node-name (or env NODE_NAME) is required")
    if not args.kubeconfig and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return _err("no Kubernetes API access: pass --kubeconfig FILE, or run inside a pod")
    try:
        return asyncio.run(run_driver(args))
    except DriverStartError as exc:
        return _err(str(exc))


class DriverStartError(RuntimeError):
    pass


async def run_driver(args: argparse.Namespace) -> int:
    from driver.cdi import CdiWriter
    from driver.checkpoint import Checkpoint
    from driver.devices import build_devices
    from driver.metrics import DriverMetrics
    from driver.nvml import NvmlCallError, NvmlUnavailable
    from driver.plugin import PluginServer
    from driver.sim import TopologyError
    from driver.slices import SlicePublisher, SlicePublishError, SliceValidationError
    from driver.state import DeviceState, KubeClaimReader

    metrics = DriverMetrics()
    plugin_dir = args.plugin_dir or f"/var/lib/kubelet/plugins/{args.driver_name}"
    try:
        nvml = _open(args, metrics.nvml_error)
        node = nvml.enumerate()
        devices = build_devices(node, args.driver_name)
        publisher = SlicePublisher.from_kubeconfig(
            args.kubeconfig, args.node_name, args.driver_name, version=args.api_version,
            simulated_source=node.source if node.simulated else None,
        )  # fmt: skip
    except (NvmlUnavailable, NvmlCallError, TopologyError, ValueError) as exc:
        raise DriverStartError(str(exc)) from None
    except Exception as exc:  # kubeconfig problems come as assorted exception types
        raise DriverStartError(f"cannot load Kubernetes configuration: {exc}") from None
    version = await asyncio.to_thread(publisher.choose_version)
    state = DeviceState(
        driver_name=args.driver_name, node_name=args.node_name, devices=devices,
        checkpoint=Checkpoint(plugin_dir), cdi=CdiWriter(args.cdi_root),
        claims=KubeClaimReader(publisher.api, version), nvml=nvml, metrics=metrics,
    )  # fmt: skip
    report = await asyncio.to_thread(state.recover)
    log.info("recovered checkpoint: kept %d claim(s), rolled back %d, dropped %d", len(report.kept),
             len(report.rolled_back), len(report.dropped))  # fmt: skip
    server = PluginServer(state, driver_name=args.driver_name, plugin_dir=plugin_dir,
                          registry_dir=args.registry_dir, pod_uid=args.pod_uid)  # fmt: skip
    await server.start()
    if args.metrics_port:
        metrics.serve(args.metrics_port)

    async def publish_loop() -> None:
        current = devices
        while True:
            try:
                await asyncio.to_thread(publisher.publish, current)
                metrics.slice_publishes.labels(result="success").inc()
                metrics.set_devices(dict(Counter(d.type for d in current)))
            except (SlicePublishError, SliceValidationError) as exc:
                metrics.slice_publishes.labels(result="error").inc()
                metrics.errors.labels(operation="publish").inc()
                log.error("publishing ResourceSlices failed: %s", exc)
            await asyncio.sleep(args.resync_seconds)
            try:
                fresh = build_devices(await asyncio.to_thread(nvml.enumerate), args.driver_name)
            except (NvmlCallError, ValueError) as exc:
                log.error("re-reading NVML failed, keeping the last inventory: %s", exc)
                continue
            if fresh != current:
                log.info("device inventory changed (%d -> %d devices)", len(current), len(fresh))
                state.devices = {d.name: d for d in fresh}
                current = fresh

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(publish_loop())
    await stop.wait()
    log.info("stopping (slices stay published for the next plugin pod)")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point with only the driver commands (`python -m driver.cli driver inventory ...`)."""
    parser = argparse.ArgumentParser(prog="draguard")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return int(func(args))


if __name__ == "__main__":
    sys.exit(main())
