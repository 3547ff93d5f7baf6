"""Seeded random DRA scenarios for the differential test against Kubernetes' structured allocator.

A scenario is what kube-scheduler sees when it filters one node for one pod: DeviceClasses,
ResourceSlices (devices on the node, on another node, reachable from every node or through a node
selector; shared counters in slices of their own, as 1.35+ publishes them), claims other pods hold
(`status.allocation`, exclusive devices, shares with consumed capacity, admin access), Node objects,
and the pod's claims. The same objects go to tools/schedoracle (as JSON) and to
webhook/engine/allocate.py (as an inventory), so only the two allocators differ.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

DRIVER = "gpu.nvidia.com"
NODE = "n"  # the node the scheduler filters
OTHER = "m"

# The CEL selectors requests draw from: attribute and capacity tests, presence checks, and one that
# fails at run time on devices without a model (the scheduler then refuses the claim outright).
SELECTORS = (
    f"device.attributes['{DRIVER}'].g == 1",
    f"device.capacity['{DRIVER}'].memory.compareTo(quantity('40Gi')) >= 0",
    f"'model' in device.attributes['{DRIVER}'] && device.attributes['{DRIVER}'].model == 'h100'",
    "device.allowMultipleAllocations",
    f"device.attributes['{DRIVER}'].type == 'gpu' || device.attributes['{DRIVER}'].g == 0",
)
RUNTIME_ERROR_SELECTOR = f"device.attributes['{DRIVER}'].model == 'a100'"

CLASSES = {
    "gpu": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'",
    "mig": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'",
    "any": f"device.driver == '{DRIVER}'",
}

# Request policies of a multi-allocatable device's memory (values in Gi).
POLICIES: tuple[dict[str, Any] | None, ...] = (
    None,
    {"default": "10Gi", "validValues": ["10Gi", "20Gi", "40Gi"]},
    {"default": "8Gi", "validRange": {"min": "8Gi", "max": "64Gi", "step": "8Gi"}},
    {"default": "16Gi", "validRange": {"min": "16Gi", "step": "16Gi"}},
)


@dataclass(frozen=True)
class Scenario:
    seed: int
    classes: list[dict[str, Any]]
    slices: list[dict[str, Any]]
    held: list[dict[str, Any]]  # ResourceClaims other pods hold, with status.allocation
    nodes: list[dict[str, Any]]
    claims: list[dict[str, Any]]  # the pod's ResourceClaims, allocated together
    taint_rules: list[dict[str, Any]] = field(default_factory=list)  # DeviceTaintRules

    def oracle_input(self, name: str = NODE) -> dict[str, Any]:
        """The scheduler's question for one node."""
        node = next(n for n in self.nodes if n["metadata"]["name"] == name)
        return {
            "id": self.seed,
            "deviceClasses": self.classes,
            "resourceSlices": self.slices,
            "claims": self.claims,
            "allocatedClaims": self.held,
            "deviceTaintRules": self.taint_rules,
            "node": {"name": name, "labels": node["metadata"].get("labels", {})},
        }

    def inventory_objects(self) -> list[dict[str, Any]]:
        return [*self.classes, *self.slices, *self.held, *self.nodes, *self.taint_rules]

    def merged_claim(self) -> dict[str, Any]:
        """The pod's claims as one claim spec: requests renamed per claim, each claim's constraints
        naming its own requests. The scheduler allocates a pod's claims together, all or nothing,
        with constraints per claim: one claim of the union poses the same problem."""
        requests: list[dict[str, Any]] = []
        constraints: list[dict[str, Any]] = []
        many = len(self.claims) > 1
        for k, c in enumerate(self.claims):
            devices = c["spec"]["devices"]
            prefix = f"c{k}-" if many else ""
            names = [r["name"] for r in devices["requests"]]
            for r in devices["requests"]:
                requests.append({**r, "name": prefix + r["name"]})
            for con in devices.get("constraints", []):
                covered = con.get("requests") or names
                constraints.append({**con, "requests": [prefix + n for n in covered]})
        spec: dict[str, Any] = {"devices": {"requests": requests}}
        if constraints:
            spec["devices"]["constraints"] = constraints
        return spec


