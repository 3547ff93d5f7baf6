"""What the assessment concludes, built from the objects `collect` streams, one object at a time.

Pure: no I/O. Objects are fed kind by kind (`Assessor.add_*`), each reduced to a small summary on
the way, so that memory grows with the number of GPU workloads and devices, never with the number
of pods. Verdicts come from the engine admission and review call (`webhook.engine.evaluate`).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..core.findings import Finding, Mode
from ..core.source import SourceObject
from ..dra.device import Device
from ..dra.inventory import Inventory
from ..dra.objects import as_list, as_map, claim_spec_of, read_device_class, read_slice_devices
from ..dra.workloads import effective_amounts, replicas_of
from ..engine.context import ALL_RESOURCE_VERSIONS, Context, QuotaUsage
from ..engine.evaluate import evaluate
from ..engine.migration import is_legacy_resource, plan_workload
from ..engine.quota import (
    ClaimCharge,
    QuotaCalculator,
    claim_charge,
    team_labels_of,
    usage_from_charges,
)
from ..engine.rules.migrate import claim_api_version, tier_allowed
from ..policy.model import MigrationStrategy, PolicySet
from .owners import Lookup, OwnerRef, Resolved, resolve

LEGACY_PLUGIN = "nvidia.com/gpu"
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
# DaemonSets recognised by name or image: NVIDIA's device plugin, NVIDIA's DRA driver, draguard's driver.
_DS_KINDS = (
    ("nvidia-device-plugin", re.compile(r"nvidia-device-plugin|k8s-device-plugin")),
    ("nvidia-dra-driver", re.compile(r"nvidia-dra-driver|k8s-dra-driver")),
    ("draguard-driver", re.compile(r"draguard.*driver|driver.*draguard")),
)
# Kept per reason at most: a cluster full of violations still gives a readable, bounded report.
MAX_LISTED = 500


def product_of(d: Device) -> str:
    """A device's model as people name it: productName (plus MIG profile), else the driver."""
    attrs = d.attributes.get(d.driver, {})
    name = attrs.get("productName")
    prof = attrs.get("profile")
    text = str(name) if name is not None else d.driver
    return f"{text} MIG {prof}" if prof is not None else text


def legacy_held(spec: Mapping[str, Any]) -> dict[str, int]:
    """Device-plugin GPU resources (`nvidia.com/gpu`, `nvidia.com/mig-*`) a pod spec holds."""
    return effective_amounts(spec, keep=is_legacy_resource)


def deny_findings(findings: Iterable[Finding]) -> list[Finding]:
    """What admission would refuse the request for: enforce-mode findings."""
    return [f for f in findings if f.mode is Mode.ENFORCE]


@dataclass(slots=True)
class DriverSummary:
    driver: str
    slices: int = 0
    devices: int = 0
    by_node: dict[str, int] = field(default_factory=dict)
    by_model: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "slices": self.slices,
            "devices": self.devices,
            "byNode": dict(sorted(self.by_node.items())),
            "byModel": dict(sorted(self.by_model.items())),
        }


@dataclass(slots=True)
class Workload:
    """One object a person edits that runs GPU pods, with what the pods hold now."""

    owner: OwnerRef
    chain: tuple[OwnerRef, ...]
    note: str = ""
    pods: int = 0
    running: int = 0
    legacy: dict[str, int] = field(default_factory=dict)  # resource -> GPUs held by its pods
    claims: int = 0  # pod claim entries (DRA)
    deny: list[dict[str, str]] = field(default_factory=list)  # what admission would refuse today
    migration: dict[str, Any] | None = None

    @property
    def is_legacy(self) -> bool:
        return bool(self.legacy)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "owner": self.owner.to_json(),
            "chain": [str(c) for c in self.chain],
            "pods": self.pods,
            "running": self.running,
            "legacyGpus": dict(sorted(self.legacy.items())),
            "claims": self.claims,
            "deny": self.deny,
        }
        if self.note:
            out["note"] = self.note
        if self.migration is not None:
            out["migration"] = self.migration
        return out


