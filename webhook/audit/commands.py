"""`draguard audit run` (the in-cluster controller) and `draguard audit once` (one scan)."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from typing import Any

import yaml

from .report import DEFAULT_MAX_PARTS, DEFAULT_MAX_RESULTS


def _limits_args(p: Any) -> None:
    p.add_argument("--policies", required=True, metavar="DIR", help="policy directory or file")
    p.add_argument("--kubeconfig", metavar="FILE", help="default: in-cluster config, then ~/.kube/config")
    p.add_argument(
        "--max-results",
        type=int,
        default=DEFAULT_MAX_RESULTS,
        metavar="N",
        help=f"results per report object (default {DEFAULT_MAX_RESULTS})",
    )
    p.add_argument(
        "--max-parts",
        type=int,
        default=DEFAULT_MAX_PARTS,
        metavar="N",
        help=f"report objects per namespace; past them the least severe results are left out and "
        f"counted (default {DEFAULT_MAX_PARTS})",
    )


def register(sub: Any) -> None:
    a = sub.add_parser("audit", help="judge existing objects with the admission engine; write PolicyReports")
    asub = a.add_subparsers(dest="audit_command", metavar="SUBCOMMAND")
    r = asub.add_parser("run", help="scan periodically and on every policy change, writing PolicyReports")
    _limits_args(r)
    r.add_argument(
        "--interval", type=float, default=300.0, metavar="S", help="seconds between scans (default 300)"
    )
    r.add_argument(
        "--poll-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="how often the policy files are checked for changes (default 2)",
    )
    r.add_argument(
        "--no-watch",
        action="store_true",
        help="no watches: changes to workloads show at the next scan only",
    )
    r.add_argument(
        "--debounce",
        type=float,
        default=1.0,
        metavar="S",
        help="a namespace whose objects changed is judged again after S seconds without changes "
        "(at most 10 s after its first change; default 1)",
    )
    r.add_argument(
        "--metrics-host", default="", help="address for /metrics, /healthz, /readyz (default: all)"
    )
    r.add_argument("--metrics-port", type=int, default=8082, help="0: no metrics server (default 8082)")
    r.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    e = r.add_argument_group(
        "leader election", "for two or more replicas: only the holder of a coordination.k8s.io Lease scans"
    )
    e.add_argument(
        "--leader-elect",
        action="store_true",
        help="scan only while holding the Lease; the other replicas wait and take over",
    )
    e.add_argument(
        "--leader-elect-namespace",
        metavar="NS",
        help="namespace of the Lease (default: the pod's, from POD_NAMESPACE or its service account)",
    )
    e.add_argument("--leader-elect-lease", default="draguard-audit", metavar="NAME", help="the Lease's name")
    e.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        metavar="S",
        help="a follower takes over a lease not renewed for S seconds (default 15)",
    )
    e.add_argument(
        "--renew-deadline",
        type=float,
        default=10.0,
        metavar="S",
        help="the leader stops scanning when it could not renew for S seconds; shorter than the lease "
        "duration (default 10)",
    )
    e.add_argument(
        "--retry-period",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between attempts to acquire or renew (default 2)",
    )
    r.set_defaults(func=cmd_run)
    o = asub.add_parser("once", help="one scan: write the reports (or print them with --dry-run)")
    _limits_args(o)
    o.add_argument("--dry-run", action="store_true", help="write nothing to the cluster")
    o.add_argument(
        "-o",
        "--output",
        choices=["summary", "yaml", "json"],
        default="summary",
        help="summary: results per namespace; yaml/json: the report objects",
    )
    o.set_defaults(func=cmd_once)
    a.set_defaults(func=lambda args: (a.print_help(sys.stderr), 2)[1])


def _err(msg: str) -> int:
    print(f"draguard audit: {msg}", file=sys.stderr)
    return 2


def _check(args: argparse.Namespace) -> str | None:
    if args.max_results < 1:
        return f"--max-results must be at least 1, got {args.max_results}"
    if args.max_parts < 1:
        return f"--max-parts must be at least 1, got {args.max_parts}"
    if getattr(args, "interval", 1.0) <= 0 or getattr(args, "poll_interval", 1.0) <= 0:
        return "--interval and --poll-interval must be positive"
    if not 0 <= getattr(args, "debounce", 0.0) <= 10:
        return f"--debounce must be between 0 and 10 seconds, got {args.debounce}"
    return None


def _http(kubeconfig: str | None) -> Any:
    from ..server.caches import KubeHttp

    return KubeHttp.from_kubeconfig(kubeconfig)


def cmd_once(args: argparse.Namespace) -> int:
    from ..policy.load import PolicyError, load_policies
    from .scan import Limits, scan_cluster, summary_rows
    from .source import ScanError
    from .writer import ReportWriter

    bad = _check(args)
    if bad:
        return _err(bad)
    try:
        policies = load_policies(args.policies)
    except (PolicyError, OSError) as e:
        return _err(str(e))
    limits = Limits(max_results=args.max_results, max_parts=args.max_parts)
    try:
        http = _http(args.kubeconfig)
        out = scan_cluster(http, policies, limits)
    except ScanError as e:
        return _err(str(e))
    except Exception as e:  # kubeconfig and connection problems
        return _err(f"cannot read the cluster: {type(e).__name__}: {e}")
    if not args.dry_run:
        res = ReportWriter(http).sync(out.reports)
        if res.failed:
            for f in res.failed:
                print(f"draguard audit: not written: {f}", file=sys.stderr)
            return 1
    if args.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": out.reports}, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump_all(out.reports, sort_keys=False), end="")
    else:
        print(f"{'NAMESPACE':<32} {'PASS':>6} {'FAIL':>6} {'WARN':>6} {'ERROR':>6} {'SKIP':>6}")
        for scope, s in summary_rows(out.reports):
            print(f"{scope:<32} {s['pass']:>6} {s['fail']:>6} {s['warn']:>6} {s['error']:>6} {s['skip']:>6}")
        verb = "would write" if args.dry_run else "wrote"
        print(f"{out.objects} objects judged in {out.seconds:.2f} s; {verb} {len(out.reports)} reports")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from ..server import logs
    from .controller import AuditController, AuditOptions
    from .leader import LeaderElector, LeaseConfig, default_namespace
    from .metrics import serve_http
    from .scan import Limits

    bad = _check(args)
    if bad:
        return _err(bad)
    lease: LeaseConfig | None = None
    if args.leader_elect:
        lease = LeaseConfig(
            namespace=args.leader_elect_namespace or default_namespace(),
            name=args.leader_elect_lease,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
        bad = lease.problem()
        if bad:
            return _err(f"leader election: {bad}")
    logs.setup(args.log_level)
    try:
        http = _http(args.kubeconfig)
    except Exception as e:
        return _err(f"cannot read the cluster configuration: {type(e).__name__}: {e}")
    opts = AuditOptions(
        policies=args.policies,
        interval=args.interval,
        poll_interval=args.poll_interval,
        limits=Limits(max_results=args.max_results, max_parts=args.max_parts),
        watch=not args.no_watch,
        debounce=args.debounce,
    )
    elector = LeaderElector(http, lease) if lease is not None else None
    ctl = AuditController(http, opts, elector=elector)
    if args.metrics_port:
        try:
            serve_http(args.metrics_host, args.metrics_port, ctl.metrics, ctl.ready)
        except OSError as e:
            return _err(f"cannot listen on {args.metrics_host or '*'}:{args.metrics_port}: {e.strerror or e}")
    signal.signal(signal.SIGTERM, lambda *_: ctl.stop())
    with contextlib.suppress(KeyboardInterrupt):
        ctl.run()
    return 0
