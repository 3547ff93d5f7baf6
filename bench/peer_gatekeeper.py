"""Gatekeeper's admission webhook as an arm of `bench/peer.py --webhook` (bench/peer_webhook.py).

Gatekeeper's manager runs out of cluster (`--debug-use-fake-pod`, its switch for running outside
Kubernetes) with `--operation=webhook --operation=generate`: the
webhook, and the controller that turns a ConstraintTemplate into its constraint CRD (in a cluster
that is the audit pod's job; audit itself is left out, as Kyverno's background controllers are).
Its CRDs and webhook configuration come from `deploy/gatekeeper.yaml` of the Go module the binary
was built from (`scripts/build-gatekeeper.sh` keeps the source), the configuration narrowed to the
bench's arm label and pointed at 127.0.0.1 by URL. It serves with its own CA and certificate,
written here into its `--cert-dir` (its own rotation names the in-cluster Service, which an
out-of-cluster server at 127.0.0.1 cannot use).

The rule is the one draguard's tier policy enforces, "LLM workloads only on the LLM tier's
classes", resolved by Gatekeeper's own means:
- "LLM" from the pod template's labels (exact and whole-word label values) and container images
  (whole words, image globs ending in `*`), the lists read from policies/tier.yaml;
- the pod's claims and claim templates read from Gatekeeper's replicated data
  (`data.inventory`), which its `Config` syncs for ResourceClaims and ResourceClaimTemplates;
- a claim template or claim that is not (yet) in that data is denied for an LLM workload: its
  classes cannot be checked, and Gatekeeper cannot ask the API server during a review (`http.send`
  is disabled, as in Gatekeeper's own manifests).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
GATEKEEPER_NS = "gatekeeper-system"  # where its Config must live (POD_NAMESPACE)
CONSTRAINT_KIND = "DraguardLlmTier"
CONSTRAINT_NAME = "llm-must-use-h100"
# Where a workload kind keeps its pod template; Pods are the spec itself.
WORKLOAD_KINDS = {
    "": ["Pod"],
    "apps": ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"],
    "batch": ["Job", "CronJob"],
}
WEBHOOK_RESOURCES = {
    "": ["pods"],
    "apps": ["deployments", "statefulsets", "daemonsets", "replicasets"],
    "batch": ["jobs", "cronjobs"],
}
# The reviews the webhook answered, and its own handling-time histogram (OpenTelemetry's
# Prometheus exporter under the `gatekeeper` namespace).
METRIC_REVIEWS = "gatekeeper_validation_request_count_total"
METRIC_HANDLER = "gatekeeper_validation_request_duration_seconds"

REGO = r"""
package draguardllmtier

# The pod template a workload carries: a Pod is its own; a CronJob's is two levels down.
pod_template(obj) = t {
  obj.kind == "Pod"
  t := {"metadata": object.get(obj, "metadata", {}), "spec": obj.spec}
}
pod_template(obj) = t {
  obj.kind == "CronJob"
  t := obj.spec.jobTemplate.spec.template
}
pod_template(obj) = t {
  not obj.kind == "Pod"
  not obj.kind == "CronJob"
  t := obj.spec.template
}

containers(spec) = cs {
  cs := array.concat(object.get(spec, "initContainers", []), object.get(spec, "containers", []))
}

# A whole word of `text`: bounded by its ends or by characters other than letters and digits.
has_word(text, word) {
  regex.match(sprintf("(^|[^a-z0-9])%s([^a-z0-9]|$)", [replace(word, ".", "\\.")]), lower(text))
}

llm(t) {
  some k
  t.metadata.labels[k] == input.parameters.labels[k]
}
llm(t) {
  some k
  has_word(t.metadata.labels[k], input.parameters.labelWords[k][_])
}
llm(t) {
  cs := containers(t.spec)
  has_word(cs[_].image, input.parameters.imageWords[_])
}
llm(t) {
  cs := containers(t.spec)
  startswith(cs[_].image, input.parameters.imagePrefixes[_])
}

allowed(cls) {
  cls == input.parameters.deviceClasses[_]
}
allowed(cls) {
  startswith(cls, input.parameters.deviceClassPrefixes[_])
}