def _fitted(policy: dict[str, Any], mem: int) -> dict[str, Any]:
    """The policy with validRange.max no larger than the device's capacity: the API server refuses a
    slice whose max exceeds it (the allocator alone would take it)."""
    rng = policy.get("validRange")
    if not rng or "max" not in rng or int(rng["max"].removesuffix("Gi")) <= mem:
        return policy
    step = int(rng["step"].removesuffix("Gi"))
    return {**policy, "validRange": {**rng, "max": _q(mem // step * step)}}


def _q(gi: int) -> str:
    return f"{gi}Gi"


class _Gen:
    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.seed = seed

    def chance(self, p: float) -> bool:
        return self.rnd.random() < p

    def taints(self) -> list[dict[str, Any]]:
        out = []
        for _ in range(self.rnd.choice([1, 1, 2])):
            t: dict[str, Any] = {
                "key": self.rnd.choice(["k1", "k2"]),
                "effect": self.rnd.choice(["NoSchedule", "NoExecute", "None"]),
            }
            if self.chance(0.4):
                t["value"] = self.rnd.choice(["a", "b"])
            out.append(t)
        return out

    def device(self, name: str, counters: dict[str, int] | None) -> dict[str, Any]:
        r = self.rnd
        kind = r.choice(["gpu", "gpu", "mig"])
        mem = r.choice([80, 40]) if kind == "gpu" else r.choice([10, 20, 40])
        attrs: dict[str, Any] = {"type": {"string": kind}, "g": {"int": r.randint(0, 1)}}
        if self.chance(0.7):
            attrs["model"] = {"string": r.choice(["h100", "h100", "a100"])}
        dev: dict[str, Any] = {"name": name, "attributes": attrs, "capacity": {"memory": {"value": _q(mem)}}}
        if kind == "gpu" and self.chance(0.3):
            dev["allowMultipleAllocations"] = True
            policy = r.choice(POLICIES)
            if policy is not None:
                dev["capacity"]["memory"]["requestPolicy"] = _fitted(policy, mem)
        if counters is not None and self.chance(0.8):
            # A partition or a full GPU drawing on the pool's one counter set.
            use = {
                c: {"value": _q(mem) if c == "memory" else str(r.randint(1, total))}
                for c, total in counters.items()
            }
            dev["consumesCounters"] = [{"counterSet": "gpu-0", "counters": use}]
        if self.chance(0.25):
            dev["taints"] = self.taints()
        return dev

    def reach(self) -> dict[str, Any]:
        """One device's own node scope (perDeviceNodeSelection)."""
        r = self.rnd
        pick = r.choice(["local", "local", "remote", "all", "zone"])
        if pick == "local":
            return {"nodeName": NODE}
        if pick == "remote":
            return {"nodeName": OTHER}
        if pick == "all":
            return {"allNodes": True}
        term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": [r.choice(["a", "b"])]}]}
        return {"nodeSelector": {"nodeSelectorTerms": [term]}}

    def pool(self, name: str, where: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The slices of one pool and its devices."""
        counters = {"memory": 80, "slices": 7} if self.chance(0.4) else None
        devices = [self.device(f"{name}-d{i}", counters) for i in range(self.rnd.randint(2, 5))]
        per_device = where.get("perDeviceNodeSelection") is True
        if per_device:
            for d in devices:
                d.update(self.reach())
        if self.chance(0.1):
            # Devices the pod waits for after allocation; the scheduler tries such pools last.
            for d in devices:
                d["bindingConditions"] = ["attached"]
                d["bindingFailureConditions"] = ["attach-failed"]
        # Devices in two slices whose names sort against their order here (the scheduler reads a
        # pool's slices by name).
        parts = [devices]
        if len(devices) >= 3 and self.chance(0.25):
            half = len(devices) // 2
            parts = [devices[:half], devices[half:]]
        names = [f"{name}-devices"] if len(parts) == 1 else [f"{name}-devices-b", f"{name}-devices-a"]
        count = len(parts) + (1 if counters else 0)
        pool = {"name": name, "generation": 1, "resourceSliceCount": count}
        kind = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"}
        slices = [{**kind, "metadata": {"name": n},
                   "spec": {"driver": DRIVER, "pool": pool, **where, "devices": part}}
                  for n, part in zip(names, parts, strict=True)]  # fmt: skip
        if counters:
            totals = {c: {"value": _q(v) if c == "memory" else str(v)} for c, v in counters.items()}
            # The API server wants a node scope on every slice, a counter slice of a per-device pool
            # too; the scheduler reads counter slices whatever their scope.
            slices.append({**kind, "metadata": {"name": f"{name}-counters"},
                           "spec": {"driver": DRIVER, "pool": pool, **where,
                                    "sharedCounters": [{"name": "gpu-0", "counters": totals}]}})  # fmt: skip
        return slices, devices

    def held_claim(self, i: int, pool: str, dev: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = {"request": "r", "driver": DRIVER, "pool": pool, "device": dev["name"]}
        # A share as the scheduler records it (shareID + consumed capacity); now and then a result
        # without shareID on a multi-allocatable device, which holds the device whole.
        if dev.get("allowMultipleAllocations") and self.chance(0.85):
            result["shareID"] = f"00000000-0000-0000-0001-{i:012d}"
            result["consumedCapacity"] = {"memory": _q(self.rnd.choice([8, 16, 20, 40]))}
        elif self.chance(0.1):
            result["adminAccess"] = True
        return held_claim([result], i)

    def body(self, allow_admin: bool) -> dict[str, Any]:
        r = self.rnd
        b: dict[str, Any] = {"deviceClassName": r.choice(["gpu", "gpu", "mig", "any"])}
        if self.chance(0.12):
            b["allocationMode"] = "All"
        else:
            b["allocationMode"] = "ExactCount"
            b["count"] = r.choice([1, 1, 1, 2, 2, 3])
        if self.chance(0.3):
            pool = SELECTORS if self.chance(0.93) else (RUNTIME_ERROR_SELECTOR,)
            b["selectors"] = [{"cel": {"expression": r.choice(pool)}}]
        if self.chance(0.3):
            tol: dict[str, Any] = {"key": r.choice(["k1", "k2"])}
            if self.chance(0.5):
                tol["operator"] = "Exists"
            else:
                tol["operator"] = "Equal"
                tol["value"] = r.choice(["a", "b"])
            if self.chance(0.4):
                tol["effect"] = r.choice(["NoSchedule", "NoExecute"])
            b["tolerations"] = [tol]
        if self.chance(0.3):
            b["capacity"] = {"requests": {"memory": _q(r.choice([4, 10, 10, 16, 30, 40, 100]))}}
        if allow_admin and self.chance(0.05):
            b["adminAccess"] = True
        return b

    def claim(self, k: int, admin: bool) -> dict[str, Any]:
        r = self.rnd
        requests: list[dict[str, Any]] = []
        for i in range(r.choice([1, 1, 1, 2, 2, 3])):
            if self.chance(0.25):
                subs = [{"name": f"s{j}", **self.body(False)} for j in range(r.randint(2, 3))]
                requests.append({"name": f"r{i}", "firstAvailable": subs})
            else:
                requests.append({"name": f"r{i}", "exactly": self.body(admin)})
        devices: dict[str, Any] = {"requests": requests}
        if self.chance(0.3):
            con: dict[str, Any] = {
                r.choice(["matchAttribute", "distinctAttribute"]): f"{DRIVER}/{r.choice(['g', 'g', 'model'])}"
            }
            if len(requests) > 1 and self.chance(0.4):
                con["requests"] = [x["name"] for x in r.sample(requests, 2)]
            devices["constraints"] = [con]
        return {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"pod-claim-{k}", "namespace": "team"},
            "spec": {"devices": devices},
        }  # fmt: skip


def generate(seed: int) -> Scenario:
    g = _Gen(seed)
    r = g.rnd
    zone = r.choice(["a", "b"])
    slices: list[dict[str, Any]] = []
    pools: list[tuple[str, list[dict[str, Any]]]] = []
    placements: list[tuple[str, dict[str, Any]]] = [("local", {"nodeName": NODE})]
    if g.chance(0.25):
        placements.append(("a-local", {"nodeName": NODE}))  # a second pool on the node, tried first
    if g.chance(0.2):
        placements.append(("mixed", {"perDeviceNodeSelection": True}))
    if g.chance(0.3):
        placements.append(("remote", {"nodeName": OTHER}))
    if g.chance(0.2):
        placements.append(("fabric", {"allNodes": True}))
    if g.chance(0.2):
        term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": [r.choice(["a", "b"])]}]}
        placements.append(("zonal", {"nodeSelector": {"nodeSelectorTerms": [term]}}))
    for name, where in placements:
        s, devs = g.pool(name, where)
        slices.extend(s)
        pools.append((name, devs))
    held: list[dict[str, Any]] = []
    if g.chance(0.35):
        for i in range(r.randint(1, 2)):
            pool, devs = r.choice(pools)
            dev = r.choice(devs)
            taken = {x["status"]["allocation"]["devices"]["results"][0]["device"] for x in held}
            if dev["name"] in taken and not dev.get("allowMultipleAllocations"):
                continue  # one exclusive device is held by one claim
            held.append(g.held_claim(i, pool, dev))
    rules: list[dict[str, Any]] = []
    if g.chance(0.2):
        for i in range(r.randint(1, 2)):
            pool, devs = r.choice(pools)
            device = r.choice(devs)["name"]
            whole = {"driver": DRIVER, "pool": pool, "device": device}
            selectors = [{"driver": DRIVER}, {"pool": pool}, whole, {"device": device}]
            selector = r.choice(selectors)
            rules.append({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
                          "metadata": {"name": f"rule-{i}"},
                          "spec": {"deviceSelector": selector, "taint": g.taints()[0]}})  # fmt: skip
    # Admin access only in a pod with one claim: the test judges a pod's claims as one merged claim,
    # and an admin-access request may share a device with another claim of the pod, not with a
    # request of its own claim (the merge would forbid what the scheduler allows).
    n = 1 if g.chance(0.7) else 2
    claims = [g.claim(k, n == 1) for k in range(n)]
    return Scenario(seed, classes(), slices, held, nodes(zone), claims, rules)


def classes() -> list[dict[str, Any]]:
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": n},
         "spec": {"selectors": [{"cel": {"expression": e}}]}}
        for n, e in CLASSES.items()
    ]  # fmt: skip


def nodes(zone: str = "a") -> list[dict[str, Any]]:
    other = "b" if zone == "a" else "a"
    return [
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n, "zone": z}}}
        for n, z in ((NODE, zone), (OTHER, other))
    ]  # fmt: skip


def local_slice(devices: list[dict[str, Any]]) -> dict[str, Any]:
    """One complete pool of `devices` on the node the scheduler filters."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "local-devices"},
        "spec": {"driver": DRIVER, "pool": {"name": "local", "generation": 1, "resourceSliceCount": 1},
                 "nodeName": NODE, "devices": devices},
    }  # fmt: skip


def pod_claim(devices: dict[str, Any], k: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"pod-claim-{k}", "namespace": "team"}, "spec": {"devices": devices},
    }  # fmt: skip


def held_claim(results: list[dict[str, Any]], i: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"held-{i}", "namespace": "other", "uid": f"00000000-0000-0000-0002-{i:012d}"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "any"}}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    }  # fmt: skip


