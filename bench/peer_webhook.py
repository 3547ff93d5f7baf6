"""Kyverno's and Gatekeeper's admission webhooks beside draguard's, on one local control plane.

    python bench/peer.py --webhook [--objects 1500] [--arms none,null,draguard,kyverno,gatekeeper]
                                   [--kyverno PATH] [--kyverno-policy cluster|validating] [--gatekeeper PATH]
                                   [--quick] [--keep] [--json OUT]

One kube-apiserver + etcd (`webhook/dev`, as bench/apiserver.py starts it) with one namespace per
arm, the namespaces differing only in one label, `bench.draguard.io/arm`:
- `bench-none`: no webhook is called (the baseline, measured in the same run);
- `bench-null`: draguard's webhook configurations aimed at a null webhook (aiohttp over TLS, parses
  each review and allows it): what calling any webhook costs the API server here;
- `bench-draguard`: draguard's webhooks (kustomize/overlays/local, the shipped policies), their
  namespaceSelector narrowed to this label;
- `bench-kyverno`: Kyverno's admission controller, run out of cluster (`-kubeconfig`, `-serverIP`),
  its CRDs from its Go module's config/crds, its own self-signed TLS, and its webhooks narrowed to
  this label through its `webhooks` ConfigMap setting. Its ClusterPolicy says "LLM workloads (vLLM
  images) must use the LLM tier's classes": for each claim template a pod uses, it reads the template
  from the API server (an `apiCall` context) and denies when the template's deviceClassName is not
  one of those classes. Kyverno generates the same rule for Deployments. `--kyverno-policy validating`
  gives Kyverno the same policy as a CEL ValidatingPolicy (policies.kyverno.io/v1: the templates read
  with `resource.Get`, a matchCondition on the vLLM image, autogen for Deployments).
- `bench-gatekeeper`: Gatekeeper's webhook, run out of cluster, with a ConstraintTemplate (Rego) for the
  same rule: "LLM" from labels and image words read from policies/tier.yaml, the claim templates and
  claims from the data its `Config` replicates (bench/peer_gatekeeper.py says what it cannot judge).

The same object stream goes to each namespace, one create per arm in turn (the order rotates), so
background work (etcd compaction, Kyverno's admission reports, draguard's cache rebuilds) lands on
every arm alike. Per arm: create latency p50/p99; per webhook arm: added latency against `none`
with 90 % bootstrap intervals, server CPU per review (utime+stime from /proc/<pid>/stat over the
stream, divided by the reviews the server's own metrics counted; the null webhook answers one per
create), the handler's own mean time and RSS. The controller-manager is stopped before the stream,
so no claims or ReplicaSets follow the creates. A benchmark, not a test: nothing is asserted on
times; it exits 1 if an arm denied other objects than the policy forbids. Exit 3 when Kyverno's
admission controller is not built (it is not part of CI: `scripts/build-peer.sh`, about 35
minutes), or Gatekeeper's (`scripts/build-gatekeeper.sh`); `--arms` leaves either out.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import peer_gatekeeper as gk  # noqa: E402
from bench.apiserver import BARE_SERVER, BARE_WARNING, Api, added_interval, pct  # noqa: E402

ARMS = ("none", "null", "draguard", "kyverno", "gatekeeper")
# Latency rows: every object, by kind, and the vLLM objects alone (those the policy is about).
KINDS = ("all", "Pod", "Deployment", "vLLM")
JUDGES = ("draguard", "kyverno", "gatekeeper")  # the arms whose webhook applies the policy
PEERS = ("kyverno", "gatekeeper")
ARM_LABEL = "bench.draguard.io/arm"
KYVERNO_NS = "kyverno"


def _llm_classes() -> list[str]:
    """The device classes the shipped tier policy allows LLM workloads, so each peer enforces the
    same rule draguard does (a class added to the policy must not turn into a peer's denial)."""
    docs = yaml.safe_load_all((ROOT / "policies" / "tier.yaml").read_text())
    tier = next(d for d in docs if d)
    return list(next(c for c in tier["spec"]["classes"] if c["name"] == "llm")["deviceClasses"])


LLM_CLASSES = _llm_classes()
LLM_IMAGE = "vllm/vllm-openai:v0.6.3"
BATCH_IMAGE = "registry.example.com/batch/worker:1"
TEMPLATES = {"one-h100": "gpu.nvidia.com-h100", "one-a100": "gpu.nvidia.com-a100"}

KYVERNO_POLICY: dict[str, Any] = {
    "apiVersion": "kyverno.io/v1",
    "kind": "ClusterPolicy",
    "metadata": {"name": "llm-must-use-h100"},
    "spec": {
        "background": False,
        "rules": [
            {
                "name": "llm-claim-templates-h100",
                "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                "preconditions": {
                    "any": [
                        {
                            "key": "{{ request.object.spec.containers[].image }}",
                            "operator": "AnyIn",
                            "value": ["*vllm*"],
                        }
                    ]
                },
                "validate": {
                    "failureAction": "Enforce",
                    "message": "LLM workloads (vLLM images) must use the LLM tier's device classes",
                    "foreach": [
                        {
                            "list": "request.object.spec.resourceClaims[?resourceClaimTemplateName] || `[]`",
                            "context": [
                                {
                                    "name": "classes",
                                    "apiCall": {
                                        "urlPath": "/apis/resource.k8s.io/v1/namespaces/"
                                        "{{ request.namespace }}/resourceclaimtemplates/"
                                        "{{ element.resourceClaimTemplateName }}",
                                        "jmesPath": "spec.spec.devices.requests[].exactly.deviceClassName",
                                    },
                                }
                            ],
                            "deny": {
                                "conditions": {
                                    "any": [
                                        {
                                            "key": "{{ classes }}",
                                            "operator": "AnyNotIn",
                                            "value": LLM_CLASSES,
                                        }
                                    ]
                                }
                            },
                        }
                    ],
                },
            }
        ],
    },
}


