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
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .schema import DRIVER_NAME

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


def _add_host(p: argparse.ArgumentParser) -> None:
    p.add_argument("--driver-root", default=None,
                   help="where the NVIDIA driver is installed on the host (env DRIVER_ROOT): / (default), "
                        "/run/nvidia/driver (GPU Operator), /home/kubernetes/bin/nvidia (GKE); with --sim, "
                        "a tree made by `draguard driver sim-root`")  # fmt: skip
    p.add_argument("--driver-root-mount", default=None,
                   help="where this process sees the driver root (default: the same path)")  # fmt: skip
    p.add_argument("--dev-root", default=None,
                   help="host directory holding dev/nvidia* (default /; sim roots: their own)")  # fmt: skip
    p.add_argument("--proc-root", default=None,
                   help="directory holding proc/driver/nvidia (default /; sim roots: their own)")  # fmt: skip
    p.add_argument("--cdi-hook", default="auto",
                   help="host path of nvidia-cdi-hook; auto: find it in the driver root; none")  # fmt: skip
    p.add_argument("--driver-capabilities", default="compute,utility",
                   help="driver libraries to inject, as NVIDIA_DRIVER_CAPABILITIES (compute,utility,video,"
                        "graphics,ngx or all)")  # fmt: skip


def _add_sharing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--share-by-capacity", default=None, metavar="all|PRODUCT,...",
                   help="share full GPUs by consumable capacity (memory): `all`, or NVML product names "
                        "separated by commas (see docs/driver-sharing.md); default: off")  # fmt: skip
    p.add_argument("--share-memory-step", default=None, metavar="QUANTITY",
                   help="memory shares are whole multiples of this (default 1Gi)")  # fmt: skip
    p.add_argument("--dynamic-mig", action="store_true",
                   help="publish GPUs in MIG mode as partitionable devices and create MIG instances per "
                        "claim (see docs/driver-sharing.md); needs resource.k8s.io v1")  # fmt: skip


def sharing(args: argparse.Namespace) -> Any:
    """The capacity-sharing setting of the command line (None: off); ValueError naming the flag."""
    from .sharing import parse_capacity_sharing

    return parse_capacity_sharing(args.share_by_capacity, args.share_memory_step)


def driver_root(args: argparse.Namespace) -> Any:
    """--driver-root, else env DRIVER_ROOT, else `/`; seen at --driver-root-mount."""
    from .driverroot import Root

    host = getattr(args, "driver_root", None) or os.environ.get("DRIVER_ROOT") or "/"
    return Root.of(host, getattr(args, "driver_root_mount", None))


def host_layout(args: argparse.Namespace, driver_version: str, root: Any = None) -> Any:
    """The host layout the CDI specs are written for; DriverRootError when the driver root is unusable."""
    from .cdi import HostLayout
    from .driverroot import Root, parse_capabilities, simulated_roots, validate

    root = root or driver_root(args)
    validate(root)

    sim = simulated_roots(root)
    dev = args.dev_root or (sim[0] if sim else "/")
    proc = args.proc_root or (sim[1] if sim else "/")
    caps = parse_capabilities(args.driver_capabilities)
    layout = HostLayout(dev=Root.of(dev), proc=Path(proc), driver=root, driver_version=driver_version,
                        capabilities=caps, hook=args.cdi_hook)  # fmt: skip
    layout.refresh()
    return layout


