"""The quota ledger's reconcile pass at a large cluster's size: time, CPU and memory per pass.

    python bench/ledger_reconcile.py [--steps 200,1000,2000] [--passes 7] [--churn 1.0] [--json OUT] [--quick]

`draguard serve --quota-ledger-namespace` keeps one ledger ConfigMap per budget group and runs a
reconcile pass every second in a thread beside the request path (webhook/server/ledger.py): it lists
the ledgers, compares each with the claims its watch holds, GETs the claims the two disagree on and
rewrites the ledgers that changed. What that pass costs grows with the claims and ledgers, and its CPU
is taken from the process that answers admissions, so this bench measures it at the sizes of
bench/cluster_scale.py: per node 25 ResourceClaims (one H100 each), one team namespace per 10 nodes
(each its own budget group under the shipped policies/, so 250 entries per ledger).

One kube-apiserver + etcd (`webhook/dev`, as the other benches start it; the controller-manager and
the scheduler are stopped, so nothing else writes). At each step the ledgers are written to the API
server in the ledger's own format, as a webhook that admitted every claim leaves them, and the claims
are what the watch of a replica holds (the steady state needs no GET, so only the claims a pass GETs
are created in the API server). Per step, with the ledger code `draguard serve` runs:
- **cold**: a new QuotaLedger's first pass (a restarted replica: its per-claim charges are worked out);
- **steady**: `--passes` passes with nothing changed (what a quiet cluster costs every second);
- **churn**: `--churn` % of the claims deleted (the watch stops listing them; a GET answers 404) and
  as many new ones created (the watch lists them, the ledgers lack them), past the reservations' ttl:
  the pass that notices, its GETs and rewrites, then the steady pass after it.
Wall time and the pass's thread CPU time, the API calls it made, the bytes of ledger JSON it listed,
and the Python memory one cold pass allocates at its peak and keeps afterwards (tracemalloc, in a
separate pass so it does not slow the timed ones). Growth between steps is (ratio of the metric) /
(ratio of the claims): at most 1 means linear or better. A benchmark: nothing is asserted on times.
Exit status 0; 2 when a pass wrote what it should not have (the steady state changed a ledger, or the
churn was not reconciled); 3 when the local control plane cannot start (no Kubernetes binaries).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
import tracemalloc
import uuid
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cluster_scale import (  # noqa: E402
    CLAIMS_PER_NODE,
    CLASS,
    NODES_PER_NAMESPACE,
    Creator,
    SliceMaker,
    api_only_cluster,
    claim,
    namespace_of,
    node_name,
    parse_steps,
    say,
)

LEDGERS = "draguard-quota"
TTL = 10.0
EXTRAPOLATE_TO = 10_000


@dataclass
class Step:
    nodes: int

    @property
    def claims(self) -> int:
        return self.nodes * CLAIMS_PER_NODE

    @property
    def groups(self) -> int:
        return -(-self.nodes // NODES_PER_NAMESPACE)


class Clock:
    """The ledger's wall clock: the bench moves it past the reservations' ttl for the churn pass."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class CountingHttp:
    """The webhook's own API client, counting the calls a pass makes and the ledger bytes it lists."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: dict[str, int] = {}
        self.listed_bytes = 0

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    def get_json(self, path: str, query: Any = None, timeout: float = 5.0) -> Any:
        # Counted before the call: a GET answered 404 (a deleted claim) is a call all the same.
        listing = path.endswith("/configmaps")
        self._count("list ledgers" if listing else "get claim" if "/resourceclaims/" in path else "get")
        out = self.inner.get_json(path, query, timeout=timeout)
        if listing:
            self.listed_bytes += sum(len(str((cm.get("data") or {}).get("claims") or "")) for cm in
                                     out.get("items") or [])  # fmt: skip
        return out

    def request_json(self, method: str, path: str, body: Any = None, timeout: float = 5.0) -> Any:
        self._count(
            {"PUT": "rewrite ledger", "POST": "create ledger", "DELETE": "delete ledger"}.get(method, method)
        )
        return self.inner.request_json(method, path, body=body, timeout=timeout)

    def take(self) -> dict[str, int]:
        out, self.calls = self.calls, {}
        return out


class Fleet:
    """The claims the replica's watch holds, the snapshot it reads, and the ledgers in the API server."""

    def __init__(self, creator: Creator, http: Any) -> None:
        from webhook.dra.inventory import Inventory
        from webhook.policy.load import load_policies

        self.creator = creator
        self.http = http
        self.policies = load_policies(ROOT / "policies")
        shipped = ROOT / "kustomize" / "base" / "deviceclasses" / "deviceclasses.yaml"
        self.classes = [o for o in yaml.safe_load_all(shipped.read_text()) if o]
        self.maker = SliceMaker()
        self.slices: list[dict[str, Any]] = []
        self.claims: list[dict[str, Any]] = []
        self.nodes = 0
        self.namespaces: dict[str, dict[str, str]] = {LEDGERS: {}}
        self.inventory = Inventory.from_objects(self.classes)
        self.serial = 0

    def grow(self, step: Step, clock: Clock) -> None:
        from webhook.dra.inventory import Inventory

        for n in range(self.nodes, step.nodes):
            node = node_name(n)
            self.slices += self.maker.slices(node, str(uuid.uuid5(uuid.NAMESPACE_DNS, node)))
            ns = namespace_of(n)
            self.namespaces.setdefault(ns, {})
            for j in range(CLAIMS_PER_NODE):
                self.claims.append(self.watched(ns, f"claim-{n:05d}-{j:02d}"))
        self.nodes = step.nodes
        self.inventory = Inventory.from_objects([*self.classes, *self.slices])
        self.write_ledgers(clock)

    def watched(self, ns: str, name: str, uid: str | None = None) -> dict[str, Any]:
        obj = claim(ns, name)
        obj["metadata"]["uid"] = uid or str(uuid.uuid5(uuid.NAMESPACE_URL, f"{ns}/{name}"))
        obj["metadata"]["resourceVersion"] = "1"
        return obj

    def snapshot(self) -> Any:
        from webhook.server.admission import Snapshot

        return Snapshot(policies=self.policies, inventory=self.inventory, namespace_labels=self.namespaces)

    def write_ledgers(self, clock: Clock) -> None:
        """Every group's ledger as the admissions of its claims left it: one entry per claim, confirmed."""
        from webhook.engine.quota import budget_group
        from webhook.server import ledger

        groups: dict[str, dict[str, ledger.LedgerEntry]] = {}
        reserved = clock.now - 3600
        for obj in self.claims:
            meta = obj["metadata"]
            group = budget_group(self.policies, meta["namespace"], self.namespaces.get(meta["namespace"]))
            if group is None:
                raise SystemExit(f"namespace {meta['namespace']}: no budget of policies/ covers it")
            groups.setdefault(group, {})[f"{meta['namespace']}/{meta['name']}"] = ledger.LedgerEntry(
                {CLASS: 1}, Fraction(1), reserved, meta["uid"]
            )
        base = f"/api/v1/namespaces/{LEDGERS}/configmaps"
        have = {cm["metadata"]["name"]: cm for cm in self.http.get_json(base).get("items") or []}
        for group, entries in sorted(groups.items()):
            name = ledger.ledger_name(group)
            body: dict[str, Any] = {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": LEDGERS,
                             "labels": {ledger.COMPONENT_LABEL: ledger.COMPONENT},
                             "annotations": {ledger.GROUP_ANNOTATION: group}},
                "data": {ledger.DATA_KEY: ledger.encode(entries)},
            }  # fmt: skip
            if name in have:
                body["metadata"]["resourceVersion"] = have[name]["metadata"]["resourceVersion"]
                self.http.request_json("PUT", f"{base}/{name}", body=body)
            else:
                self.http.request_json("POST", base, body=body)

    def churn(self, fraction: float) -> tuple[int, int]:
        """Delete `fraction` of the claims (evenly spread) from the watch and create as many new ones
        in the API server and the watch: what the next pass must release and add."""
        k = max(1, int(len(self.claims) * fraction))
        stride = max(1, len(self.claims) // k)
        gone = set(range(0, len(self.claims), stride)[:k])
        kept = [c for i, c in enumerate(self.claims) if i not in gone]
        new: list[dict[str, Any]] = []
        objs: list[tuple[str, dict[str, Any]]] = []
        for i in sorted(gone):
            ns = self.claims[i]["metadata"]["namespace"]
            self.serial += 1
            name = f"new-{self.serial:06d}"
            objs.append((f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim(ns, name)))
        for i in sorted(gone):
            # A claim an earlier churn created exists in the API server: deleted there too.
            meta = self.claims[i]["metadata"]
            if meta["name"].startswith("new-"):
                self.http.request_json(
                    "DELETE",
                    f"/apis/resource.k8s.io/v1/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}",
                )
        made = self.creator.run(objs)
        for obj in made:
            if isinstance(obj, dict) and obj.get("kind") == "ResourceClaim":
                meta = obj["metadata"]
                new.append(self.watched(meta["namespace"], meta["name"], meta["uid"]))
        self.claims = kept + new
        return len(gone), len(new)


def ledger_keys(http: Any) -> set[str]:
    """Every `namespace/name` the ledgers in the API server hold."""
    from webhook.server import ledger

    listed = http.get_json(f"/api/v1/namespaces/{LEDGERS}/configmaps")
    return {
        key
        for cm in listed.get("items") or []
        for key in ledger.decode((cm.get("data") or {}).get(ledger.DATA_KEY))
    }


def timed_pass(led: Any, http: CountingHttp) -> dict[str, Any]:
    http.listed_bytes = 0
    w0, c0 = time.perf_counter(), time.thread_time()
    written = led.reconcile()
    wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
    return {"wall_ms": wall * 1000, "cpu_ms": cpu * 1000, "written": written, "calls": http.take(),
            "listed_kib": http.listed_bytes / 1024}  # fmt: skip


def measure(fleet: Fleet, step: Step, args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    from webhook.server.ledger import QuotaLedger

    http = CountingHttp(fleet.http)

    def new_ledger() -> Any:
        return QuotaLedger(http, LEDGERS, ttl=TTL, claims=lambda: fleet.claims, snapshot=fleet.snapshot,
                           clock=clock)  # fmt: skip

    row: dict[str, Any] = {"nodes": step.nodes, "claims": len(fleet.claims), "ledgers": step.groups}
    led = new_ledger()
    cold = timed_pass(led, http)
    if cold["written"]:
        raise Failure(
            f"{step.nodes} nodes: the first pass rewrote {cold['written']} ledgers that agreed with "
            "the claims"
        )
    row["cold"] = cold
    steady = [timed_pass(led, http) for _ in range(args.passes)]
    if any(p["written"] for p in steady):
        raise Failure(f"{step.nodes} nodes: a pass with nothing changed rewrote a ledger")
    row["steady"] = steady
    row["steady_wall_ms"] = statistics.median(p["wall_ms"] for p in steady)
    row["steady_cpu_ms"] = statistics.median(p["cpu_ms"] for p in steady)
    row["cold_wall_ms"], row["cold_cpu_ms"] = cold["wall_ms"], cold["cpu_ms"]
    row["listed_kib"] = steady[0]["listed_kib"]
    # Memory in a restarted replica's first pass of its own, after the timed ones (tracemalloc slows
    # what it watches; by now imports and first-use set-up are done and not counted).
    led = new_ledger()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    led.reconcile()
    cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    row["peak_mib"], row["kept_mib"] = (peak - base) / 2**20, (cur - base) / 2**20
    http.take()

    say(f"{step.nodes} nodes: cold {cold['wall_ms']:.0f} ms, steady p50 {row['steady_wall_ms']:.0f} ms "
        f"({row['steady_cpu_ms']:.0f} ms CPU)")  # fmt: skip

    if args.churn > 0:
        gone, added = fleet.churn(args.churn / 100)
        clock.now += TTL + 1
        passes = []
        # A pass GETs at most CHECKS_PER_PASS claims per ledger; the churn is spread, so one pass
        # usually suffices, but count them until the ledgers agree with the claims.
        for _ in range(20):
            p = timed_pass(led, http)
            passes.append(p)
            if not p["written"]:
                break
        else:
            raise Failure(f"{step.nodes} nodes: the churn was still being reconciled after 20 passes")
        want = {f"{c['metadata']['namespace']}/{c['metadata']['name']}" for c in fleet.claims}
        if (got := ledger_keys(fleet.http)) != want:
            raise Failure(
                f"{step.nodes} nodes: after the churn the ledgers hold {len(got - want)} entries of no claim "
                f"and lack {len(want - got)} claims"
            )
        first = passes[0]
        row["churn"] = {"deleted": gone, "created": added, "passes": passes}
        row["churn_wall_ms"], row["churn_cpu_ms"] = first["wall_ms"], first["cpu_ms"]
        row["churn_gets"] = first["calls"].get("get claim", 0)
        row["churn_rewrites"] = first["calls"].get("rewrite ledger", 0)
        row["churn_passes"] = len(passes) - 1
        row["after_churn_wall_ms"] = passes[-1]["wall_ms"]
        say(
            f"{step.nodes} nodes: churn of {gone}+{added} claims: {first['wall_ms']:.0f} ms, "
            f"{row['churn_gets']} GETs, {row['churn_rewrites']} rewrites, {row['churn_passes']} pass(es)"
        )
    return row


class Failure(Exception):
    pass


METRICS: dict[str, tuple[str, str]] = {
    "cold_wall_ms": ("first pass (restart), wall", "ms"),
    "cold_cpu_ms": ("first pass, CPU", "ms"),
    "steady_wall_ms": ("steady pass p50, wall", "ms"),
    "steady_cpu_ms": ("steady pass p50, CPU", "ms"),
    "churn_wall_ms": ("churn pass, wall", "ms"),
    "churn_cpu_ms": ("churn pass, CPU", "ms"),
    "churn_gets": ("churn pass, claim GETs", ""),
    "churn_rewrites": ("churn pass, ledger rewrites", ""),
    "listed_kib": ("ledger JSON listed per pass", "KiB"),
    "peak_mib": ("first pass, peak Python memory", "MiB"),
    "kept_mib": ("kept between passes", "MiB"),
}


def growth(rows: list[dict[str, Any]], m: str) -> list[float | None]:
    out: list[float | None] = [None]
    for a, b in itertools.pairwise(rows):
        if a.get(m) and b.get(m) is not None:
            out.append((b[m] / a[m]) / (b["claims"] / a["claims"]))
        else:
            out.append(None)
    return out


def extrapolate(rows: list[dict[str, Any]], m: str, nodes: int) -> float | None:
    """In proportion to the largest step: what linear growth gives (the line through the last two
    steps goes below zero when a noisy machine made the larger step the faster one)."""
    last = rows[-1]
    return None if last.get(m) is None else float(last[m] * nodes / last["nodes"])


def report(rows: list[dict[str, Any]]) -> list[str]:
    def fmt(v: Any) -> str:
        if v is None:
            return "–"
        return f"{v:,.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:.1f}"

    head = ["", *[f"{r['nodes']:,} nodes" for r in rows]]
    head += [f"growth {a['nodes']:,}→{b['nodes']:,}" for a, b in itertools.pairwise(rows)]
    head.append(f"{EXTRAPOLATE_TO:,} nodes (linear, on paper)")
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    lines.append("| claims / ledgers | " + " | ".join(f"{r['claims']:,} / {r['ledgers']:,}" for r in rows)
                 + " |" * (len(rows)) + f" {EXTRAPOLATE_TO * CLAIMS_PER_NODE:,} / "
                 f"{EXTRAPOLATE_TO // NODES_PER_NAMESPACE:,} |")  # fmt: skip
    for m, (label, unit) in METRICS.items():
        if not any(r.get(m) is not None for r in rows):
            continue
        g = growth(rows, m)[1:]
        cells = [fmt(r.get(m)) for r in rows] + [("–" if x is None else f"{x:.2f}") for x in g]
        cells.append(fmt(extrapolate(rows, m, EXTRAPOLATE_TO)))
        lines.append(f"| {label}{f' ({unit})' if unit else ''} | " + " | ".join(cells) + " |")
    last = rows[-1]
    lines.append("")
    lines.append(
        f"At {last['nodes']:,} nodes a steady pass takes {last['steady_cpu_ms']:.0f} ms of CPU: at one "
        f"pass a second, {last['steady_cpu_ms'] / 10:.1f} % of one core of the webhook's process."
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--steps", default="200,1000,2000", help="node counts, increasing (default 200,1000,2000)"
    )
    ap.add_argument("--passes", type=int, default=7, help="steady passes per step (default 7)")
    ap.add_argument(
        "--churn",
        type=float,
        default=1.0,
        help="percent of the claims deleted and as many created before the churn pass (default 1)",
    )
    ap.add_argument("--parallel", type=int, default=16, help="connections used to create claims (default 16)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (steps 4,8; 3 passes): a smoke run")
    ap.add_argument("--state-dir", type=Path, default=None)
    ap.add_argument("--json", metavar="OUT", type=Path)
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.passes = "4,8", 3
    steps = [Step(n) for n in parse_steps(args.steps)]
    if args.passes < 1 or not 0 <= args.churn <= 50 or args.parallel < 1:
        raise SystemExit("--passes and --parallel must be positive, --churn between 0 and 50")

    from webhook.server.caches import KubeHttp

    rows: list[dict[str, Any]] = []
    try:
        with api_only_cluster("ledger_reconcile", args.state_dir) as cluster:
            creator = Creator(cluster.server, cluster.paths.certs, args.parallel)
            namespaces = {LEDGERS} | {namespace_of(n) for n in range(0, steps[-1].nodes, NODES_PER_NAMESPACE)}
            ns_obj = {"apiVersion": "v1", "kind": "Namespace"}
            creator.run(
                [("/api/v1/namespaces", {**ns_obj, "metadata": {"name": ns}}) for ns in sorted(namespaces)]
            )
            http = KubeHttp.from_kubeconfig(str(cluster.kubeconfig))
            fleet = Fleet(creator, http)
            clock = Clock()
            for step in steps:
                t0 = time.monotonic()
                fleet.grow(step, clock)
                say(f"{step.nodes} nodes: {len(fleet.claims):,} claims in {step.groups} ledgers "
                    f"({time.monotonic() - t0:.0f} s to write)")  # fmt: skip
                rows.append(measure(fleet, step, args, clock))
    except Failure as exc:
        print(f"bench/ledger_reconcile.py: {exc}", file=sys.stderr)
        return 2
    print(f"quota ledger reconcile: {CLAIMS_PER_NODE} claims per node, one ledger per {NODES_PER_NAMESPACE} "
          f"nodes, churn {args.churn:g} % deleted + {args.churn:g} % created")  # fmt: skip
    print("\n".join(report(rows)))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "churn_percent": args.churn}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