# Every class a claim spec may be given: each request's, and each alternative of a prioritized list.
classes(cs) = out {
  exact := {c | c := cs.devices.requests[_].exactly.deviceClassName}
  first := {c | c := cs.devices.requests[_].firstAvailable[_].deviceClassName}
  out := exact | first
}

synced(kind, name) = o {
  o := data.inventory.namespace[input.review.namespace]["resource.k8s.io/v1"][kind][name]
}

# (what the pod entry names, the claim spec Gatekeeper holds for it), for each claim entry.
claim_spec(rc) = ["template", rc.resourceClaimTemplateName, o.spec.spec] {
  o := synced("ResourceClaimTemplate", rc.resourceClaimTemplateName)
}
claim_spec(rc) = ["claim", rc.resourceClaimName, o.spec] {
  o := synced("ResourceClaim", rc.resourceClaimName)
}

violation[{"msg": msg}] {
  t := pod_template(input.review.object)
  llm(t)
  rc := t.spec.resourceClaims[_]
  found := claim_spec(rc)
  all_classes := classes(found[2])
  cls := all_classes[_]
  not allowed(cls)
  msg := sprintf(
    "LLM workloads must use the LLM tier's device classes: claim %v (%v %v) asks for %v",
    [rc.name, found[0], found[1], cls],
  )
}

violation[{"msg": msg}] {
  t := pod_template(input.review.object)
  llm(t)
  rc := t.spec.resourceClaims[_]
  name := rc.resourceClaimTemplateName
  not synced("ResourceClaimTemplate", name)
  msg := sprintf(
    "LLM workload: claim template %v is not in Gatekeeper's synced data: its classes cannot be checked",
    [name],
  )
}

violation[{"msg": msg}] {
  t := pod_template(input.review.object)
  llm(t)
  rc := t.spec.resourceClaims[_]
  name := rc.resourceClaimName
  not synced("ResourceClaim", name)
  msg := sprintf(
    "LLM workload: claim %v is not in Gatekeeper's synced data: its classes cannot be checked",
    [name],
  )
}
"""


def _prefixes(patterns: list[str]) -> tuple[list[str], list[str]]:
    """(exact names, prefixes): a trailing `*` is a prefix, as draguard's policy reads it."""
    exact = [p for p in patterns if not p.endswith("*")]
    return exact, [p[:-1] for p in patterns if p.endswith("*")]


def llm_parameters() -> dict[str, Any]:
    """The constraint's parameters, from the `llm` class of policies/tier.yaml: a class or a word
    added to the shipped policy reaches Gatekeeper too."""
    docs = yaml.safe_load_all((ROOT / "policies" / "tier.yaml").read_text())
    tier = next(d for d in docs if d)
    llm = next(c for c in tier["spec"]["classes"] if c["name"] == "llm")
    match = llm.get("match") or {}
    classes, class_prefixes = _prefixes(list(llm["deviceClasses"]))
    images, image_prefixes = _prefixes(list(match.get("images") or []))
    # An image glob with `*` elsewhere than at its end has no prefix form: say so, never drop it.
    odd = [i for i in images if "*" in i or "?" in i]
    if odd:
        raise ValueError(f"policies/tier.yaml: image patterns Gatekeeper's parameters cannot express: {odd}")
    return {
        "labels": dict(match.get("labels") or {}),
        "labelWords": {k: list(v) for k, v in (match.get("labelWords") or {}).items()},
        "imageWords": [str(w).lower() for w in match.get("imageWords") or []],
        # Exact image names are prefixes too: `nginx` as a pattern matches no tag, `nginx:` would.
        "imagePrefixes": image_prefixes + images,
        "deviceClasses": classes,
        "deviceClassPrefixes": class_prefixes,
    }