def register(subparsers: Any) -> None:
    drv = subparsers.add_parser("driver", help="the bundled NVML-backed DRA driver (kubelet plugin)")
    sub = drv.add_subparsers(dest="driver_command", metavar="SUBCOMMAND")

    inv = sub.add_parser("inventory", help="print the ResourceSlices this node would publish")
    _add_source(inv)
    inv.add_argument("--node-name", default=None, help="pool/node name (default: $NODE_NAME or the hostname)")
    inv.add_argument("--driver-name", default=DRIVER_NAME)
    inv.add_argument("--api-version", choices=("v1", "v1beta2", "v1beta1"), default="v1")
    inv.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    _add_sharing(inv)
    inv.set_defaults(func=cmd_inventory)

    spec = sub.add_parser("cdi-spec", help="print the CDI spec prepare would write for these devices")
    _add_source(spec)
    _add_host(spec)
    spec.add_argument("--devices", required=True, help="device names, comma-separated (gpu-0,gpu-1)")
    spec.add_argument("--claim-uid", default="00000000-0000-0000-0000-000000000000",
                      help="the claim UID the spec is written for")  # fmt: skip
    spec.add_argument("--driver-name", default=DRIVER_NAME)
    spec.set_defaults(func=cmd_cdi_spec)

    check = sub.add_parser("self-check", help="inventory, CDI spec and prepare/unprepare over the socket, "
                                              "in the mode the sharing flags choose")  # fmt: skip
    _add_source(check)
    _add_host(check)
    check.add_argument("--device", default=None, help="the device to prepare (default: the first)")
    check.add_argument("--cdicheck", default=None, help="tools/cdicheck binary: validate the spec with it")
    check.add_argument("--driver-name", default=DRIVER_NAME)
    _add_sharing(check)  # the mode to check: the flags `driver run` takes (none: exclusive)
    check.set_defaults(func=cmd_self_check)

    simroot = sub.add_parser("sim-root", help="lay out a simulated driver root (files, device nodes)")
    simroot.add_argument("directory")
    simroot.add_argument("--sim", required=True, metavar="TOPOLOGY.yaml", help="the simulated topology")
    simroot.set_defaults(func=cmd_sim_root)

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
    run.add_argument("--health-port", type=int, default=0,
                     help="port for the /livez, /readyz, /startupz probes (0: off)")  # fmt: skip
    run.add_argument("--pod-uid", default=os.environ.get("POD_UID"),
                     help="this pod's UID (env POD_UID): per-pod sockets for rolling updates")  # fmt: skip
    run.add_argument("--api-version", choices=("v1", "v1beta2", "v1beta1"), default=None,
                     help="resource.k8s.io version to write (default: newest the server offers)")  # fmt: skip
    _add_host(run)
    _add_sharing(run)
    run.add_argument("--resync-seconds", type=float, default=300.0,
                     help="re-read NVML and republish slices this often")  # fmt: skip
    run.set_defaults(func=cmd_run)
    drv.set_defaults(func=lambda _a: (drv.print_help(sys.stderr), 2)[1])


def _err(msg: str) -> int:
    print(f"draguard driver: {msg}", file=sys.stderr)
    return 1


def _open(args: argparse.Namespace, on_error: Any = None) -> Any:
    """NVML (real: libnvidia-ml.so.1 and nvidia-smi from the driver root when it has them)."""
    from .driverroot import find_binary, find_nvml
    from .nvml import open_nvml

    library = smi = None
    if not args.sim:
        root = driver_root(args)
        library, smi = find_nvml(root), find_binary(root, "nvidia-smi")
    return open_nvml(args.sim, args.real, on_error, library, smi)


def cmd_inventory(args: argparse.Namespace) -> int:
    from .devices import build_devices
    from .nvml import NvmlCallError, NvmlUnavailable
    from .sim import TopologyError
    from .slices import SliceValidationError, build_slices, validate_slices

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    node_name = args.node_name or os.environ.get("NODE_NAME") or socket.gethostname().lower()
    try:
        policy = sharing(args)
        nvml = _open(args)
        node = nvml.enumerate()
        devices = build_devices(node, args.driver_name, policy, args.dynamic_mig)
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