def renamed(s: Scenario, prefix: str, node_names: dict[str, str], namespace: str) -> Scenario:
    """The same scenario under names of its own, for a cluster that holds many at once.

    The driver becomes `<prefix>.draguard.io` (so no DeviceClass of another scenario, which selects
    by driver, can see these devices); cluster-scoped objects, claims, pools and devices get `prefix`
    before their names (a DeviceTaintRule may select by pool or device name alone, across drivers);
    every claim moves to `namespace`, and the nodes "n" and "m" become `node_names[...]` (in slices,
    devices and Node objects alike). Only names change, and all of one kind by the same prefix, so
    their order is kept: what can be allocated where does not change.
    """
    driver = f"{prefix}.draguard.io"
    classes = {c["metadata"]["name"]: f"{prefix}-{c['metadata']['name']}" for c in s.classes}

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            out = {k: walk(v) for k, v in x.items()}
            if isinstance(out.get("deviceClassName"), str):
                out["deviceClassName"] = classes.get(out["deviceClassName"], out["deviceClassName"])
            if isinstance(out.get("nodeName"), str):
                out["nodeName"] = node_names.get(out["nodeName"], out["nodeName"])
            for key in ("pool", "device"):  # allocation results and DeviceTaintRule selectors
                if isinstance(out.get(key), str):
                    out[key] = f"{prefix}-{out[key]}"
            return out
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, str):
            return x.replace(DRIVER, driver)  # driver names, CEL selectors, qualified attribute names
        return x

    def named(objs: list[dict[str, Any]], ns: str | None = None) -> list[dict[str, Any]]:
        out = []
        for o in objs:
            o = walk(o)
            meta = {**o["metadata"], "name": f"{prefix}-{o['metadata']['name']}"}
            if ns is not None:
                meta["namespace"] = ns
            out.append({**o, "metadata": meta})
        return out

    def pool(slice_: dict[str, Any]) -> dict[str, Any]:
        spec = dict(slice_["spec"])
        spec["pool"] = {**spec["pool"], "name": f"{prefix}-{spec['pool']['name']}"}
        if "devices" in spec:
            spec["devices"] = [{**d, "name": f"{prefix}-{d['name']}"} for d in spec["devices"]]
        return {**slice_, "spec": spec}

    def node(n: dict[str, Any]) -> dict[str, Any]:
        name = node_names[n["metadata"]["name"]]
        labels = {**n["metadata"].get("labels", {}), "kubernetes.io/hostname": name}
        return {**n, "metadata": {**n["metadata"], "name": name, "labels": labels}}

    return Scenario(
        s.seed,
        named(s.classes),
        [pool(x) for x in named(s.slices)],
        named(s.held, namespace),
        [node(n) for n in s.nodes],
        named(s.claims, namespace),
        named(s.taint_rules),
    )
