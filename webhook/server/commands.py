"""`draguard serve`, `draguard certs`, `draguard quota render|usage`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import yaml

from ..dra import yamlload


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the admission webhook (POST /validate, /mutate)")
    p.add_argument(
        "--host",
        default=None,
        help="address to listen on (default: every interface, IPv4 and IPv6, so IPv6-only pods work too)",
    )
    p.add_argument("--port", type=int, default=8443)
    p.add_argument(
        "--tls-cert", required=True, metavar="FILE", help="serving certificate (PEM); reloaded on change"
    )
    p.add_argument("--tls-key", required=True, metavar="FILE", help="serving key (PEM)")
    p.add_argument(
        "--client-ca",
        metavar="FILE",
        help="require client certificates signed by this CA on the serving port (reloaded on change; "
        "a replaced CA is no longer trusted)",
    )
    p.add_argument(
        "--client-name",
        action="append",
        default=[],
        metavar="NAME",
        help="with --client-ca: accept only client certificates with this subject CN or DNS/URI SAN "
        "(repeatable)",
    )
    p.add_argument(
        "--probe-port",
        type=int,
        default=0,
        help="plain-HTTP port for /healthz, /readyz and /metrics, which then leave the serving port "
        "(the bundle uses 8081; required with --client-ca, so kubelet and Prometheus need no client "
        "certificate; default 0: everything on the serving port)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="close a connection that sends no complete request headers for this long, before its "
        "first request or between requests (default 30)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="answer 408 when a request body has not arrived this long after its headers (default 10)",
    )
    p.add_argument(
        "--watch-stale-after",
        type=float,
        default=60.0,
        metavar="S",
        help="report not ready while a watch has been failing for longer than this (default 60)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=256,
        help="open connections on the serving port; at the limit the oldest idle one is closed (default 256)",
    )
    p.add_argument(
        "--policies", required=True, metavar="DIR", help="policy directory or file; reloaded on change"
    )
    p.add_argument("--kubeconfig", metavar="FILE", help="default: in-cluster config, then ~/.kube/config")
    p.add_argument("--inventory", metavar="FILE", help="ResourceSlices/DeviceClasses file (with --no-watch)")
    p.add_argument("--no-watch", action="store_true", help="do not watch the cluster (use --inventory)")
    p.add_argument(
        "--shutdown-delay",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between readiness turning false and closing the listener (default 5)",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="how often policy and certificate files are checked (default 2)",
    )
    p.add_argument(
        "--template-timeout",
        type=float,
        default=2.0,
        metavar="S",
        help="timeout for creating a migration ResourceClaimTemplate (default 2)",
    )
    p.add_argument(
        "--inject-ca-bundle",
        metavar="FILE",
        help="keep this PEM CA bundle (the mounted ca.crt) in the webhook configurations' caBundle",
    )
    p.add_argument("--webhook-config", default="draguard", metavar="NAME", help="their name (draguard)")
    p.add_argument(
        "--no-review-cache",
        action="store_true",
        help="evaluate every request, even byte-identical repeats under unchanged policies and caches",
    )
    p.add_argument(
        "--quota-ledger-namespace",
        default="draguard-quota",
        metavar="NS",
        help="namespace of the quota ledgers that keep budgets exact across replicas ('' = off: each "
        "replica checks budgets against its own caches)",
    )
    p.add_argument(
        "--quota-timeout",
        type=float,
        default=1.5,
        metavar="SECONDS",
        help="longest a claim create waits on the quota ledger before it is denied (default 1.5)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_serve)

    c = sub.add_parser("certs", help="issue or renew the webhook CA and serving certificate")
    c.add_argument("--namespace", default="draguard-system")
    c.add_argument("--service", default="draguard-webhook")
    c.add_argument("--secret", default="draguard-webhook-tls")
    c.add_argument(
        "--webhook-config",
        default="draguard",
        help="name of the Mutating/ValidatingWebhookConfiguration to inject the CA bundle into",
    )
    c.add_argument("--out-dir", metavar="DIR", help="write files here instead of Secrets")
    c.add_argument("--kubeconfig", metavar="FILE")
    c.add_argument(
        "--extra-san",
        action="append",
        default=[],
        metavar="NAME",
        help="extra DNS name or IP address (repeatable), e.g. 127.0.0.1 for a local cluster",
    )
    c.add_argument("--ca-days", type=float, default=3650.0)
    c.add_argument("--cert-days", type=float, default=365.0)
    c.add_argument("--force", action="store_true", help="renew the serving certificate now")
    c.add_argument(
        "--rotate-ca",
        action="store_true",
        help="issue a new CA now (the old one stays in the bundle until it expires)",
    )
    c.add_argument("--no-inject", action="store_true", help="do not touch the webhook configurations")
    c.set_defaults(func=cmd_certs)

    q = sub.add_parser("quota", help="GPU quota: render native ResourceQuotas, show live usage")
    qs = q.add_subparsers(dest="quota_command", metavar="SUBCOMMAND")
    r = qs.add_parser("render", help="ResourceQuota objects for the namespace budgets of GpuQuotaPolicies")
    r.add_argument("--policies", required=True, metavar="DIR")
    r.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="namespaces to expand budget globs over (repeatable)",
    )
    r.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    r.set_defaults(func=cmd_quota_render)
    u = qs.add_parser(
        "usage", help="devices and GPU-equivalents used per namespace and team, against budgets"
    )
    u.add_argument("--policies", required=True, metavar="DIR")
    src = u.add_mutually_exclusive_group()
    src.add_argument(
        "--kubeconfig", metavar="FILE", help="read claims, namespaces, slices and classes from the cluster"
    )
    src.add_argument(
        "--claims", metavar="FILE", help="ResourceClaims (YAML/JSON, List allowed) instead of a cluster"
    )
    u.add_argument("--inventory", metavar="FILE", help="ResourceSlices/DeviceClasses file (with --claims)")
    u.add_argument("-o", "--output", choices=["table", "json"], default="table")
    u.set_defaults(func=cmd_quota_usage)
    q.set_defaults(func=lambda args: (q.print_help(sys.stderr), 2)[1])


def _err(msg: str) -> int:
    print(f"draguard: {msg}", file=sys.stderr)
    return 2


def cmd_serve(args: argparse.Namespace) -> int:
    from ..dra.inventory import InventoryError
    from ..policy.load import PolicyError
    from . import logs
    from .app import ServeOptions, serve
    from .tls import TlsError

    if args.no_watch and not args.inventory:
        print("draguard: --no-watch without --inventory: rules that need devices will skip", file=sys.stderr)
    if args.client_name and not args.client_ca:
        return _err("--client-name needs --client-ca (names are read from verified client certificates)")
    if args.client_ca and not args.probe_port:
        return _err(
            "--client-ca needs --probe-port: kubelet probes and Prometheus have no client certificate"
        )
    if args.max_connections < 1:
        return _err(f"--max-connections must be at least 1, got {args.max_connections}")
    if args.inventory and not args.no_watch:
        return _err("--inventory replaces the cluster caches; pass --no-watch with it")
    logs.setup(args.log_level)
    opts = ServeOptions(
        policies=args.policies,
        host=args.host,
        port=args.port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        client_ca=args.client_ca,
        client_names=tuple(args.client_name),
        probe_port=args.probe_port,
        max_connections=args.max_connections,
        idle_timeout=args.idle_timeout,
        body_timeout=args.body_timeout,
        watch_stale_after=args.watch_stale_after,
        kubeconfig=args.kubeconfig,
        inventory=args.inventory,
        no_watch=args.no_watch,
        shutdown_delay=args.shutdown_delay,
        poll_interval=args.poll_interval,
        template_timeout=args.template_timeout,
        review_cache=not args.no_review_cache,
        inject_ca_bundle=args.inject_ca_bundle,
        webhook_config=args.webhook_config,
        quota_ledger_namespace=args.quota_ledger_namespace or None,
        quota_timeout=args.quota_timeout,
    )
    try:
        return asyncio.run(serve(opts))
    except (TlsError, PolicyError, InventoryError, ValueError) as e:
        return _err(str(e))
    except OSError as e:
        return _err(
            f"cannot listen on {args.host or '*'}:{args.port} (or probe port {args.probe_port}): "
            f"{e.strerror or e}"
        )


def cmd_certs(args: argparse.Namespace) -> int:
    from .. import certs

    names = [*certs.service_names(args.service, args.namespace), *args.extra_san]
    names = list(dict.fromkeys(names))
    inject = None
    try:
        if args.out_dir:
            store: certs.CertStore = certs.DirStore(args.out_dir)
        else:
            store = certs.SecretStore(_core_api(args.kubeconfig), args.namespace, args.secret)
        if not args.no_inject and (not args.out_dir or args.kubeconfig):
            adm = _admission_api(args.kubeconfig)

            def inject(bundle: bytes) -> tuple[list[str], list[str]]:
                return certs.inject_ca_bundle(adm, args.webhook_config, bundle)

        res = certs.ensure_certificates(
            store,
            names,
            ca_days=args.ca_days,
            cert_days=args.cert_days,
            inject=inject,
            force=args.force,
            rotate_ca=args.rotate_ca,
        )
    except certs.CertError as e:
        return _err(str(e))
    except Exception as e:  # kubeconfig problems, unreachable API server
        return _err(f"{type(e).__name__}: {e}")
    what = "issued" if res.serving_issued else "current"
    print(
        f"serving certificate {what} in {store.describe()} for {', '.join(names)}; "
        f"expires {res.serving_not_after:%Y-%m-%d %H:%M} UTC"
    )
    if res.ca_issued:
        print(f"new CA issued; bundle holds {res.bundle_cas} CA(s)")
    for r in res.reasons:
        print(f"  reason: {r}")
    for i in res.injected:
        print(f"CA bundle set on {i}")
    for m in res.missing_configs:
        print(f"warning: {m} not found; run `draguard certs` again after applying it", file=sys.stderr)
    return 0


def _kube_client(kubeconfig: str | None) -> Any:
    from .caches import KubeHttp

    return KubeHttp.from_kubeconfig(kubeconfig).api


def _core_api(kubeconfig: str | None) -> Any:
    from kubernetes import client

    return client.CoreV1Api(_kube_client(kubeconfig))


def _admission_api(kubeconfig: str | None) -> Any:
    from kubernetes import client

    return client.AdmissionregistrationV1Api(_kube_client(kubeconfig))


def cmd_quota_render(args: argparse.Namespace) -> int:
    from ..engine.quota import render_resource_quotas, unrenderable
    from ..policy.load import PolicyError, load_policies

    try:
        policies = load_policies(args.policies)
    except PolicyError as e:
        return _err(str(e))
    objs = render_resource_quotas(policies, args.namespace or None)
    for note in unrenderable(policies, args.namespace or None):
        print(f"note: {note}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}, indent=2))
    else:
        sys.stdout.write(yaml.safe_dump_all(objs, sort_keys=False) if objs else "")
    if not objs:
        print("note: no namespace budget with a fixed class to render", file=sys.stderr)
    return 0


def _read_objects(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror})") from e
    out: list[dict[str, Any]] = []
    docs: list[Any] = [json.loads(text)] if path.endswith(".json") else list(yamlload.load_all(text))
    for d in docs:
        if isinstance(d, dict) and isinstance(d.get("items"), list):
            out.extend(i for i in d["items"] if isinstance(i, dict))
        elif isinstance(d, dict):
            out.append(d)
    return out


def cmd_quota_usage(args: argparse.Namespace) -> int:
    from ..dra.inventory import Inventory, InventoryError, load_inventory
    from ..engine.quota import compute_usage
    from ..policy.load import PolicyError, load_policies

    try:
        policies = load_policies(args.policies)
    except PolicyError as e:
        return _err(str(e))
    labels: dict[str, dict[str, str]] = {}
    try:
        if args.claims:
            claims = _read_objects(args.claims)
            inventory = load_inventory(args.inventory) if args.inventory else Inventory.empty()
        else:
            from .caches import KubeHttp, discover_dra_versions

            http = KubeHttp.from_kubeconfig(args.kubeconfig)
            version, _served = discover_dra_versions(http)
            if version is None:
                return _err("the cluster serves no resource.k8s.io version (v1, v1beta2, v1beta1)")
            base = f"/apis/resource.k8s.io/{version}"
            objs: list[dict[str, Any]] = []
            claims = []
            for res, kind in (
                ("resourceslices", "ResourceSlice"),
                ("deviceclasses", "DeviceClass"),
                ("resourceclaims", "ResourceClaim"),
            ):
                for it in http.get_json(f"{base}/{res}").get("items") or []:
                    it.setdefault("apiVersion", f"resource.k8s.io/{version}")
                    it.setdefault("kind", kind)
                    (claims if kind == "ResourceClaim" else objs).append(it)
            inventory = Inventory.from_objects(objs)
            for ns in http.get_json("/api/v1/namespaces").get("items") or []:
                meta = ns.get("metadata") or {}
                labels[str(meta.get("name"))] = dict(meta.get("labels") or {})
    except (OSError, InventoryError, yaml.YAMLError, ValueError) as e:
        return _err(str(e))
    except Exception as e:  # kubeconfig / connection problems
        return _err(f"cannot read the cluster: {type(e).__name__}: {e}")
    usage = compute_usage(claims, labels, policies, inventory)
    budgets = []
    for pol in policies.quota:
        for b in pol.budgets:
            budgets.append(
                {
                    "policy": pol.name,
                    "scope": b.scope,
                    "name": b.name,
                    "deviceClasses": dict(b.device_classes),
                    "gpuEquivalents": b.gpu_equivalents,
                    "claims": b.claims,
                }
            )
    rows = sorted(usage.devices.items())
    if args.output == "json":
        print(
            json.dumps(
                {
                    "devices": [{"scope": s, "deviceClass": c, "devices": n} for (s, c), n in rows],
                    "gpuEquivalents": dict(sorted(usage.gpu_equivalents.items())),
                    "claims": dict(sorted(usage.claims.items())),
                    "budgets": budgets,
                },
                indent=2,
            )
        )
        return 0
    print(f"{'SCOPE':<28} {'DEVICE CLASS':<40} {'DEVICES':>7}")
    for (scope, cls), n in rows:
        print(f"{scope:<28} {cls:<40} {n:>7}")
    if usage.gpu_equivalents:
        print()
        print(f"{'SCOPE':<28} {'GPU-EQUIVALENTS':>15} {'CLAIMS':>7}")
        for scope, g in sorted(usage.gpu_equivalents.items()):
            print(f"{scope:<28} {g:>15.3f} {usage.claims.get(scope, 0):>7}")
    if not rows:
        print("(no ResourceClaims)")
    return 0