def cmd_cdi_spec(args: argparse.Namespace) -> int:
    from .cdi import CdiDevice, CdiError, CdiWriter
    from .devices import build_devices
    from .driverroot import DriverRootError
    from .nvml import NvmlCallError, NvmlUnavailable
    from .sim import TopologyError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        node = _open(args).enumerate()
        devices = {d.name: d for d in build_devices(node, args.driver_name)}
        names = [n.strip() for n in args.devices.split(",") if n.strip()]
        missing = [n for n in names if n not in devices]
        if missing or not names:
            have = ", ".join(devices) or "none"
            what = ", ".join(missing) or "(none given)"
            return _err(f"--devices: unknown device(s) {what}; this node has: {have}")
        if node.simulated and not args.driver_root:
            return _err("--driver-root is required with a simulated topology; make one with "
                        "`draguard driver sim-root DIR --sim TOPOLOGY`, then pass it")  # fmt: skip
        writer = CdiWriter(".", host_layout(args, node.driver_version))
        data = writer.render(args.claim_uid, [CdiDevice(devices[n], ("cdi-spec",)) for n in names])
    except (NvmlUnavailable, NvmlCallError, TopologyError, DriverRootError, CdiError, ValueError) as exc:
        return _err(str(exc))
    sys.stdout.write(data.decode() + "\n")
    return 0


def cmd_self_check(args: argparse.Namespace) -> int:
    from .cdi import CdiError
    from .driverroot import DriverRootError
    from .nvml import NvmlCallError, NvmlUnavailable
    from .selfcheck import run
    from .sim import TopologyError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.sim and not args.driver_root:
        return _err("--driver-root is required with --sim (make one: draguard driver sim-root DIR --sim ...)")
    if args.share_by_capacity and args.dynamic_mig:
        return _err("--share-by-capacity and --dynamic-mig: the check runs one mode at a time; run it twice")
    try:
        return run(args)
    except (NvmlUnavailable, NvmlCallError, TopologyError, DriverRootError, CdiError, ValueError) as exc:
        return _err(str(exc))
    except KeyboardInterrupt:  # scripts/gpu-check.sh's timeout: the cleanup above has run by now
        _err("self-check interrupted (timed out?): GPU CHECK: FAILED")
        return 130


def cmd_sim_root(args: argparse.Namespace) -> int:
    from .sim import TopologyError, load_topology
    from .sim.driverroot import make_driver_root

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        info = make_driver_root(args.directory, load_topology(args.sim))
    except (TopologyError, OSError) as exc:
        return _err(str(exc))
    print(json.dumps(info, indent=2))
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


def check_writable(*dirs: str) -> None:
    """Fail at start, naming the directory and the user, when the plugin cannot write where it must.

    The kubelet's directories are root-owned (0750 on many distributions): the plugin runs as root
    in its privileged container, and any other user is refused here rather than at the first claim.
    """
    for d in dirs:
        p = Path(d)
        # os.path.exists: False (not an exception) where a parent cannot be searched
        probe = p if os.path.exists(p) else next((a for a in p.parents if os.path.exists(a)), Path("/"))
        ok = os.access(probe, os.W_OK | os.X_OK)
        if ok and probe != p:
            try:
                p.mkdir(parents=True, exist_ok=True)
            except OSError:
                ok = False
        if not ok:
            raise DriverStartError(
                f"{d}: not writable by uid {os.getuid()} (gid {os.getgid()}); the kubelet's plugin and CDI "
                "directories are root-owned, so the driver must run as root (runAsUser: 0 in its "
                "privileged container, as kustomize/base/driver/daemonset.yaml sets)"
            )


def _no_driver_here(args: argparse.Namespace) -> bool:
    """True when this node has no NVIDIA kernel driver at all (a node without GPUs)."""
    proc, dev = Path(args.proc_root or "/"), Path(args.dev_root or "/")
    return not (proc / "proc/driver/nvidia/version").exists() and not (dev / "dev/nvidiactl").exists()


