"""`draguard assess`: read a live cluster (read-only) and report its GPU use, what migration to DRA
would do, what today's policies would deny, and the production checklist."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .formats import FORMATS

EXIT_OK, EXIT_FAILED_CHECKS, EXIT_USAGE = 0, 1, 2
DRA_PREFERENCE = ("v1", "v1beta2", "v1beta1")


def _fail(message: str) -> int:
    first = message.strip().splitlines()[0] if message.strip() else "failed"
    print(f"draguard assess: {first}", file=sys.stderr)
    return EXIT_USAGE


def assess(
    reader: Any, policies: Any, snapshot: Any = None, now: dt.datetime | None = None
) -> dict[str, Any]:
    """The assessment of the cluster `reader` (a `collect.ClusterReader`) reads."""
    from ..engine.context import ALL_RESOURCE_VERSIONS
    from ..server.caches import ApiError
    from .analyze import Assessor

    server = reader.server_version()
    dra = reader.group_versions("resource.k8s.io")
    known = [v for v in DRA_PREFERENCE if v in dra]
    a = Assessor(
        policies,
        served_versions=frozenset(known) or ALL_RESOURCE_VERSIONS,
        lookup=reader.lookup,
    )

    def feed(api: str, plural: str, kind: str, add: Callable[[list[dict[str, Any]]], None] | None) -> None:
        try:
            for page in reader.pages(api, plural, kind):
                if snapshot is not None:
                    snapshot.write(page)
                if add is not None:
                    add(page)
        except ApiError as e:
            a.unreadable[plural] = f"{api} {plural}: HTTP {e.status} ({str(e)[:160]})"

    feed("v1", "namespaces", "Namespace", a.add_namespaces)
    if known:
        base = f"resource.k8s.io/{known[0]}"
        feed(base, "resourceslices", "ResourceSlice", a.add_slices)
        feed(base, "deviceclasses", "DeviceClass", a.add_classes)
        feed(base, "resourceclaimtemplates", "ResourceClaimTemplate", a.add_templates)
        feed(base, "resourceclaims", "ResourceClaim", a.add_claims)
    feed("v1", "nodes", "Node", a.add_nodes)
    feed("apps/v1", "daemonsets", "DaemonSet", a.add_daemonsets)
    a.extras.update(_admission_facts(reader))
    a.extras.update(_monitoring_facts(reader))
    feed("v1", "pods", "Pod", a.add_pods)
    resources = {v: reader.resource_plurals(f"resource.k8s.io/{v}") for v in dra}
    return a.result(server, dra, now, resources)


def _names(reader: Any, api: str, plural: str, kind: str) -> list[str] | None:
    from ..server.caches import ApiError

    try:
        return sorted(
            str((it.get("metadata") or {}).get("name"))
            for page in reader.pages(api, plural, kind)
            for it in page
        )
    except ApiError:
        return None


def _admission_facts(reader: Any) -> dict[str, Any]:
    api = "admissionregistration.k8s.io/v1"
    v = _names(reader, api, "validatingwebhookconfigurations", "ValidatingWebhookConfiguration")
    m = _names(reader, api, "mutatingwebhookconfigurations", "MutatingWebhookConfiguration")
    p = _names(reader, api, "validatingadmissionpolicies", "ValidatingAdmissionPolicy")
    return {"webhooks": None if v is None or m is None else sorted({*v, *m}), "admissionPolicies": p}


def _monitoring_facts(reader: Any) -> dict[str, Any]:
    versions = reader.group_versions("monitoring.coreos.com")
    if not versions:
        return {"monitoringApi": False}
    from ..server.caches import ApiError

    found: list[str] = []
    try:
        for page in reader.pages(f"monitoring.coreos.com/{versions[0]}", "servicemonitors", "ServiceMonitor"):
            for it in page:
                meta = it.get("metadata") or {}
                name = f"{meta.get('namespace')}/{meta.get('name')}"
                if any(w in name.lower() for w in ("dra", "draguard", "gpu", "dcgm")):
                    found.append(name)
    except ApiError:
        return {"monitoringApi": True, "serviceMonitors": None}
    return {"monitoringApi": True, "serviceMonitors": sorted(found)}


def cmd_assess(args: argparse.Namespace) -> int:
    from ..review.pipeline import ReviewError, load_policy_set
    from .collect import ClusterReader, CollectError, Progress
    from .formats import RENDERERS
    from .snapshot import SnapshotError, SnapshotWriter

    try:
        policies = load_policy_set(args.policies, required=args.policies != "policies")
    except ReviewError as e:
        return _fail(str(e))
    if not policies.all() and not Path(args.policies).exists():
        print(
            f"draguard assess: no {args.policies}/ here: workloads are judged by the built-in checks only "
            "(pass --policies DIR)",
            file=sys.stderr,
        )
    progress = Progress(enabled=not args.quiet)
    try:
        reader = ClusterReader.from_kubeconfig(args.kubeconfig, progress)
        reader.page_size = args.page_size
        if args.snapshot:
            with SnapshotWriter(args.snapshot) as snap:
                result = assess(reader, policies, snap)
            print(f"draguard assess: snapshot of {snap.count} objects in {args.snapshot}", file=sys.stderr)
        else:
            result = assess(reader, policies)
    except (CollectError, SnapshotError) as e:
        return _fail(str(e))
    except Exception as e:  # the API server refusing the basics (401/403 on /version, namespaces)
        return _fail(f"cannot read the cluster: {type(e).__name__}: {e}")
    text = RENDERERS[args.format](result)
    if args.output and args.output != "-":
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:
            return _fail(f"{args.output}: cannot write: {e.strerror or e}")
    else:
        sys.stdout.write(text)
    if args.fail_on_checklist and any(i["status"] == "fail" for i in _items(result)):
        return EXIT_FAILED_CHECKS
    return EXIT_OK


def _items(result: Mapping[str, Any]) -> Iterable[Mapping[str, str]]:
    return result.get("checklist") or []


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "assess",
        help="assess a live cluster's GPU use and DRA readiness (read-only)",
        description="Read a live cluster (list and get only) and report: server and DRA API versions,\n"
        "DRA drivers and their devices, device-plugin GPUs per node, DeviceClasses with the devices\n"
        "they select, every nvidia.com/gpu workload with what migration would do to it, running\n"
        "workloads today's policies would deny, and the production checklist.\n\n"
        "Exit status: 0 done, 1 a checklist item failed (with --fail-on-checklist), 2 the cluster or\n"
        "the policies could not be read.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=cmd_assess)
    p.add_argument(
        "--kubeconfig", metavar="FILE", help="default: in-cluster service account, then $KUBECONFIG"
    )
    p.add_argument("--policies", default="policies", metavar="DIR", help="policies to judge workloads with")
    p.add_argument("--format", "-f", choices=FORMATS, default="text")
    p.add_argument("--output", "-o", metavar="FILE", help="write the report here instead of stdout")
    p.add_argument(
        "--snapshot",
        metavar="FILE",
        help="also write the cluster state `review --cluster-state/--inventory` read",
    )
    p.add_argument("--fail-on-checklist", action="store_true", help="exit 1 when a checklist item fails")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    p.add_argument(
        "--page-size", type=_page_size, default=500, metavar="N", help="objects per list call (default 500)"
    )


def _page_size(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 10000:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number from 1 to 10000")
    return n