def _llm_class(var: str) -> str:
    """CEL: `var` is one of LLM_CLASSES (a trailing `*` is a prefix)."""
    terms = [f"{var}.startsWith('{c[:-1]}')" if c.endswith("*") else f"{var} == '{c}'" for c in LLM_CLASSES]
    return " || ".join(terms)


# The same policy as a CEL ValidatingPolicy (policies.kyverno.io/v1, Kyverno's newer engine): the pod's
# claim templates read with Kyverno's `resource.Get`, and autogen for Deployments.
KYVERNO_VALIDATING_POLICY: dict[str, Any] = {
    "apiVersion": "policies.kyverno.io/v1",
    "kind": "ValidatingPolicy",
    "metadata": {"name": "llm-must-use-h100"},
    "spec": {
        "validationActions": ["Deny"],
        "autogen": {"podControllers": {"controllers": ["deployments"]}},
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["pods"],
                }
            ]
        },
        "matchConditions": [
            {"name": "llm", "expression": "object.spec.containers.exists(c, c.image.contains('vllm'))"}
        ],
        "variables": [
            {
                "name": "templates",
                "expression": "(has(object.spec.resourceClaims) ? object.spec.resourceClaims : [])"
                ".filter(c, has(c.resourceClaimTemplateName)).map(c, c.resourceClaimTemplateName)",
            },
            {
                "name": "classes",
                "expression": "variables.templates.map(t, resource.Get('resource.k8s.io/v1', "
                "'resourceclaimtemplates', object.metadata.namespace, t))"
                ".map(r, r.spec.spec.devices.requests.map(q, q.exactly.deviceClassName))",
            },
        ],
        "validations": [
            {
                "expression": f"variables.classes.all(l, l.all(c, {_llm_class('c')}))",
                "message": "LLM workloads (vLLM images) must use the LLM tier's device classes",
            }
        ],
    },
}


def kyverno_controller(explicit: str | None) -> Path | None:
    """--kyverno, $DRAGUARD_KYVERNO_CONTROLLER, then where scripts/build-peer.sh caches it."""
    return gk.built_binary(explicit, "DRAGUARD_KYVERNO_CONTROLLER", "build-peer.sh", "controller")


def kyverno_crds(binary: Path) -> Path | None:
    """config/crds of the module source the binary was built from (scripts/build-peer.sh keeps it)."""
    src = binary.parent.parent / "src" / "config" / "crds"
    if (src / "kyverno").is_dir():
        return src
    version = binary.parent.parent.name.removeprefix("kyverno-")
    try:
        modcache = subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    mod = Path(modcache) / "github.com" / "kyverno" / f"kyverno@{version}" / "config" / "crds"
    return mod if (mod / "kyverno").is_dir() else None