def _inventory(args: argparse.Namespace, metrics: Any, plugin_dir: str) -> tuple[Any, Any, list[Any], Any]:
    """(nvml or None, NodeGpus or None, devices, host layout); DriverStartError when unusable."""
    from .cdi import HostLayout
    from .devices import build_devices
    from .driverroot import Root
    from .nvml import NvmlCallError, NvmlUnavailable
    from .sim import TopologyError, load_topology
    from .sim.driverroot import make_driver_root

    try:
        policy = sharing(args)
    except ValueError as exc:
        raise DriverStartError(str(exc)) from None
    try:
        nvml = _open(args, metrics.nvml_error)
        node = nvml.enumerate()
    except (NvmlUnavailable, NvmlCallError) as exc:
        simulated = bool(args.sim or (os.environ.get("DRAGUARD_NVML_SIM") and not args.real))
        if simulated or not _no_driver_here(args):
            raise DriverStartError(str(exc)) from None
        log.warning("no NVIDIA driver on this node (%s): serving no devices", exc)
        return None, None, [], HostLayout()
    except TopologyError as exc:
        raise DriverStartError(str(exc)) from None
    try:
        devices = build_devices(node, args.driver_name, policy, args.dynamic_mig)
        root = None
        if node.simulated and not args.driver_root:
            # The plugin directory has the same path on the host and in the pod.
            root = Root.of(os.path.join(plugin_dir, "sim-driver-root"))
            make_driver_root(root.mount, load_topology(node.source))
            log.warning("SIMULATED driver root laid out in %s", root.host)
        layout = host_layout(args, node.driver_version, root)
    except (ValueError, OSError) as exc:
        raise DriverStartError(str(exc)) from None
    return nvml, node, devices, layout


async def _refused(api: Any, args: argparse.Namespace, version: str, stop: asyncio.Event) -> bool:
    """True (after a stop signal) when another GPU driver serves this node; see driver/coexist.py."""
    from .coexist import find_conflicts, report
    from .health import Probes, serve_probes

    try:
        conflicts = await asyncio.to_thread(find_conflicts, api, args.node_name, args.driver_name, version)
    except Exception as exc:  # the API being unreachable shows up again, clearly, when publishing
        log.warning("could not check for other GPU drivers on this node: %s", exc)
        return False
    if not conflicts:
        return False
    await asyncio.to_thread(report, api, args.node_name, conflicts)
    if args.health_port:  # never started: the probes say so, the pod is restarted and checks again
        serve_probes(Probes(), args.health_port)
    await stop.wait()
    return True


