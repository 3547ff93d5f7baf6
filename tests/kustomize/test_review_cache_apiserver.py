"""The review cache against a real API server: what it sends again is answered from the cache.

A GitOps controller (Flux always, Argo CD with server-side apply) re-applies every object on each
sync. A server-side apply that changes nothing still reaches admission, as an UPDATE identical to
the last but for its uid, so draguard answers it without evaluating again; a change is evaluated.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kapi import Api, api_server, wait_for
from kaudit import DEVICECLASSES, NS, REPO, template

from webhook import certs
from webhook.dev.cluster import free_port


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, int, ssl.SSLContext]]:
    """The API server, and `draguard serve` on loopback registered for Deployments in `ml`."""
    tmp = tmp_path_factory.mktemp("cache")
    tls = tmp / "tls"
    certs.ensure_certificates(certs.DirStore(tls), ["127.0.0.1"])
    ctx = ssl.create_default_context(cafile=str(tls / "ca.crt"))
    with api_server() as a:
        assert a.kubectl("apply", "-f", str(DEVICECLASSES)).returncode == 0
        made = a.kubectl("create", "-f", "-", stdin=json.dumps(template("llm-h100", "gpu.nvidia.com-h100")))
        assert made.returncode == 0, made.stderr
        port = free_port()
        argv = [sys.executable, "-m", "webhook.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                "--tls-cert", str(tls / "tls.crt"), "--tls-key", str(tls / "tls.key"),
                "--policies", str(REPO / "policies"), "--kubeconfig", str(a.kubeconfig),
                "--log-level", "warning"]  # fmt: skip
        proc = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: _get(port, ctx, "/readyz")[0] == 200, "draguard serve to be ready", timeout=60)
            hook = {
                "name": "validate.cache.draguard.io",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/validate",
                    "caBundle": base64.b64encode((tls / "ca.crt").read_bytes()).decode(),
                },
                "rules": [
                    {
                        "apiGroups": ["apps"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["deployments"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
            }
            config = {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "draguard-cache-test"},
                "webhooks": [hook],
            }
            assert a.kubectl("apply", "-f", "-", stdin=json.dumps(config)).returncode == 0
            yield a, port, ctx
        finally:
            proc.terminate()
            proc.wait(30)


def _get(port: int, ctx: ssl.SSLContext, path: str) -> tuple[int, str]:
    """(status, body) of a GET to the webhook; status 0 while it does not answer."""
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=ctx, timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except OSError:
        return 0, ""


def _cache(served: tuple[Api, int, ssl.SSLContext]) -> dict[str, float]:
    _, port, ctx = served
    status, text = _get(port, ctx, "/metrics")
    assert status == 200, status
    out = {"hit": 0.0, "miss": 0.0}
    for line in text.splitlines():
        for result in out:
            if line.startswith(f'draguard_review_cache_total{{result="{result}"}}'):
                out[result] = float(line.rsplit(" ", 1)[1])
    return out


def _deployment(image: str) -> dict[str, Any]:
    pod = {
        "containers": [{"name": "server", "image": image, "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "llm-h100"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "synced", "namespace": NS},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "synced"}},
            "template": {"metadata": {"labels": {"app": "synced"}}, "spec": pod},
        },
    }


def _sync(a: Api, obj: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
    ssa = ("apply", "--server-side", "--field-manager=gitops", *extra, "-f", "-")
    res: subprocess.CompletedProcess[str] = a.kubectl(*ssa, stdin=json.dumps(obj))
    if not extra:
        assert res.returncode == 0, res.stderr
    return res


def test_a_sync_that_changes_nothing_is_answered_from_the_cache(
    served: tuple[Api, int, ssl.SSLContext],
) -> None:
    a, _, _ = served
    # The webhook is in the path: it admits the Deployment once its watch has the template.
    wait_for(lambda: _sync(a, _deployment("vllm/vllm-openai:v0.6.3"), "--dry-run=server").returncode == 0,
             "the webhook to admit the Deployment")  # fmt: skip
    before = _cache(served)
    _sync(a, _deployment("vllm/vllm-openai:v0.6.3"))  # CREATE
    _sync(a, _deployment("vllm/vllm-openai:v0.6.3"))  # UPDATE, nothing changed: evaluated, kept
    first = _cache(served)
    assert first["miss"] >= before["miss"] + 2
    for _ in range(3):  # each later sync: the same request but for its uid
        _sync(a, _deployment("vllm/vllm-openai:v0.6.3"))
    again = _cache(served)
    assert again["hit"] == first["hit"] + 3
    assert again["miss"] == first["miss"]
    # A sync that changes the object is evaluated again.
    _sync(a, _deployment("vllm/vllm-openai:v0.6.4"))
    changed = _cache(served)
    assert changed["miss"] == again["miss"] + 1 and changed["hit"] == again["hit"]