def is_llm(i: int) -> bool:
    """Whether object i of the stream runs a vLLM image (the objects the policy is about)."""
    return i % 2 == 0


def workload(i: int, ns: str) -> tuple[str, dict[str, Any], bool]:
    """Object i of the stream (the same in every namespace): path, body, and whether the policy
    forbids it. Half run a vLLM image; one LLM object in ten asks for an A100 template."""
    llm = is_llm(i)
    bad = i % 20 in (0, 12)
    tmpl = ("one-a100" if bad else "one-h100") if llm else "one-a100"
    spec = {
        "containers": [
            {
                "name": "main",
                "image": LLM_IMAGE if llm else BATCH_IMAGE,
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": tmpl}],
    }
    if i % 5 == 2:
        name = f"d-{i}"
        return (
            f"/apis/apps/v1/namespaces/{ns}/deployments",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
                },
            },
            bad,
        )
    return (
        f"/api/v1/namespaces/{ns}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{i}", "namespace": ns}, "spec": spec},
        bad,
    )


def claim_template(ns: str, name: str, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}}},
    }


def proc_cpu_s(pid: int) -> float:
    """utime + stime of one process, from /proc/<pid>/stat (fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB."""
    vals = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            k, v = line.split(":", 1)
            vals[k] = int(v.split()[0]) / 1024
    return vals.get("VmRSS", 0.0), vals.get("VmHWM", 0.0)


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class Server:
    """One webhook server process and how to count the reviews it answered."""

    arm: str
    pid: int
    metrics_url: str | None  # None: one review per create in its namespace
    metric: str
    handler: str  # the server's own request-duration histogram
    ctx: ssl.SSLContext | None = None

    def counters(self) -> tuple[float, float, float]:
        """(reviews, handler seconds, handler observations) from the server's /metrics."""
        if self.metrics_url is None:
            return 0.0, 0.0, 0.0
        with urllib.request.urlopen(self.metrics_url, context=self.ctx, timeout=5) as r:
            text = r.read().decode()
        return (
            metric_sum(text, self.metric),
            metric_sum(text, f"{self.handler}_sum"),
            metric_sum(text, f"{self.handler}_count"),
        )


def set_arm_selector(hooks: list[dict[str, Any]], arm: str) -> None:
    for obj in hooks:
        for h in obj.get("webhooks") or []:
            sel = h.setdefault("namespaceSelector", {})
            exprs = [e for e in sel.get("matchExpressions") or [] if e.get("key") != ARM_LABEL]
            sel["matchExpressions"] = [*exprs, {"key": ARM_LABEL, "operator": "In", "values": [arm]}]


def create(api: Api, path: str, body: dict[str, Any]) -> tuple[int, str, str]:
    """POST one object: (status, message, warnings), a webhook's denial always as 403 (Kyverno
    answers 400)."""
    status, resp, headers = api.call("POST", path, body)
    msg = str((resp or {}).get("message", "")) if isinstance(resp, dict) else ""
    if status in (400, 403) and "denied the request" in msg:
        status = 403
    return status, msg, headers.get("warning", "")


def probe(api: Api, ns: str, template: str) -> tuple[int, str, str]:
    """A dry-run create of a vLLM pod on `template`: (status, message, warnings)."""
    path, body, _ = workload(0, ns)
    body["metadata"]["name"] = f"probe-{template}"
    body["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template
    return create(api, f"{path}?dryRun=All", body)


def crds_established(cluster: Any) -> bool:
    items = cluster.kube().get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
    return all(
        any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (i.get("status") or {}).get("conditions") or []
        )
        for i in items
    )