async def run_driver(args: argparse.Namespace) -> int:
    from .cdi import CdiWriter
    from .checkpoint import Checkpoint
    from .devices import build_devices
    from .health import HealthTracker, Probes, XidWatcher, carry_lost, serve_probes
    from .metrics import DriverMetrics
    from .nvml import NvmlCallError, NvmlUnavailable
    from .plugin import HealthFeed, PluginServer
    from .registration import SocketPathError, check_socket_paths, socket_paths
    from .slices import SlicePublisher, SlicePublishError, SliceValidationError
    from .state import DeviceState, KubeClaimReader
    from .status import ClaimStatusWriter

    metrics = DriverMetrics()
    plugin_dir = args.plugin_dir or f"/var/lib/kubelet/plugins/{args.driver_name}"
    check_writable(plugin_dir, args.registry_dir, args.cdi_root)
    try:  # before any work: grpc would only fail at bind, with no word on which setting to change
        check_socket_paths(socket_paths(plugin_dir, args.registry_dir, args.driver_name, args.pod_uid))
    except SocketPathError as exc:
        raise DriverStartError(str(exc)) from None
    nvml, node, devices, layout = _inventory(args, metrics, plugin_dir)
    try:
        publisher = SlicePublisher.from_kubeconfig(
            args.kubeconfig, args.node_name, args.driver_name, version=args.api_version,
            simulated_source=node.source if node is not None and node.simulated else None,
        )  # fmt: skip
    except Exception as exc:  # kubeconfig problems come as assorted exception types
        raise DriverStartError(f"cannot load Kubernetes configuration: {exc}") from None
    loop = asyncio.get_running_loop()
    republish = asyncio.Event()

    def wake() -> None:  # called from the XID thread
        loop.call_soon_threadsafe(republish.set)

    tracker = HealthTracker(on_change=wake)
    version = await asyncio.to_thread(publisher.choose_version)
    if args.dynamic_mig and version == "v1beta1":
        raise DriverStartError(
            "--dynamic-mig publishes counter sets in slices of their own, which needs resource.k8s.io v1 "
            "or v1beta2 (Kubernetes 1.35 or later); this API server offers only v1beta1"
        )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if await _refused(publisher.api, args, version, stop):
        return 0
    status = ClaimStatusWriter(publisher.api, version)
    status.start()
    state = DeviceState(
        driver_name=args.driver_name, node_name=args.node_name, devices=devices,
        checkpoint=Checkpoint(plugin_dir), cdi=CdiWriter(args.cdi_root, layout),
        claims=KubeClaimReader(publisher.api, version), nvml=nvml, metrics=metrics, health=tracker,
        status=status,
    )  # fmt: skip
    report = await asyncio.to_thread(state.recover)
    log.info("recovered checkpoint: kept %d claim(s), rolled back %d, dropped %d", len(report.kept),
             len(report.rolled_back), len(report.dropped))  # fmt: skip
    feed = HealthFeed(args.node_name, lambda: list(state.devices.values()), tracker.reason)
    server = PluginServer(state, driver_name=args.driver_name, plugin_dir=plugin_dir,
                          registry_dir=args.registry_dir, pod_uid=args.pod_uid, health=feed)  # fmt: skip
    await server.start()
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    watcher = None
    if nvml is not None and node is not None and node.gpus:
        watcher = XidWatcher(nvml, tracker, [g.uuid for g in node.gpus])
        watcher.start()
    probes = Probes(registered=server.registration.registered.is_set, watcher=watcher,
                    stale_after=2 * args.resync_seconds + 60)  # fmt: skip
    if args.health_port:
        serve_probes(probes, args.health_port)
    if node is not None:
        for f in node.failed:
            if f.uuid:
                tracker.lost(f.uuid)

    async def publish_loop() -> None:
        current, gpus = devices, list(node.gpus) if node is not None else []
        failures = 0
        while True:
            probes.heartbeat = time.monotonic()
            republish.clear()
            published = tracker.apply(current)
            try:
                await asyncio.to_thread(publisher.publish, published)
                metrics.published(True)
                metrics.set_devices(dict(Counter(d.type for d in current)))
                probes.started = True
                failures = 0
            except (SlicePublishError, SliceValidationError) as exc:
                metrics.published(False)
                log.error("publishing ResourceSlices failed: %s", exc)
                failures += 1
            # After a failed publish, try again soon (5 s, doubling), not a whole resync later.
            wait = min(args.resync_seconds, 5.0 * 2 ** (failures - 1)) if failures else args.resync_seconds
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(republish.wait(), wait)
            if failures:
                continue
            if republish.is_set() or nvml is None:
                continue  # a health change: publish the taints now, read NVML at the next turn
            try:
                fresh_node = await asyncio.to_thread(nvml.enumerate)
                fresh = build_devices(fresh_node, args.driver_name, sharing(args), args.dynamic_mig)
                probes.nvml_ok = True
            except (NvmlCallError, NvmlUnavailable, ValueError) as exc:
                probes.nvml_ok = False
                log.error("re-reading NVML failed, keeping the last inventory: %s", exc)
                continue
            fresh = carry_lost(current, gpus, fresh_node.failed, fresh, tracker)
            failed_at = {f.index for f in fresh_node.failed}
            gpus = list(fresh_node.gpus) + [g for g in gpus if g.index in failed_at]
            if fresh != current:
                log.info("device inventory changed (%d -> %d devices)", len(current), len(fresh))
                state.devices = {d.name: d for d in fresh}
                current = fresh
            if layout.driver is not None:
                await asyncio.to_thread(layout.refresh)

    task = asyncio.create_task(publish_loop())
    await stop.wait()
    log.info("stopping (slices stay published for the next plugin pod)")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if watcher is not None:
        await asyncio.to_thread(watcher.stop)
    await server.stop()
    await asyncio.to_thread(status.stop)
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
