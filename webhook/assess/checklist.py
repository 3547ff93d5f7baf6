"""The production checklist of the migration guide draguard follows, item by item, against an
assessment: each item is pass, fail or unknown, with the evidence it was decided on.

Sections follow the guide's: infrastructure, DeviceClass design, workload configuration, RBAC and
security, monitoring and alerting, incident response, performance validation. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..engine.quota import budget_group
from ..policy.model import PolicySet

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
MIN_MINOR = 32  # the guide's minimum: Kubernetes 1.32 (DRA beta, on by default)
LOW_AVAILABILITY = 0.10  # the guide's alert: fewer than 10 % of a class's devices available

SECTIONS = (
    ("infrastructure", "Infrastructure"),
    ("deviceclasses", "DeviceClass design"),
    ("workloads", "Workload configuration"),
    ("security", "RBAC and security"),
    ("monitoring", "Monitoring and alerting"),
    ("incidents", "Incident response"),
    ("performance", "Performance validation"),
)


def _item(section: str, key: str, title: str, status: str, evidence: str) -> dict[str, str]:
    return {
        "section": section,
        "id": f"{section}/{key}",
        "title": title,
        "status": status,
        "evidence": evidence,
    }


def _few(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def server_minor(server: Mapping[str, Any]) -> tuple[int, int] | None:
    """(major, minor) from /version; managed clusters write minor as "32+"."""
    git = str(server.get("gitVersion") or "")
    m = re.match(r"v?(\d+)\.(\d+)", git)
    if m:
        return int(m.group(1)), int(m.group(2))
    try:
        return int(str(server.get("major"))), int(re.sub(r"\D", "", str(server.get("minor"))))
    except ValueError:
        return None


def checklist(
    a: Mapping[str, Any], policies: PolicySet, namespace_labels: Mapping[str, Mapping[str, str]] | None = None
) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    add = out.append
    unreadable: Mapping[str, str] = a.get("unreadable") or {}
    extras: Mapping[str, Any] = a.get("extras") or {}

    # -- infrastructure ----------------------------------------------------------------------------
    ver = server_minor(a.get("server") or {})
    git = (a.get("server") or {}).get("gitVersion", "?")
    if ver is None:
        add(
            _item(
                "infrastructure",
                "version",
                "Kubernetes 1.32 or later",
                UNKNOWN,
                f"server version {git!r} unreadable",
            )
        )
    else:
        ok = ver >= (1, MIN_MINOR)
        add(
            _item(
                "infrastructure",
                "version",
                "Kubernetes 1.32 or later",
                PASS if ok else FAIL,
                f"API server {git}" + ("" if ok else ": upgrade before installing a DRA driver"),
            )
        )
    served = list((a.get("dra") or {}).get("served") or [])
    if "v1" in served:
        add(
            _item(
                "infrastructure",
                "dra-api",
                "DRA API (resource.k8s.io) served",
                PASS,
                f"served: {', '.join(served)}",
            )
        )
    elif served:
        add(
            _item(
                "infrastructure",
                "dra-api",
                "DRA API (resource.k8s.io) served",
                PASS,
                f"served: {', '.join(served)} (beta only; v1 comes with Kubernetes 1.34)",
            )
        )
    else:
        add(
            _item(
                "infrastructure",
                "dra-api",
                "DRA API (resource.k8s.io) served",
                FAIL,
                "resource.k8s.io is not served: enable the DynamicResourceAllocation feature gate and the "
                "resource.k8s.io API on kube-apiserver, kube-scheduler, kube-controller-manager and kubelet",
            )
        )
    drivers = a.get("drivers") or []
    if "resourceslices" in unreadable:
        add(
            _item(
                "infrastructure",
                "driver",
                "A DRA driver publishes devices",
                UNKNOWN,
                unreadable["resourceslices"],
            )
        )
    elif drivers:
        add(
            _item(
                "infrastructure",
                "driver",
                "A DRA driver publishes devices",
                PASS,
                "; ".join(
                    f"{d['driver']}: {d['devices']} devices in {d['slices']} slices on "
                    f"{len(d['byNode'])} nodes"
                    for d in drivers
                ),
            )
        )
    else:
        add(
            _item(
                "infrastructure",
                "driver",
                "A DRA driver publishes devices",
                FAIL,
                "no ResourceSlices: install a DRA driver (NVIDIA's or draguard's)",
            )
        )
    dra_ds = [d for d in a.get("daemonSets") or [] if d["kind"] != "nvidia-device-plugin"]
    if "daemonsets" in unreadable:
        add(
            _item(
                "infrastructure",
                "driver-ready",
                "DRA driver pods ready on every node",
                UNKNOWN,
                unreadable["daemonsets"],
            )
        )
    elif not dra_ds:
        add(
            _item(
                "infrastructure",
                "driver-ready",
                "DRA driver pods ready on every node",
                UNKNOWN,
                "no DaemonSet recognised as a DRA driver (nvidia-dra-driver, draguard driver)",
            )
        )
    else:
        short = [f"{d['namespace']}/{d['name']} {d['ready']}/{d['desired']}" for d in dra_ds]
        bad = [d for d in dra_ds if d["ready"] < d["desired"] or d["desired"] == 0]
        add(
            _item(
                "infrastructure",
                "driver-ready",
                "DRA driver pods ready on every node",
                FAIL if bad else PASS,
                "ready/desired: " + _few(short),
            )
        )
    gpu_nodes = {n for d in drivers if d["driver"] == "gpu.nvidia.com" for n in d["byNode"]}
    plugin_nodes = {
        n["name"]
        for n in a.get("nodes") or []
        if any(_positive(v) for v in (n.get("allocatable") or {}).values())
    }
    both = sorted(gpu_nodes & plugin_nodes)
    if both:
        add(
            _item(
                "infrastructure",
                "coexistence",
                "No node's GPUs offered twice (device plugin and DRA)",
                FAIL,
                f"nodes with nvidia.com/gpu allocatable and gpu.nvidia.com ResourceSlices: {_few(both)}; "
                "label them so only one of the two serves each node",
            )
        )
    else:
        add(
            _item(
                "infrastructure",
                "coexistence",
                "No node's GPUs offered twice (device plugin and DRA)",
                PASS,
                f"{len(plugin_nodes)} nodes via the device plugin, {len(gpu_nodes)} via DRA, none both",
            )
        )

    # -- DeviceClass design ------------------------------------------------------------------------
    classes = a.get("deviceClasses") or []
    devices = sum(d["devices"] for d in drivers)
    if not classes:
        add(
            _item(
                "deviceclasses",
                "exist",
                "DeviceClasses defined",
                FAIL if devices else UNKNOWN,
                "no DeviceClass: define one per GPU model (kustomize/base/deviceclasses)",
            )
        )
    else:
        add(_item("deviceclasses", "exist", "DeviceClasses defined", PASS, f"{len(classes)} DeviceClasses"))
    if classes:
        if not devices:
            add(
                _item(
                    "deviceclasses",
                    "match",
                    "Every DeviceClass selects live devices",
                    UNKNOWN,
                    "no devices published to match against",
                )
            )
        else:
            empty = [c["name"] for c in classes if c.get("devices") == 0]
            add(
                _item(
                    "deviceclasses",
                    "match",
                    "Every DeviceClass selects live devices",
                    FAIL if empty else PASS,
                    f"select no device: {_few(empty)} (check attribute names and values against the slices)"
                    if empty
                    else f"all {len(classes)} select at least one of {devices} devices",
                )
            )
        models = a.get("devicesByModel") or {}
        covered = {m for c in classes for m in (c.get("models") or {})}
        missing = sorted(set(models) - covered)
        add(
            _item(
                "deviceclasses",
                "models",
                "A DeviceClass for every GPU model present",
                FAIL if missing else PASS,
                f"no class selects: {_few(missing)}"
                if missing
                else (
                    f"{len(models)} models, each selected by a class" if models else "no devices published"
                ),
            )
        )
        errors = [
            f"{c['name']}: {f['message']}"
            for c in classes
            for f in c.get("lint") or []
            if f["severity"] == "error"
        ]
        add(
            _item(
                "deviceclasses",
                "cel",
                "DeviceClass CEL selectors lint clean",
                FAIL if errors else PASS,
                _few(errors, 3) if errors else "no CEL lint errors",
            )
        )

    # -- workloads ---------------------------------------------------------------------------------
    pods = a.get("pods") or {}
    legacy = a.get("legacyWorkloads") or []
    if "pods" in unreadable:
        add(
            _item(
                "workloads",
                "legacy",
                "No workload left on the device plugin (nvidia.com/gpu)",
                UNKNOWN,
                unreadable["pods"],
            )
        )
    else:
        n = a.get("legacyWorkloadCount", len(legacy))
        add(
            _item(
                "workloads",
                "legacy",
                "No workload left on the device plugin (nvidia.com/gpu)",
                FAIL if n else PASS,
                f"{pods.get('legacy', 0)} pods in {n} workloads hold {a.get('gpuUse', {}).get('legacy', 0)} "
                f"legacy GPUs; {pods.get('dra', 0)} pods use ResourceClaims"
                if n
                else f"{pods.get('dra', 0)} GPU pods, all on ResourceClaims",
            )
        )
        blocked = [
            str_owner(w)
            for w in legacy
            if (w.get("migration") or {}).get("status") != "admitted after migration"
        ]
        if legacy:
            add(
                _item(
                    "workloads",
                    "migratable",
                    "Every legacy workload migrates and is then admitted",
                    FAIL if blocked else PASS,
                    f"not cleanly: {_few(blocked)}"
                    if blocked
                    else f"all {len(legacy)} would be admitted as DRA",
                )
            )
        deny = a.get("wouldDeny") or []
        add(
            _item(
                "workloads",
                "policy",
                "Running GPU workloads pass today's policies",
                FAIL if deny else PASS,
                "admission would deny: " + _few([f"{str_owner(w)} ({w['deny'][0]['rule']})" for w in deny])
                if deny
                else "none would be denied",
            )
        )
        spaces = sorted({w["owner"]["namespace"] for w in [*legacy, *deny]})
        if policies.quota:
            labels = namespace_labels or {}
            unbudgeted = [ns for ns in spaces if budget_group(policies, ns, labels.get(ns)) is None]
            add(
                _item(
                    "workloads",
                    "quota",
                    "GPU budgets cover every namespace with GPU workloads",
                    FAIL if unbudgeted else PASS,
                    f"no budget: {_few(unbudgeted)}"
                    if unbudgeted
                    else f"{len(spaces)} namespaces, all budgeted",
                )
            )
        else:
            add(
                _item(
                    "workloads",
                    "quota",
                    "GPU budgets cover every namespace with GPU workloads",
                    FAIL,
                    "no GpuQuotaPolicy in the policies given",
                )
            )

    # -- security ----------------------------------------------------------------------------------
    hooks = extras.get("webhooks")
    if hooks is None:
        add(
            _item(
                "security",
                "admission",
                "draguard admission webhooks registered",
                UNKNOWN,
                "webhook configurations not readable",
            )
        )
    else:
        mine = [h for h in hooks if "draguard" in h]
        add(
            _item(
                "security",
                "admission",
                "draguard admission webhooks registered",
                PASS if mine else FAIL,
                ", ".join(mine) if mine else "no draguard webhook configuration: apply the kustomize bundle",
            )
        )
    vaps = extras.get("admissionPolicies")
    if vaps is None:
        add(
            _item(
                "security",
                "label-guard",
                "Only administrators may set draguard.io/* namespace labels",
                UNKNOWN,
                "ValidatingAdmissionPolicies not readable",
            )
        )
    else:
        ok = "draguard-namespace-labels" in vaps
        add(
            _item(
                "security",
                "label-guard",
                "Only administrators may set draguard.io/* namespace labels",
                PASS if ok else FAIL,
                "ValidatingAdmissionPolicy draguard-namespace-labels"
                if ok
                else "no ValidatingAdmissionPolicy draguard-namespace-labels: a tenant can relabel "
                "its namespace to change its budget or migration mode",
            )
        )

    # -- monitoring --------------------------------------------------------------------------------
    claims = a.get("claims") or {}
    old = int(claims.get("pendingOver5m") or 0)
    add(
        _item(
            "monitoring",
            "pending-claims",
            "No ResourceClaim pending for more than 5 minutes",
            FAIL if old else PASS,
            f"{old} of {claims.get('pending', 0)} unallocated claims are older than 5 minutes"
            if old
            else f"{claims.get('pending', 0)} unallocated, none older than 5 minutes",
        )
    )
    low = [
        f"{c['name']} {c['devices'] - c.get('allocated', 0)}/{c['devices']}"
        for c in classes
        if c.get("devices") and (c["devices"] - c.get("allocated", 0)) / c["devices"] < LOW_AVAILABILITY
    ]
    if devices:
        add(
            _item(
                "monitoring",
                "availability",
                "Every DeviceClass has at least 10 % of its devices free",
                FAIL if low else PASS,
                f"free/total: {_few(low)}" if low else "every class above 10 % free",
            )
        )
    else:
        add(
            _item(
                "monitoring",
                "availability",
                "Every DeviceClass has at least 10 % of its devices free",
                UNKNOWN,
                "no devices published",
            )
        )
    if extras.get("monitoringApi"):
        add(
            _item(
                "monitoring",
                "metrics",
                "DRA metrics scraped",
                PASS if extras.get("serviceMonitors") else FAIL,
                f"ServiceMonitors: {_few(extras.get('serviceMonitors') or [])}"
                if extras.get("serviceMonitors")
                else "Prometheus Operator is installed but no ServiceMonitor names a DRA driver or draguard",
            )
        )
    else:
        add(
            _item(
                "monitoring",
                "metrics",
                "DRA metrics scraped",
                UNKNOWN,
                "no Prometheus Operator API (monitoring.coreos.com): check your scrape configuration for the "
                "driver's and the webhook's metrics ports",
            )
        )

    # -- incidents ---------------------------------------------------------------------------------
    leaked = claims.get("reservedForMissingPods") or []
    if "pods" in unreadable:
        add(
            _item(
                "incidents",
                "leaked-claims",
                "No claim held for a pod that no longer exists",
                UNKNOWN,
                unreadable["pods"],
            )
        )
    else:
        add(
            _item(
                "incidents",
                "leaked-claims",
                "No claim held for a pod that no longer exists",
                FAIL if leaked else PASS,
                f"reserved for missing pods: {_few(leaked)} (delete them; restart the node's driver plugin)"
                if leaked
                else f"{claims.get('allocated', 0)} allocated claims, each held by a live pod or none",
            )
        )
    orphans = a.get("orphanSlices") or []
    add(
        _item(
            "incidents",
            "orphan-slices",
            "No ResourceSlice left for a node that is gone",
            FAIL if orphans else PASS,
            f"slices for missing nodes: {_few(orphans)}"
            if orphans
            else f"slices on {len({n for d in drivers for n in d['byNode']})} nodes, all present",
        )
    )

    # -- performance -------------------------------------------------------------------------------
    add(
        _item(
            "performance",
            "allocation-latency",
            "Allocation latency measured (p99 under 30 s)",
            UNKNOWN,
            "not visible through the API: watch dra_allocation_duration_seconds on the driver's metrics",
        )
    )
    return out


def str_owner(w: Mapping[str, Any]) -> str:
    o = w.get("owner") or {}
    return f"{o.get('kind')}/{o.get('namespace')}/{o.get('name')}"


def _positive(v: Any) -> bool:
    try:
        return int(str(v)) > 0
    except ValueError:
        return False