def start_kyverno(cluster: Any, binary: Path, crds: Path, port: int, metrics_port: int) -> int:
    cluster.progress(f"applying Kyverno's CRDs from {crds}")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-R", "-f", str(crds))
    deadline = time.monotonic() + 120
    while not crds_established(cluster):
        if time.monotonic() > deadline:
            raise SystemExit("bench/peer.py --webhook: Kyverno's CRDs not Established within 120 s")
        time.sleep(0.5)
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KYVERNO_NS}}
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kyverno", "namespace": KYVERNO_NS},
        # Kyverno copies this selector into every resource webhook it registers.
        "data": {
            "webhooks": json.dumps(
                {
                    "namespaceSelector": {
                        "matchExpressions": [{"key": ARM_LABEL, "operator": "In", "values": ["kyverno"]}]
                    }
                }
            )
        },
    }
    cluster.kubectl(
        "apply",
        "--server-side",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [ns, cm]}),
    )
    argv = [
        str(binary),
        f"--kubeconfig={cluster.kubeconfig}",
        f"--serverIP=127.0.0.1:{port}",
        "--webhookServerHost=127.0.0.1",
        f"--webhookServerPort={port}",
        "--caSecretName=kyverno-svc.kyverno.svc.kyverno-tls-ca",
        "--tlsSecretName=kyverno-svc.kyverno.svc.kyverno-tls-pair",
        "--metricsHost=127.0.0.1",
        f"--metricsPort={metrics_port}",
        "--controllerRuntimeMetricsAddress=0",
    ]
    env = {
        "KYVERNO_NAMESPACE": KYVERNO_NS,
        "KYVERNO_SERVICEACCOUNT_NAME": "kyverno-admission-controller",
        "KYVERNO_DEPLOYMENT": "kyverno-admission-controller",
        "KYVERNO_POD_NAME": "kyverno-bench",
        "INIT_CONFIG": "kyverno",
        "METRICS_CONFIG": "kyverno-metrics",
    }
    return int(cluster.spawn("kyverno", argv, env=env))


