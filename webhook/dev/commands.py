"""`draguard dev up|down|status` and `draguard demo`: the local control plane from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .kube import ApiError
from .node import RealNode, real_node_prerequisites
from .procs import ClusterError, default_state_dir

if TYPE_CHECKING:
    from .cluster import LocalCluster


def register(subparsers: Any) -> None:
    dev = subparsers.add_parser(
        "dev",
        help="local Kubernetes cluster: control plane, a real node with simulated GPUs, simulated nodes "
        "(needs scripts/build-k8s.sh and scripts/build-node.sh)",
    )
    sub = dev.add_subparsers(dest="dev_command", metavar="SUBCOMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"certs, pid files, logs and etcd data (default {default_state_dir()}; env DRAGUARD_DEV_STATE)",
    )
    common.add_argument(
        "--bin-dir",
        type=Path,
        default=None,
        help="Kubernetes binaries (default: $DRAGUARD_K8S_BIN or the newest scripts/build-k8s.sh build)",
    )
    starting = argparse.ArgumentParser(add_help=False)
    starting.add_argument(
        "--no-real-node",
        action="store_true",
        help="only simulated nodes (no kubelet, containerd or root needed; pods are scheduled, never run)",
    )

    up = sub.add_parser("up", parents=[common, starting], help="start etcd, API server, controller-manager, "
                        "scheduler, a real node, simulated nodes, drivers and the webhook")  # fmt: skip
    up.add_argument("--no-webhook", action="store_true", help="do not start or register the webhook")
    up.add_argument("--no-driver", action="store_true", help="do not start the simulated-NVML drivers")
    up.add_argument(
        "--policies", type=Path, default=None, help="policy directory for the webhook (default policies/)"
    )
    up.set_defaults(func=cmd_up)

    down = sub.add_parser(
        "down", parents=[common], help="stop every process `dev up` started and undo the node's host changes"
    )
    down.add_argument("--purge", action="store_true", help="also delete the state directory (logs included)")
    down.set_defaults(func=cmd_down)

    node = sub.add_parser("node", help="add or remove one more real node on a running cluster")
    nsub = node.add_subparsers(dest="node_command", metavar="ACTION")
    add = nsub.add_parser(
        "add",
        parents=[common],
        help="a real node whose GPUs come from the simulated NVIDIA device plugin (nvidia.com/gpu); "
        "draguard's driver does not run there",
    )
    add.add_argument("name", help="the node's name, e.g. gpu-legacy-0")
    add.add_argument(
        "--topology", default="a100-4x-nvlink.yaml", help="simulated GPUs (driver/sim/topologies)"
    )
    add.set_defaults(func=cmd_node_add)
    rm = nsub.add_parser("remove", parents=[common], help="stop an added node and undo its host changes")
    rm.add_argument("name")
    rm.set_defaults(func=cmd_node_remove)
    node.set_defaults(func=lambda _a: (node.print_help(sys.stderr), 2)[1])

    st = sub.add_parser("status", parents=[common], help="what runs, on which ports, where the logs are")
    st.add_argument("-o", "--output", choices=("text", "json"), default="text")
    st.set_defaults(func=cmd_status)
    dev.set_defaults(func=lambda _a: (dev.print_help(sys.stderr), 2)[1])

    demo = subparsers.add_parser(
        "demo",
        parents=[common, starting],
        help="start the local cluster and walk through the article's scenarios",
    )
    demo.add_argument("--down", action="store_true", help="tear the demo cluster down instead")
    demo.add_argument("--keep", action="store_true", help="keep the demo namespaces afterwards")
    demo.set_defaults(func=cmd_demo)


def _cluster(args: argparse.Namespace) -> LocalCluster:
    # The cluster's modules (certificates, network namespaces, process control) load only when a
    # command runs: every `draguard` invocation builds this parser, the offline ones included.
    from .cluster import LocalCluster

    return LocalCluster(args.state_dir, args.bin_dir)


def _fail(msg: str) -> int:
    print(f"draguard dev: {msg}", file=sys.stderr)
    return 1


def _up(
    cluster: LocalCluster,
    args: argparse.Namespace,
    *,
    with_driver: bool = True,
    with_webhook: bool = True,
    policies: Path | None = None,
) -> None:
    from .cluster import DEFAULT_NODES

    if getattr(args, "no_real_node", False):
        cluster.up(DEFAULT_NODES, with_driver=with_driver, with_webhook=with_webhook, policies=policies)
        return
    try:
        images = real_node_prerequisites(cluster.progress)
    except ClusterError as exc:
        raise ClusterError(f"{exc}\n(--no-real-node starts the cluster with simulated nodes only)") from None
    cluster.up(
        DEFAULT_NODES,
        real_node=RealNode(),
        images=images.archives,
        sandbox_image=images.sandbox,
        workload_image=images.workload,
        with_driver=with_driver,
        with_webhook=with_webhook,
        policies=policies,
    )


def cmd_up(args: argparse.Namespace) -> int:
    try:
        cluster = _cluster(args)
        _up(
            cluster,
            args,
            with_driver=not args.no_driver,
            with_webhook=not args.no_webhook,
            policies=args.policies,
        )
    except ClusterError as exc:
        return _fail(str(exc))
    except ApiError as exc:
        return _fail(f"API server refused a set-up request: {exc}")
    print(cluster.kubeconfig)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    try:
        cluster = _cluster(args)
        stopped = cluster.down(keep_logs=not args.purge)
    except ClusterError as exc:
        return _fail(str(exc))
    print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
    return 0


def cmd_node_add(args: argparse.Namespace) -> int:
    try:
        cluster = _cluster(args)
        if not cluster.is_up():
            return _fail(f"no running cluster in {cluster.paths.root}; start one with `draguard dev up`")
        added = cluster.add_node(args.name, topology=args.topology)
    except ClusterError as exc:
        return _fail(str(exc))
    print(f"{added.name}: {added.gpus} x nvidia.com/gpu at {added.net.node_ip} ({added.took:.1f}s)")
    return 0


def cmd_node_remove(args: argparse.Namespace) -> int:
    try:
        done = _cluster(args).remove_node(args.name)
    except ClusterError as exc:
        return _fail(str(exc))
    print(f"removed {args.name}: {', '.join(done)}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    st = cluster.status()
    if args.output == "json":
        print(json.dumps(st, indent=2))
    else:
        print(f"state dir:  {st['state_dir']}")
        print(f"ready:      {'yes' if st['ready'] else 'no'}")
        print(f"kubeconfig: {st['kubeconfig'] or '-'}")
        for name, c in st["components"].items():
            port = st["ports"].get(name, "")
            print(f"  {name:<28} pid {c['pid']:<8} {'running' if c['alive'] else 'STOPPED'} {port}")
        if st["nodes"]:
            print(f"nodes:      {', '.join(st['nodes'])}")
        if st["added_nodes"]:
            print(f"added:      {', '.join(st['added_nodes'])} (real nodes with the simulated device plugin)")
        node = st.get("real_node")
        if node:
            print(f"real node:  {node['name']} ({node['topology']}) at {node['node_ip']} in netns "
                  f"{node['netns']}{'' if node['netns_present'] else ' (MISSING)'}")  # fmt: skip
            print(
                f"            pods {node['pod_cidr']}, Services {node['service_cidr']}, "
                f"API server {node['apiserver']}"
            )
        print(f"logs:       {st['logs']}")
    return 0 if st["ready"] else 3


def cmd_demo(args: argparse.Namespace) -> int:
    if args.down:
        return cmd_down(argparse.Namespace(state_dir=args.state_dir, bin_dir=args.bin_dir, purge=False))
    from .demo import run_demo

    try:
        cluster = _cluster(args)
        _up(cluster, args)
        return run_demo(cluster, keep=args.keep)
    except ClusterError as exc:
        return _fail(str(exc))
