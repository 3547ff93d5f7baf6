"""components/apiserver-client-auth: only the API server may call the webhook.

A real kube-apiserver started with the component's AdmissionConfiguration and webhook kubeconfig
presents its client certificate to a real `draguard serve` run with the component's flags: its
admission calls are answered. A caller without that certificate (the same API server calling a host
name its kubeconfig has no credentials for, or a client on the network) is refused in the handshake.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kapi import Api, api_server
from kbundle import KUSTOMIZE, find, one, run_build

from tests.reliability.adversarial.hostile import client_cert, make_ca, write_ca
from tests.reliability.conftest import ROOT, WebhookProcess, draguard, free_port, write_inventory

COMPONENT = KUSTOMIZE / "components" / "apiserver-client-auth"
IN_POD_CA = "/etc/draguard/client-ca/ca.crt"


def _with_component() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kustomization.yaml").write_text(
            f"resources:\n  - {os.path.relpath(KUSTOMIZE / 'overlays' / 'eks', tmp)}\n"
            f"components:\n  - {os.path.relpath(COMPONENT, tmp)}\n"
        )
        return run_build(Path(tmp))


def _flag(args: list[str], name: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == name]


def test_component_requires_the_api_servers_certificate_and_keeps_probes_open() -> None:
    objs = _with_component()
    spec = one(objs, "Deployment", "draguard-webhook")["spec"]["template"]["spec"]
    (ctr,) = spec["containers"]
    args = ctr["args"]
    assert _flag(args, "--client-ca") == [IN_POD_CA]
    assert _flag(args, "--client-name") == ["kube-apiserver"]
    # Kubelet's probes and Prometheus have no client certificate: they stay on the plain-HTTP port.
    assert _flag(args, "--probe-port") == ["8081"]
    assert ctr["readinessProbe"]["httpGet"]["port"] == "probes"
    assert ctr["livenessProbe"]["httpGet"]["port"] == "probes"
    (mount,) = [m for m in ctr["volumeMounts"] if m["name"] == "client-ca"]
    assert IN_POD_CA.startswith(mount["mountPath"] + "/") and mount["readOnly"] is True
    (vol,) = [v for v in spec["volumes"] if v["name"] == "client-ca"]
    assert vol["configMap"]["name"] == "draguard-webhook-client-ca"
    # The API server side: credentials chosen by the name every webhook of the bundle calls.
    kubeconfig = yaml.safe_load((COMPONENT / "apiserver" / "webhook-kubeconfig.yaml").read_text())
    names = {u["name"] for u in kubeconfig["users"]}
    kinds = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
    for cfg in [c for k in kinds for c in find(tuple(objs), k)]:
        for hook in cfg["webhooks"]:
            svc = hook["clientConfig"]["service"]
            assert f"{svc['name']}.{svc['namespace']}.svc" in names, hook["name"]
    admission = yaml.safe_load((COMPONENT / "apiserver" / "admission-config.yaml").read_text())
    plugins = {p["name"]: p["configuration"]["kubeConfigFile"] for p in admission["plugins"]}
    assert set(plugins) == {"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"}
    assert {Path(f).name for f in plugins.values()} == {"webhook-kubeconfig.yaml"}


class ProbeReady(WebhookProcess):
    """Readiness is polled on the probe port: the serving port needs a client certificate."""

    probe_port = 0

    def get(self, path: str) -> tuple[int, bytes]:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.probe_port, timeout=10)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()


Setup = tuple[Api, ProbeReady, Path]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("client-auth")
    certs = tmp / "serving"
    made = subprocess.run(
        draguard("certs", "--out-dir", str(certs), "--extra-san", "127.0.0.1", "--extra-san", "localhost",
                 "--no-inject"),
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    client_ca = make_ca("apiserver-webhook-client-ca")
    ca_file = write_ca(client_ca, tmp / "client-ca.crt")
    crt, key = client_cert(client_ca, "kube-apiserver", tmp / "apiserver-webhook-client")

    # The webhook with the component's flags, the in-pod CA path mapped to this host.
    deployment = one(_with_component(), "Deployment", "draguard-webhook")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = ["--client-ca", str(ca_file)]
    for name in _flag(args, "--client-name"):
        flags += ["--client-name", name]
    wh = ProbeReady(tmp, certs, write_inventory(tmp / "inventory.yaml"))
    wh.probe_port = free_port()
    wh.start(*flags, "--probe-port", str(wh.probe_port), log_level="debug")

    # The component's API server files, with this run's paths. The shipped user is for the Service
    # name; the webhook here is a host process, which the API server calls as 127.0.0.1:<port>.
    kubeconfig = yaml.safe_load((COMPONENT / "apiserver" / "webhook-kubeconfig.yaml").read_text())
    for u in kubeconfig["users"]:
        u["user"] = {"client-certificate": str(crt), "client-key": str(key)}
    kubeconfig["users"].append({"name": f"127.0.0.1:{wh.port}", "user": dict(kubeconfig["users"][0]["user"])})
    (tmp / "webhook-kubeconfig.yaml").write_text(yaml.safe_dump(kubeconfig))
    admission = yaml.safe_load((COMPONENT / "apiserver" / "admission-config.yaml").read_text())
    for p in admission["plugins"]:
        p["configuration"]["kubeConfigFile"] = str(tmp / Path(p["configuration"]["kubeConfigFile"]).name)
    (tmp / "admission-config.yaml").write_text(yaml.safe_dump(admission))
    try:
        with api_server(["--admission-control-config-file", str(tmp / "admission-config.yaml")]) as api:
            yield api, wh, certs / "ca.crt"
    finally:
        wh.stop()


def _register(api: Api, wh: ProbeReady, serving_ca: Path) -> None:
    """One webhook per namespace: `ml` called as 127.0.0.1 (credentials), `anon` as localhost (none)."""
    import base64

    assert api.kubectl("create", "namespace", "anon").returncode == 0
    api.kubectl("-n", "anon", "create", "serviceaccount", "default")
    bundle = base64.b64encode(serving_ca.read_bytes()).decode()
    hooks = []
    for ns, host in (("ml", "127.0.0.1"), ("anon", "localhost")):
        hooks.append({
            "name": f"{ns}.client-auth.draguard.io",
            "clientConfig": {"url": f"https://{host}:{wh.port}/validate", "caBundle": bundle},
            "rules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
            ],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        })  # fmt: skip
    cfg = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "client-auth-test"},
        "webhooks": hooks,
    }
    res = api.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(cfg))
    assert res.returncode == 0, res.stderr


def _pod(name: str, ns: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"automountServiceAccountToken": False, "containers": [{"name": "c", "image": "busybox"}]},
    })  # fmt: skip


@pytest.mark.e2e
@pytest.mark.slow
def test_api_server_with_the_component_is_answered_and_others_are_refused(setup: Setup) -> None:
    api, wh, serving_ca = setup
    _register(api, wh, serving_ca)
    # The API server presents the component's client certificate: draguard answers.
    admitted = api.kubectl("create", "--dry-run=server", "-f", "-", stdin=_pod("authed", "ml"))
    assert admitted.returncode == 0, admitted.stderr + wh.log()[-2000:]
    assert "Pod/ml/authed" in wh.log()
    # The same API server calling a name its kubeconfig has no credentials for: refused in the TLS
    # handshake, so the fail-closed webhook refuses the pod and draguard never sees the request.
    refused = api.kubectl("create", "--dry-run=server", "-f", "-", stdin=_pod("anonymous", "anon"))
    assert refused.returncode != 0
    assert 'failed calling webhook "anon.client-auth.draguard.io"' in refused.stderr, refused.stderr
    assert "Pod/anon/anonymous" not in wh.log()
    # Any other client on the network without the certificate: the handshake fails.
    import http.client
    import ssl

    conn = http.client.HTTPSConnection("127.0.0.1", wh.port, context=wh.ssl_context(), timeout=10)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        conn.request("POST", "/validate", body=b"{}", headers={"Content-Type": "application/json"})
        conn.getresponse().read()
    conn.close()
    assert "Traceback" not in wh.log()