def fmt_ci(ci: tuple[float, float]) -> str:
    return f"[{ci[0] * 1000:+.2f}, {ci[1] * 1000:+.2f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/peer.py --webhook", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--objects", type=int, default=1500, help="objects per arm (1 in 5 a Deployment)")
    ap.add_argument("--warmup", type=int, default=60, help="objects per arm created first and not counted")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of " + ",".join(ARMS))
    ap.add_argument("--kyverno", default=None, help="Kyverno's admission controller binary")
    ap.add_argument(
        "--kyverno-policy",
        choices=["cluster", "validating"],
        default="cluster",
        help="Kyverno's policy as a ClusterPolicy (JMESPath, apiCall; default) or a CEL ValidatingPolicy",
    )
    ap.add_argument("--gatekeeper", default=None, help="Gatekeeper's manager binary")
    ap.add_argument("--quick", action="store_true", help="60 objects per arm, 10 warm-up: a smoke run")
    ap.add_argument("--state-dir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if "none" not in arms or any(a not in ARMS for a in arms) or len(arms) < 2:
        ap.error(f"--arms: 'none' and at least one of {', '.join(ARMS[1:])} (got {args.arms!r})")
    if args.quick:
        args.objects, args.warmup = 60, 10
    binary = crds = None
    if "kyverno" in arms:
        binary = kyverno_controller(args.kyverno)
        where = args.kyverno or "$DRAGUARD_KYVERNO_CONTROLLER or `scripts/build-peer.sh --path controller`"
        if binary is None:
            print(
                f"bench/peer.py --webhook: Kyverno's admission controller is not built (looked at {where}).\n"
                "  Build it with `scripts/build-peer.sh` (about 35 minutes; not part of CI), or leave it out "
                "with --arms none,null,draguard.",
                file=sys.stderr,
            )
            return 3
        crds = kyverno_crds(binary)
        if crds is None:
            print(
                f"bench/peer.py --webhook: no Kyverno CRDs next to {binary} (../src/config/crds) nor in the "
                "Go module cache; run `scripts/build-peer.sh`, which keeps the module source.",
                file=sys.stderr,
            )
            return 3

    gk_binary = gk_manifest = None
    if "gatekeeper" in arms:
        gk_binary = gk.gatekeeper_manager(args.gatekeeper)
        if gk_binary is None:
            where = args.gatekeeper or "$DRAGUARD_GATEKEEPER_MANAGER or `scripts/build-gatekeeper.sh --path`"
            print(
                f"bench/peer.py --webhook: Gatekeeper's manager is not built (looked at {where}).\n"
                "  Build it with `scripts/build-gatekeeper.sh` (not part of CI), or leave it out with "
                "--arms.",
                file=sys.stderr,
            )
            return 3
        gk_manifest = gk.gatekeeper_manifest(gk_binary)
        if gk_manifest is None:
            print(
                f"bench/peer.py --webhook: no deploy/gatekeeper.yaml next to {gk_binary} (../src); run "
                "`scripts/build-gatekeeper.sh`, which keeps the module source.",
                file=sys.stderr,
            )
            return 3

    from webhook.dev.addons import FIELD_MANAGER, webhook_objects
    from webhook.dev.cluster import ClusterError, LocalCluster, free_port

    def say(msg: str) -> None:
        print(f"  {msg}", file=sys.stderr, flush=True)

    state = args.state_dir or Path(tempfile.mkdtemp(prefix="draguard-bench-peer-"))
    cluster = LocalCluster(state, None, progress=say, tie_to_parent=True)
    res: dict[str, Any] = {
        "arms": arms,
        "objects_per_arm": args.objects,
        "started_utc": time.strftime("%H:%M:%S", time.gmtime()),
    }
    load0 = os.getloadavg()[0]
    try:
        t0 = time.monotonic()
        cluster.up(with_driver=True, with_webhook="draguard" in arms)
        say(f"control plane up in {time.monotonic() - t0:.1f} s")
        api = Api(cluster.server, cluster.paths.certs)
        for arm in arms:
            ns = f"bench-{arm}"
            body = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {ARM_LABEL: arm}},
            }
            api.call("POST", "/api/v1/namespaces", body)
            cluster.wait_default_sa(ns)
            for name, cls in TEMPLATES.items():
                st, b, _ = api.call(
                    "POST",
                    f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates",
                    claim_template(ns, name, cls),
                )
                if st not in (201, 409):
                    raise SystemExit(f"cannot create claim template {ns}/{name}: HTTP {st}: {b}")
        # The stream measures the admission of the objects themselves: without the controller-manager no
        # claims are made from the pods' templates (nor their reviews, nor quota usage building up).
        cluster.stop("kube-controller-manager")
        servers: dict[str, Server] = {}
        if "null" in arms:
            # draguard's configurations, aimed at a server that parses each review and allows it:
            # what calling any webhook costs the API server, on this machine, in this run.
            nport, c = free_port(), cluster.paths.certs
            null_argv = [
                sys.executable,
                "-c",
                BARE_SERVER,
                str(nport),
                str(c / "webhook.crt"),
                str(c / "webhook.key"),
            ]
            npid = cluster.spawn("null-webhook", null_argv)
            nobjs, _src = webhook_objects(cluster, nport)
            nhooks = [o for o in nobjs if o.get("kind", "").endswith("WebhookConfiguration")]
            for o in nhooks:
                o["metadata"]["name"] = "bench-null-webhook"
            set_arm_selector(nhooks, "null")
            ndoc = json.dumps({"apiVersion": "v1", "kind": "List", "items": nhooks})
            cluster.kubectl("apply", "--server-side", "-f", "-", input=ndoc)
            servers["null"] = Server("null", npid, None, "", "")
            cluster.wait("null-webhook", lambda: BARE_WARNING in probe(api, "bench-null", "one-a100")[2], 60)
        if "draguard" in arms:
            port = int(cluster.state["ports"]["webhook"])
            objs, _src = webhook_objects(cluster, port)
            hooks = [o for o in objs if o.get("kind", "").endswith("WebhookConfiguration")]
            set_arm_selector(hooks, "draguard")
            doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": hooks})
            ssa = ("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}")
            cluster.kubectl(*ssa, "-f", "-", input=doc)
            ctx = ssl.create_default_context(cafile=str(cluster.paths.certs / "webhook-ca.crt"))
            servers["draguard"] = Server(
                "draguard", int(cluster.state["pids"]["webhook"]), f"https://127.0.0.1:{port}/metrics",
                "draguard_admission_requests_total", "draguard_admission_duration_seconds", ctx,
            )  # fmt: skip
        if "kyverno" in arms:
            assert binary is not None and crds is not None
            kport, mport = free_port(), free_port()
            t1 = time.monotonic()
            kpid = start_kyverno(cluster, binary, crds, kport, mport)
            servers["kyverno"] = Server(
                "kyverno", kpid, f"http://127.0.0.1:{mport}/metrics", "kyverno_admission_requests_total",
                "kyverno_admission_review_duration_seconds",
            )  # fmt: skip
            took = cluster.wait(
                "kyverno",
                lambda: (
                    "kyverno-resource-validating-webhook-cfg"
                    in cluster.kubectl("get", "validatingwebhookconfigurations", "-o", "name", check=False)
                ),
                180,
            )
            say(f"kyverno registered its webhooks ({took:.1f} s)")
            # Its policy webhook may be registered before its server has loaded the certificate.
            kpolicy = KYVERNO_VALIDATING_POLICY if args.kyverno_policy == "validating" else KYVERNO_POLICY
            res["kyverno_policy"] = kpolicy["kind"]
            policy_doc = json.dumps(kpolicy)
            cluster.wait(
                "kyverno",
                lambda: (
                    cluster.kubectl_run("apply", "--server-side", "-f", "-", input=policy_doc).returncode == 0
                ),
                120,
            )
            cluster.wait("kyverno", lambda: probe(api, "bench-kyverno", "one-a100")[0] == 403, 180)
            say(f"kyverno {binary.parent.parent.name} ready in {time.monotonic() - t1:.1f} s (pid {kpid})")
        if "gatekeeper" in arms:
            assert gk_binary is not None and gk_manifest is not None
            gport, gmport, ghport = free_port(), free_port(), free_port()
            t1 = time.monotonic()
            gpid = gk.start_gatekeeper(cluster, gk_binary, gk_manifest, gport, gmport, ghport, ARM_LABEL)
            gk_metrics = f"http://127.0.0.1:{gmport}/metrics"
            servers["gatekeeper"] = Server(
                "gatekeeper", gpid, gk_metrics, gk.METRIC_REVIEWS, gk.METRIC_HANDLER
            )
            took = gk.apply_policy(cluster)
            say(f"gatekeeper generated its constraint CRD; constraint applied ({took:.1f} s)")
            # Ready once the constraint is loaded and the claim templates are in its synced data.
            cluster.wait("gatekeeper", lambda: probe(api, "bench-gatekeeper", "one-a100")[0] == 403, 180)
            res["gatekeeper_version"] = version = gk_binary.parent.parent.name
            say(f"gatekeeper {version} ready in {time.monotonic() - t1:.1f} s (pid {gpid})")
        # Each arm's own webhook, and only it, judges its namespace.
        probes: dict[str, dict[str, Any]] = {}
        for arm in arms:
            ok_status, _, _ = probe(api, f"bench-{arm}", "one-h100")
            bad_status, msg, warn = probe(api, f"bench-{arm}", "one-a100")
            probes[arm] = {"h100": ok_status, "a100": bad_status, "message": msg[:200]}
            want_bad = 201 if arm in ("none", "null") else 403
            if (BARE_WARNING in warn) != (arm == "null"):
                raise SystemExit(
                    f"arm {arm}: the null webhook {'did not answer' if arm == 'null' else 'answered'}"
                )
            if ok_status != 201 or bad_status != want_bad:
                raise SystemExit(f"arm {arm}: probe got H100 {ok_status}, A100 {bad_status} ({msg[:300]})")
        res["probes"] = probes
        say("probes: " + "; ".join(f"{a}: A100 -> {p['a100']}" for a, p in probes.items()))

        def run(first: int, count: int, record: bool) -> dict[str, list[tuple[int, str, float, int]]]:
            out: dict[str, list[tuple[int, str, float, int]]] = {a: [] for a in arms}
            step = max(1, count // 10)
            for k, i in enumerate(range(first, first + count)):
                order = arms[k % len(arms) :] + arms[: k % len(arms)]
                for arm in order:
                    path, body, _bad = workload(i, f"bench-{arm}")
                    t = time.perf_counter()
                    status, _msg, _warn = create(api, path, body)
                    out[arm].append((i, body["kind"], time.perf_counter() - t, status))
                if record and (k + 1) % step == 0:
                    p50s = (f"{a} p50 {statistics.median(x[2] for x in out[a]) * 1000:.1f} ms" for a in arms)
                    say(f"{k + 1}/{count} objects per arm; " + ", ".join(p50s))
            return out

        run(10**6, args.warmup, False)
        # Idle cost over a quiet spell, so per-review CPU can be read with and without it.
        idle: dict[str, float] = {}
        c0 = {a: proc_cpu_s(s.pid) for a, s in servers.items()}
        time.sleep(5.0)
        for a, s in servers.items():
            idle[a] = (proc_cpu_s(s.pid) - c0[a]) / 5.0
        before = {a: (proc_cpu_s(s.pid), *s.counters()) for a, s in servers.items()}
        t_stream = time.monotonic()
        data = run(0, args.objects, True)
        wall = time.monotonic() - t_stream
        after = {a: (proc_cpu_s(s.pid), *s.counters()) for a, s in servers.items()}
        rss = {a: proc_rss_mib(s.pid) for a, s in servers.items()}
    except ClusterError as exc:
        print(f"bench/peer.py --webhook: the local control plane is not available: {exc}", file=sys.stderr)
        return 3
    finally:
        if not args.keep:
            try:
                cluster.down(keep_logs=False)
            except ClusterError as exc:
                print(f"warning: {exc}", file=sys.stderr)

    expected_bad = {i for i in range(args.objects) if workload(i, "x")[2]}
    compared = {i for i in range(args.objects) if all(data[a][i][3] == 201 for a in arms)}
    res["denied"] = {a: sorted(x[0] for x in data[a] if x[3] == 403) for a in arms}
    res["other_errors"] = {a: sum(1 for x in data[a] if x[3] not in (201, 403)) for a in arms}
    res["stream_wall_s"] = round(wall, 1)
    res["load_avg"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    res["rows"] = {a: summarise(a, data, compared, servers, before, after, idle, rss, wall) for a in arms}
    report(res, arms, args.objects, len(compared), expected_bad)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    bad = any(res["other_errors"].values()) or any(
        set(res["denied"][a]) != (expected_bad if a in JUDGES else set()) for a in arms
    )
    return 1 if bad else 0


Sample = tuple[int, str, float, int]  # object index, kind, seconds, HTTP status


def summarise(
    arm: str,
    data: dict[str, list[Sample]],
    compared: set[int],
    servers: dict[str, Server],
    before: dict[str, tuple[float, float, float, float]],
    after: dict[str, tuple[float, float, float, float]],
    idle: dict[str, float],
    rss: dict[str, tuple[float, float]],
    wall: float,
) -> dict[str, Any]:
    """Latency by kind over the objects every arm admitted; added latency against `none`; server figures."""

    def lat(a: str, kind: str) -> list[float]:
        if kind == "vLLM":  # what a webhook that filters by image in matchConditions is called for
            return [x[2] for x in data[a] if x[0] in compared and is_llm(x[0])]
        return [x[2] for x in data[a] if x[0] in compared and kind in ("all", x[1])]

    r: dict[str, Any] = {}
    for kind in KINDS:
        mine, base = lat(arm, kind), lat("none", kind)
        if not mine:
            continue
        row: dict[str, Any] = {
            "n": len(mine),
            "p50_ms": round(statistics.median(mine) * 1000, 2),
            "p99_ms": round(pct(mine, 99) * 1000, 2),
        }
        if arm != "none":
            row["added_p50_ms"] = round((statistics.median(mine) - statistics.median(base)) * 1000, 2)
            row["added_p99_ms"] = round((pct(mine, 99) - pct(base, 99)) * 1000, 2)
            for q in (50, 99):
                lo, hi = added_interval(base, mine, q)
                row[f"added_p{q}_ci90_ms"] = [round(lo * 1000, 2), round(hi * 1000, 2)]
        r[kind] = row
    if arm in servers:
        cpu = after[arm][0] - before[arm][0]
        n = after[arm][1] - before[arm][1] if servers[arm].metrics_url else len(data[arm])
        h_s, h_n = after[arm][2] - before[arm][2], after[arm][3] - before[arm][3]
        r["server"] = {
            "reviews": int(n),
            "cpu_s": round(cpu, 3),
            "cpu_ms_per_review": round(cpu / n * 1000, 3) if n else None,
            "idle_cpu_ms_per_s": round(idle[arm] * 1000, 2),
            "cpu_ms_per_review_less_idle": round((cpu - idle[arm] * wall) / n * 1000, 3) if n else None,
            "handler_mean_ms": round(h_s / h_n * 1000, 3) if h_n else None,
            "rss_mib": round(rss[arm][0], 1),
            "peak_rss_mib": round(rss[arm][1], 1),
        }
    return r


def report(res: dict[str, Any], arms: list[str], objects: int, compared: int, expected_bad: set[int]) -> None:
    rows = res["rows"]
    print(
        f"Creates through one kube-apiserver, one client, sequential, the arms in turn: {objects} objects "
        f"per arm, {compared} admitted in every arm compared; {res['stream_wall_s']} s; "
        f"load average {res['load_avg'][0]} -> {res['load_avg'][1]}"
    )
    print(f"{'arm':<10} {'kind':<11} {'n':>5} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'+p50 ms':>8} {'90% interval':>16} {'+p99 ms':>8} {'90% interval':>16}")  # fmt: skip
    for arm in arms:
        for kind in KINDS:
            k = rows[arm].get(kind)
            if not k:
                continue
            line = f"{arm:<10} {kind:<11} {k['n']:>5} {k['p50_ms']:>7.2f} {k['p99_ms']:>7.2f}"
            if arm != "none":
                for q in (50, 99):
                    lo, hi = k[f"added_p{q}_ci90_ms"]
                    line += f" {k[f'added_p{q}_ms']:>8.2f} {f'[{lo:+.2f}, {hi:+.2f}]':>16}"
            print(line)
    print(f"{'server':<10} {'reviews':>8} {'CPU s':>7} {'CPU/review':>11} {'less idle':>10} "
          f"{'idle CPU':>11} {'RSS':>9} {'peak RSS':>9} {'handler mean':>13}")  # fmt: skip
    for arm in arms:
        s = rows[arm].get("server")
        if s:
            print(f"{arm:<10} {s['reviews']:>8} {s['cpu_s']:>7.2f} {s['cpu_ms_per_review'] or 0:>8.3f} ms "
                  f"{s['cpu_ms_per_review_less_idle'] or 0:>7.3f} ms {s['idle_cpu_ms_per_s']:>6.1f} ms/s "
                  f"{s['rss_mib']:>5.0f} MiB {s['peak_rss_mib']:>5.0f} MiB "
                  f"{s['handler_mean_ms'] or 0:>10.3f} ms")  # fmt: skip
    for arm in arms:
        got = set(res["denied"][arm])
        want = expected_bad if arm in JUDGES else set()
        verdict = "agrees" if got == want else f"DIFFERS at {sorted(got ^ want)[:10]}"
        print(f"{arm}: denied {len(got)} of {objects} (the policy forbids {len(want)}); {verdict}; "
              f"other errors {res['other_errors'][arm]}")  # fmt: skip
    d = rows.get("draguard")
    for peer in PEERS:
        k = rows.get(peer)
        if not (d and k and "server" in d and "server" in k):
            continue
        pairs = {
            "added p50": (k["all"]["added_p50_ms"], d["all"]["added_p50_ms"]),
            "added p99": (k["all"]["added_p99_ms"], d["all"]["added_p99_ms"]),
            # The objects the policies are about: a Kyverno ValidatingPolicy's matchCondition on the
            # image keeps the API server from calling it for the others.
            "vLLM added p50": (k["vLLM"]["added_p50_ms"], d["vLLM"]["added_p50_ms"]),
            "vLLM added p99": (k["vLLM"]["added_p99_ms"], d["vLLM"]["added_p99_ms"]),
            "CPU per review": (k["server"]["cpu_ms_per_review"], d["server"]["cpu_ms_per_review"]),
            "RSS": (k["server"]["rss_mib"], d["server"]["rss_mib"]),
        }
        ratios = {n: round(a / b, 2) if a is not None and b else None for n, (a, b) in pairs.items()}
        res[f"ratios_{peer}_over_draguard"] = ratios
        parts = (f"{n} {v:.2f}x" if v is not None and v > 0 else f"{n} n/a" for n, v in ratios.items())
        print(f"{peer.capitalize()} / draguard: " + ", ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