def _finding_json(f: Finding) -> dict[str, str]:
    return {"rule": f.rule, "message": f.message, "fix": f.fix}


@dataclass
class Assessor:
    """Feed objects in this order: namespaces, slices, classes and templates, claims, nodes,
    daemonsets, pods;
    then `result()`."""

    policies: PolicySet
    served_versions: frozenset[str] = ALL_RESOURCE_VERSIONS
    lookup: Lookup = field(default=lambda *_a: None)
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    drivers: dict[str, DriverSummary] = field(default_factory=dict)
    slice_nodes: set[str] = field(default_factory=set)
    devices: list[Device] = field(default_factory=list)
    class_objects: list[dict[str, Any]] = field(default_factory=list)
    template_objects: list[dict[str, Any]] = field(default_factory=list)
    charges: list[ClaimCharge] = field(default_factory=list)
    claim_stats: dict[str, int] = field(default_factory=dict)
    dra_allocated: dict[str, int] = field(default_factory=dict)  # driver -> allocated devices
    reserved_pods: dict[str, str] = field(default_factory=dict)  # pod uid -> claim "ns/name"
    nodes: list[dict[str, Any]] = field(default_factory=list)
    node_names: set[str] = field(default_factory=set)
    daemonsets: list[dict[str, Any]] = field(default_factory=list)
    workloads: dict[OwnerRef, Workload] = field(default_factory=dict)
    pod_stats: dict[str, int] = field(default_factory=dict)
    pod_uids: set[str] = field(default_factory=set)  # pods using claims (for the leak check)
    unreadable: dict[str, str] = field(default_factory=dict)  # resource -> why
    allocated: set[tuple[str, str, str]] = field(default_factory=set)  # (driver, pool, device)
    pending_since: list[str] = field(default_factory=list)  # creationTimestamps of unallocated claims
    # DRA features the objects show in use (partitionable devices, taints, ...).
    signals: set[str] = field(default_factory=set)
    # Facts `collect` gathers besides objects: admission configuration, served monitoring APIs.
    extras: dict[str, Any] = field(default_factory=dict)
    _inventory: Inventory | None = None
    _usage: QuotaUsage | None = None

    # -- feeding ---------------------------------------------------------------------------------

    def add_namespaces(self, items: Iterable[Mapping[str, Any]]) -> None:
        for ns in items:
            meta = as_map(ns.get("metadata"))
            name = str(meta.get("name") or "")
            if name:
                labels = {str(k): str(v) for k, v in as_map(meta.get("labels")).items()}
                labels.setdefault("kubernetes.io/metadata.name", name)
                self.namespace_labels[name] = labels

    def add_slices(self, items: Iterable[Mapping[str, Any]]) -> None:
        for s in items:
            spec = as_map(s.get("spec"))
            driver = str(spec.get("driver") or "?")
            node = spec.get("nodeName")
            if isinstance(node, str) and node:
                self.slice_nodes.add(node)
            summ = self.drivers.setdefault(driver, DriverSummary(driver))
            summ.slices += 1
            self._slice_signals(spec)
            try:
                devs = read_slice_devices(s)
            except Exception:  # a malformed slice is reported as such, the rest still counts
                self.unreadable.setdefault("resourceslices", "some slices could not be read")
                continue
            for d in devs:
                summ.devices += 1
                where = d.node or "(network-attached)"
                summ.by_node[where] = summ.by_node.get(where, 0) + 1
                model = product_of(d)
                summ.by_model[model] = summ.by_model.get(model, 0) + 1
            self.devices.extend(devs)
        self._inventory = None

    def _slice_signals(self, spec: Mapping[str, Any]) -> None:
        if spec.get("sharedCounters"):
            self.signals.add("partitionable devices (ResourceSlice sharedCounters)")
        for raw in as_list(spec.get("devices")):
            d = as_map(raw)
            d = as_map(d.get("basic")) or d  # v1beta1 nests the device under `basic`
            if d.get("taints"):
                self.signals.add("device taints (ResourceSlice devices[].taints)")
            if d.get("allowMultipleAllocations"):
                self.signals.add("consumable capacity (devices[].allowMultipleAllocations)")
            if d.get("bindingConditions"):
                self.signals.add("binding conditions (devices[].bindingConditions)")

    def add_classes(self, items: Iterable[Mapping[str, Any]]) -> None:
        # Few and small, and the snapshot and lint need them whole.
        items = list(items)
        for c in items:
            if as_map(c.get("spec")).get("extendedResourceName"):
                self.signals.add("extended resources served by DRA (DeviceClass extendedResourceName)")
        self.class_objects.extend(dict(c) for c in items)
        self._inventory = None

    def add_templates(self, items: Iterable[Mapping[str, Any]]) -> None:
        # A pod names its template; the tier and quota rules read the class from it.
        self.template_objects.extend(dict(t) for t in items)
        self._inventory = None

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            base = Inventory.from_objects([*self.class_objects, *self.template_objects])
            self._inventory = Inventory(
                devices=tuple(self.devices), classes=base.classes, templates=base.templates
            )
        return self._inventory

    def add_claims(self, items: Iterable[Mapping[str, Any]]) -> None:
        calc = QuotaCalculator(self.inventory)
        st = self.claim_stats
        for c in items:
            st["total"] = st.get("total", 0) + 1
            charge = claim_charge(c, calc)
            if charge is not None:
                self.charges.append(charge)
            status = as_map(c.get("status"))
            alloc = as_map(status.get("allocation"))
            results = as_list(as_map(alloc.get("devices")).get("results"))
            if results:
                st["allocated"] = st.get("allocated", 0) + 1
                for r in results:
                    r = as_map(r)
                    drv = str(r.get("driver") or "?")
                    self.dra_allocated[drv] = self.dra_allocated.get(drv, 0) + 1
                    self.allocated.add((drv, str(r.get("pool") or ""), str(r.get("device") or "")))
            else:
                st["pending"] = st.get("pending", 0) + 1
            meta = as_map(c.get("metadata"))
            if not results and len(self.pending_since) < MAX_LISTED * 20:
                self.pending_since.append(str(meta.get("creationTimestamp") or ""))
            key = f"{meta.get('namespace')}/{meta.get('name')}"
            for r in as_list(status.get("reservedFor")):
                r = as_map(r)
                if r.get("resource") == "pods" and r.get("uid"):
                    self.reserved_pods[str(r["uid"])] = key
        self._usage = None

    @property
    def usage(self) -> QuotaUsage:
        if self._usage is None:
            self._usage = usage_from_charges(
                self.charges, self.namespace_labels, team_labels_of(self.policies)
            )
        return self._usage

    def add_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        for n in items:
            meta, status = as_map(n.get("metadata")), as_map(n.get("status"))
            name = str(meta.get("name") or "")
            self.node_names.add(name)
            cap = {k: str(v) for k, v in as_map(status.get("capacity")).items() if is_legacy_resource(str(k))}
            alloc = {
                k: str(v) for k, v in as_map(status.get("allocatable")).items() if is_legacy_resource(str(k))
            }
            if cap or alloc:
                # GPU feature discovery labels the model; without it the device plugin tells only a count.
                model = as_map(meta.get("labels")).get("nvidia.com/gpu.product")
                self.nodes.append(
                    {"name": name, "model": str(model or "unknown"), "capacity": cap, "allocatable": alloc}
                )

    def add_daemonsets(self, items: Iterable[Mapping[str, Any]]) -> None:
        for ds in items:
            meta, status = as_map(ds.get("metadata")), as_map(ds.get("status"))
            podspec = as_map(as_map(as_map(ds.get("spec")).get("template")).get("spec"))
            images = [str(as_map(c).get("image") or "") for c in as_list(podspec.get("containers"))]
            text = " ".join([str(meta.get("name") or ""), *images])
            for kind, pattern in _DS_KINDS:
                if pattern.search(text):
                    self.daemonsets.append(
                        {
                            "kind": kind,
                            "namespace": str(meta.get("namespace") or ""),
                            "name": str(meta.get("name") or ""),
                            "images": images,
                            "desired": int(status.get("desiredNumberScheduled") or 0),
                            "ready": int(status.get("numberReady") or 0),
                        }
                    )
                    break

    def add_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        st = self.pod_stats
        for pod in items:
            st["total"] = st.get("total", 0) + 1
            spec = as_map(pod.get("spec"))
            legacy = legacy_held(spec)
            claims = len(as_list(spec.get("resourceClaims")))
            if not legacy and not claims:
                continue
            status = as_map(pod.get("status"))
            phase = str(status.get("phase") or "Pending")
            uid = as_map(pod.get("metadata")).get("uid")
            if claims and uid:
                self.pod_uids.add(str(uid))
            if phase in FINISHED_PHASES:
                st["finished"] = st.get("finished", 0) + 1
                continue
            if legacy:
                st["legacy"] = st.get("legacy", 0) + 1
            if claims:
                st["dra"] = st.get("dra", 0) + 1
            self._add_gpu_pod(pod, legacy, claims, phase)

    def _add_gpu_pod(self, pod: Mapping[str, Any], legacy: dict[str, int], claims: int, phase: str) -> None:
        res = resolve(pod, self.lookup)
        w = self.workloads.get(res.owner)
        if w is None:
            if len(self.workloads) >= MAX_LISTED * 20:
                self.pod_stats["unlisted"] = self.pod_stats.get("unlisted", 0) + 1
                return
            w = Workload(res.owner, res.chain, res.note)
            self.workloads[res.owner] = w
            self._judge(w, res, pod)
        w.pods += 1
        w.running += phase == "Running"
        for k, v in legacy.items():
            w.legacy[k] = w.legacy.get(k, 0) + v
        w.claims += claims

    # -- verdicts --------------------------------------------------------------------------------

    def _ctx(self, operation: str, usage: QuotaUsage | None) -> Context:
        return Context(
            namespace_labels=self.namespace_labels,
            usage=usage,
            served_versions=self.served_versions,
            operation=operation,  # type: ignore[arg-type]
        )

    def _judge(self, w: Workload, res: Resolved, pod: Mapping[str, Any]) -> None:
        """Once per workload: what admission would say to it today, and for a legacy one what
        migration would make of it. A controller is judged as an UPDATE (its pods' claims are
        already in the usage); a bare pod, which cannot be updated, as if created again, alone."""
        obj = {"apiVersion": "v1", "kind": "Pod", **(res.obj if res.obj is not None else pod)}
        bare = obj["kind"] == "Pod"
        ctx = self._ctx("CREATE", None) if bare else self._ctx("UPDATE", self.usage)
        report = evaluate([SourceObject(obj)], self.policies, self.inventory, ctx)
        w.deny = [_finding_json(f) for f in deny_findings(report.findings)]
        if legacy_held(as_map(pod.get("spec"))):
            w.migration = self.migration_of(obj)

    def migration_of(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """What `draguard migrate` (or admission in migrate mode) would do to a legacy workload: the
        claim templates, whether the tier policy admits the result, and the quota it would charge."""
        meta = as_map(obj.get("metadata"))
        ns = str(meta.get("namespace") or "default")
        labels = self.namespace_labels.get(ns)
        policy = next((p for p in self.policies.migration if p.scope.applies(ns, labels)), None)
        if policy is None:
            return {"status": "no MigrationPolicy covers namespace " + ns}
        if policy.strategy is not MigrationStrategy.CLAIM_TEMPLATE:
            return {
                "status": f"MigrationPolicy {policy.name} keeps the extended resource "
                f"({policy.strategy.value})",
                "policy": policy.name,
            }
        plan = plan_workload(
            obj,
            policy,
            namespace=ns,
            api_version=claim_api_version(policy, self.served_versions),
            allowed=tier_allowed(self.policies, obj, ns, labels),
        )
        if plan is None:
            return {"status": "no pod template"}
        out: dict[str, Any] = {
            "policy": policy.name,
            "mode": policy.mode_for(ns, labels).value,
            "templates": [
                {"name": e.template, "deviceClass": e.device_class, "count": e.count}
                for e in plan.edits
                if e.claim_name
            ],
            "unmapped": [
                f"{u.section}[{u.container}] {u.resource}: {u.bad_count or u.count}" for u in plan.unmapped
            ],
            "change": plan.describe(),
        }
        if not plan.edits:
            out["status"] = "cannot be migrated automatically"
            return out
        # The result judged as a new object: the tier rule on the rewritten pod template, the
        # quota rule against what the cluster's claims already use.
        items = [SourceObject(plan.rewritten), *(SourceObject(t) for t in plan.templates)]
        report = evaluate(items, self.policies, self.inventory, self._ctx("CREATE", self.usage))
        findings = [f for f in report.findings if f.rule.startswith(("tier/", "quota/"))]
        tier = deny_findings(f for f in findings if f.rule.startswith("tier/"))
        quota = deny_findings(f for f in findings if f.rule.startswith("quota/"))
        out["tier"] = {"admitted": not tier, "findings": [_finding_json(f) for f in tier]}
        calc = QuotaCalculator(self.inventory.merged(Inventory.from_objects(plan.templates)))
        devices: dict[str, int] = {}
        geq = Fraction(0)
        for t in plan.templates:
            read = claim_spec_of(t)
            if read is None:
                continue
            for cls, n in calc.claim_demand(read[0]).items():
                devices[cls] = devices.get(cls, 0) + n
            geq += calc.claim_gpu_equivalents(read[0])
        reps = replicas_of(obj)
        out["quota"] = {
            "replicas": reps,
            "devices": {k: v * reps for k, v in sorted(devices.items())},
            "gpuEquivalents": float(geq * reps),
            "admitted": not quota,
            "findings": [_finding_json(f) for f in quota],
        }
        out["status"] = "admitted after migration" if not tier and not quota else "denied after migration"
        return out

    # -- summary ---------------------------------------------------------------------------------

    def device_classes(self) -> list[dict[str, Any]]:
        """Each DeviceClass with the live devices its selectors match and its CEL lint findings."""
        from ..cel.env import CelCompileError
        from ..cel.match import match_devices

        out = []
        lint = evaluate(
            [SourceObject(c) for c in self.class_objects],
            self.policies,
            self.inventory,
            self._ctx("CREATE", None),
            rule_modules=("cel_lint", "structure"),
        )
        by_name: dict[str, list[Finding]] = {}
        for f in lint.findings:
            # "selects no device" is the device count of 0 the row already shows.
            if f.rule != "cel/no-match":
                by_name.setdefault(f.object.name, []).append(f)
        for obj in self.class_objects:
            dc = read_device_class(obj)
            row: dict[str, Any] = {"name": dc.name, "selectors": [s.expression for s in dc.selectors]}
            try:
                m = match_devices([s.expression for s in dc.selectors], self.devices)
                row["devices"] = len(m.matched)
                row["allocated"] = sum((d.driver, d.pool, d.name) in self.allocated for d in m.matched)
                models: dict[str, int] = {}
                for d in m.matched:
                    models[product_of(d)] = models.get(product_of(d), 0) + 1
                row["models"] = dict(sorted(models.items()))
                if m.errors:
                    row["errors"] = sorted({e.message for e in m.errors})[:5]
            except CelCompileError as e:
                row["devices"] = None
                row["errors"] = [str(e)]
            row["lint"] = [
                {"rule": f.rule, "severity": f.severity.value, "message": f.message}
                for f in by_name.get(dc.name, [])
            ]
            out.append(row)
        return sorted(out, key=lambda r: r["name"])

    def _plugin_by_model(self) -> dict[str, int]:
        """Device-plugin GPUs (node capacity of nvidia.com/gpu) by the node's GPU model label."""
        out: dict[str, int] = {}
        for n in self.nodes:
            try:
                k = int(n["capacity"].get(LEGACY_PLUGIN, 0))
            except ValueError:
                continue
            if k > 0:
                out[n["model"]] = out.get(n["model"], 0) + k
        return dict(sorted(out.items()))

    def result(
        self,
        server: Mapping[str, Any],
        dra_versions: list[str],
        now: dt.datetime | None = None,
        dra_resources: Mapping[str, list[str]] | None = None,
    ) -> dict[str, Any]:
        from .checklist import checklist

        by_model: dict[str, int] = {}
        by_node: dict[str, dict[str, int]] = {}
        for d in self.devices:
            m = product_of(d)
            by_model[m] = by_model.get(m, 0) + 1
            node = by_node.setdefault(d.node or "(network-attached)", {})
            node[m] = node.get(m, 0) + 1
        workloads = sorted(self.workloads.values(), key=lambda w: str(w.owner))
        legacy = [w for w in workloads if w.is_legacy]
        denied = [w for w in workloads if w.deny]
        # Without the pod list every reservation would look leaked: the checklist says unknown instead.
        leaked = (
            []
            if "pods" in self.unreadable
            else sorted({c for uid, c in self.reserved_pods.items() if uid not in self.pod_uids})
        )
        usage = self.usage
        out: dict[str, Any] = {
            "server": {k: server.get(k) for k in ("gitVersion", "major", "minor", "platform") if k in server},
            "dra": {
                "served": dra_versions,
                "resources": dict(dra_resources or {}),
                "signals": sorted(self.signals | _api_signals(dra_resources or {})),
            },
            "drivers": [self.drivers[k].to_json() for k in sorted(self.drivers)],
            "devicesByModel": dict(sorted(by_model.items())),
            "devicesByNode": {k: dict(sorted(v.items())) for k, v in sorted(by_node.items())},
            "daemonSets": self.daemonsets,
            "nodes": sorted(self.nodes, key=lambda n: n["name"]),
            "pluginGpusByModel": self._plugin_by_model(),
            "nodeCount": len(self.node_names),
            "deviceClasses": self.device_classes(),
            "claims": {
                **{"total": 0, "allocated": 0, "pending": 0},
                **self.claim_stats,
                "allocatedByDriver": dict(sorted(self.dra_allocated.items())),
                "reservedForMissingPods": leaked[:MAX_LISTED],
            },
            "usage": {
                "devices": [
                    {"scope": s, "deviceClass": c, "devices": n}
                    for (s, c), n in sorted(usage.devices.items())
                ],
                "gpuEquivalents": dict(sorted(usage.gpu_equivalents.items())),
            },
            "pods": {**{"total": 0, "legacy": 0, "dra": 0}, **self.pod_stats},
            "gpuUse": {
                "legacy": sum(sum(w.legacy.values()) for w in legacy),
                "dra": sum(self.dra_allocated.values()),
            },
            "legacyWorkloads": [w.to_json() for w in legacy[:MAX_LISTED]],
            "legacyWorkloadCount": len(legacy),
            "wouldDeny": [w.to_json() for w in denied[:MAX_LISTED]],
            "wouldDenyCount": len(denied),
            "orphanSlices": sorted(self.slice_nodes - self.node_names)[:MAX_LISTED]
            if self.node_names
            else [],
            "unreadable": dict(sorted(self.unreadable.items())),
            "extras": self.extras,
        }
        out["claims"]["pendingOver5m"] = _older_than(self.pending_since, now, 300)
        out["checklist"] = checklist(out, self.policies, self.namespace_labels)
        return out


def _older_than(stamps: Iterable[str], now: dt.datetime | None, seconds: float) -> int:
    now = now or dt.datetime.now(dt.UTC)
    n = 0
    for s in stamps:
        try:
            t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
        except ValueError:
            continue
        n += (now - t).total_seconds() > seconds
    return n


def _api_signals(resources: Mapping[str, list[str]]) -> set[str]:
    served = {r for names in resources.values() for r in names}
    out = set()
    if "devicetaintrules" in served:
        out.add("DeviceTaintRule API served (DRADeviceTaints)")
    return out