def constraint_template() -> dict[str, Any]:
    str_list = {"type": "array", "items": {"type": "string"}}
    return {
        "apiVersion": "templates.gatekeeper.sh/v1",
        "kind": "ConstraintTemplate",
        "metadata": {"name": CONSTRAINT_KIND.lower()},
        "spec": {
            "crd": {
                "spec": {
                    "names": {"kind": CONSTRAINT_KIND},
                    "validation": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                "labelWords": {"type": "object", "additionalProperties": str_list},
                                "imageWords": str_list,
                                "imagePrefixes": str_list,
                                "deviceClasses": str_list,
                                "deviceClassPrefixes": str_list,
                            },
                        }
                    },
                }
            },
            "targets": [{"target": "admission.k8s.gatekeeper.sh", "rego": REGO}],
        },
    }


def constraint() -> dict[str, Any]:
    return {
        "apiVersion": "constraints.gatekeeper.sh/v1beta1",
        "kind": CONSTRAINT_KIND,
        "metadata": {"name": CONSTRAINT_NAME},
        "spec": {
            "enforcementAction": "deny",
            "match": {"kinds": [{"apiGroups": [g], "kinds": k} for g, k in WORKLOAD_KINDS.items()]},
            "parameters": llm_parameters(),
        },
    }


def sync_config() -> dict[str, Any]:
    """Gatekeeper's replication: the objects the Rego reads through `data.inventory`."""
    return {
        "apiVersion": "config.gatekeeper.sh/v1alpha1",
        "kind": "Config",
        "metadata": {"name": "config", "namespace": GATEKEEPER_NS},
        "spec": {
            "sync": {
                "syncOnly": [
                    {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaimTemplate"},
                    {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
                ]
            }
        },
    }


def built_binary(explicit: str | None, env_var: str, build_script: str, *path_args: str) -> Path | None:
    """A peer's binary: the option's path, then the environment's, then where its build script caches
    it (`<script> --path ...`); None when none is an executable file."""
    cands = [explicit, os.environ.get(env_var)]
    if explicit is None:
        try:
            out = subprocess.run(
                ["bash", str(ROOT / "scripts" / build_script), "--path", *path_args],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            cands.append(out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return Path(c)
    return None


def gatekeeper_manager(explicit: str | None) -> Path | None:
    """--gatekeeper, $DRAGUARD_GATEKEEPER_MANAGER, then where scripts/build-gatekeeper.sh caches it."""
    return built_binary(explicit, "DRAGUARD_GATEKEEPER_MANAGER", "build-gatekeeper.sh")


def gatekeeper_manifest(binary: Path) -> Path | None:
    """deploy/gatekeeper.yaml of the module source the binary was built from."""
    path = binary.parent.parent / "src" / "deploy" / "gatekeeper.yaml"
    return path if path.is_file() else None


def manifest_objects(manifest: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(its CRDs, its `validation.gatekeeper.sh` webhook) from deploy/gatekeeper.yaml."""
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if isinstance(d, dict)]
    crds = [d for d in docs if d.get("kind") == "CustomResourceDefinition"]
    hook = next(
        (
            h
            for d in docs
            if d.get("kind") == "ValidatingWebhookConfiguration"
            for h in d.get("webhooks") or []
            if h.get("name") == "validation.gatekeeper.sh"
        ),
        None,
    )
    if not crds or hook is None:
        raise SystemExit(f"{manifest}: no CRDs or no validation.gatekeeper.sh webhook in it")
    return crds, hook


def webhook_configuration(hook: dict[str, Any], port: int, ca_pem: bytes, arm_label: str) -> dict[str, Any]:
    """Gatekeeper's own validating webhook, aimed at 127.0.0.1 and narrowed to the bench's arm and to
    the workload kinds its constraint matches (its shipped rule is every resource: the bench's
    stream is only these). It fails closed, so a timeout shows as an error instead of an admission."""
    import base64

    h = json.loads(json.dumps(hook))
    h["clientConfig"] = {
        "url": f"https://127.0.0.1:{port}/v1/admit",
        "caBundle": base64.b64encode(ca_pem).decode(),
    }
    h["namespaceSelector"] = {
        "matchExpressions": [{"key": arm_label, "operator": "In", "values": ["gatekeeper"]}]
    }
    h["rules"] = [
        {"apiGroups": [g], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": r}
        for g, r in WEBHOOK_RESOURCES.items()
    ]
    h["failurePolicy"] = "Fail"
    h["timeoutSeconds"] = 10
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "gatekeeper-validating-webhook-configuration"},
        "webhooks": [h],
    }


def write_certs(cert_dir: Path) -> bytes:
    """Gatekeeper's own CA and serving certificate for 127.0.0.1, as tls.crt/tls.key in its
    --cert-dir; returns the CA for the caBundle."""
    from webhook.certs import generate_ca, generate_serving

    ca, ca_key = generate_ca("gatekeeper-bench-ca")
    crt, key = generate_serving(ca, ca_key, ["127.0.0.1", "localhost"])
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "ca.crt").write_bytes(ca)
    (cert_dir / "tls.crt").write_bytes(crt)
    (cert_dir / "tls.key").write_bytes(key)
    os.chmod(cert_dir / "tls.key", 0o600)
    return ca


def wait_established(cluster: Any, names: set[str], timeout: float) -> None:
    """Until every CRD named is Established: a constraint or Config applied before is refused."""
    deadline = time.monotonic() + timeout
    while True:
        items = cluster.kube().get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
        ready = {
            i["metadata"]["name"]
            for i in items
            if any(
                c.get("type") == "Established" and c.get("status") == "True"
                for c in (i.get("status") or {}).get("conditions") or []
            )
        }
        missing = names - ready
        if not missing:
            return
        if time.monotonic() > deadline:
            raise SystemExit(
                f"bench/peer.py --webhook: CRDs not Established within {timeout:.0f} s: {sorted(missing)}"
            )
        time.sleep(0.5)


def start_gatekeeper(
    cluster: Any, binary: Path, manifest: Path, port: int, metrics_port: int, health_port: int, arm_label: str
) -> int:
    """Gatekeeper's CRDs, namespace, sync Config and webhook configuration, then its manager; its
    template and constraint are applied by `apply_policy` once it runs (the constraint's CRD is
    generated from the template by the manager itself). Returns the manager's pid."""
    crds, hook = manifest_objects(manifest)
    cluster.progress(f"applying Gatekeeper's {len(crds)} CRDs from {manifest}")
    doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": crds})
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=doc)
    wait_established(cluster, {c["metadata"]["name"] for c in crds}, 120)
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GATEKEEPER_NS}}
    ca = write_certs(cluster.paths.root / "gatekeeper-certs")
    objs = [ns, sync_config(), webhook_configuration(hook, port, ca, arm_label)]
    for o in objs:  # the namespace before the Config that lives in it
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(o))
    argv = [
        str(binary),
        "--operation=webhook",
        "--operation=generate",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--cert-dir={cluster.paths.root / 'gatekeeper-certs'}",
        "--disable-cert-rotation",
        # Its reconcilers otherwise look up their own Pod (to own status objects) and stall without one.
        "--debug-use-fake-pod",
        f"--health-addr=127.0.0.1:{health_port}",
        "--metrics-backend=prometheus",
        f"--prometheus-port={metrics_port}",
        "--disable-opa-builtin={http.send}",
        f"--exempt-namespace={GATEKEEPER_NS}",
        "--logtostderr",
    ]
    env = {"KUBECONFIG": str(cluster.kubeconfig), "POD_NAMESPACE": GATEKEEPER_NS}
    return int(cluster.spawn("gatekeeper", argv, env=env))


def apply_policy(cluster: Any, timeout: float = 180.0) -> float:
    """The ConstraintTemplate, then its constraint once the manager has made the constraint CRD."""
    t0 = time.monotonic()
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(constraint_template()))
    crd = f"{CONSTRAINT_KIND.lower()}.constraints.gatekeeper.sh"
    cluster.wait(
        "gatekeeper",
        lambda: (
            re.search(rf"\b{re.escape(crd)}\b", cluster.kubectl("get", "crd", "-o", "name", check=False))
            is not None
        ),
        timeout,
    )
    wait_established(cluster, {crd}, timeout)
    doc = json.dumps(constraint())
    cluster.wait(
        "gatekeeper",
        lambda: cluster.kubectl_run("apply", "--server-side", "-f", "-", input=doc).returncode == 0,
        timeout,
    )
    return time.monotonic() - t0
