"""The bundle runs the project's real commands: container args parse with the CLI's own parsers, and
`draguard review` finds nothing to object to in any overlay (while it does flag a broken DeviceClass)."""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from kbundle import KUSTOMIZE, OVERLAYS, REPO, build, containers


def _parser(module: str) -> argparse.ArgumentParser:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        pytest.skip(f"{module} is not in the tree yet ({exc})")
    parser = argparse.ArgumentParser(prog="draguard", exit_on_error=False)
    mod.register(parser.add_subparsers(dest="command"))
    return parser


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace:
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            return parser.parse_args(args)
    except SystemExit:
        pytest.fail(f"draguard rejects the bundle's arguments {args}: {err.getvalue()}")


def _args_of(overlay: str, name: str) -> list[list[str]]:
    return [c["args"] for o in build(overlay) if o["metadata"]["name"] == name for c in containers(o)]


@pytest.mark.parametrize("overlay", ["aks", "gke", "eks"])
def test_webhook_and_certs_args_parse_with_the_cli(overlay: str) -> None:
    parser = _parser("webhook.server.commands")
    (serve,) = _args_of(overlay, "draguard-webhook")
    ns = _parse(parser, serve)
    assert ns.command == "serve" and callable(ns.func)
    assert (ns.tls_cert, ns.tls_key) == ("/etc/draguard/tls/tls.crt", "/etc/draguard/tls/tls.key")
    assert ns.policies == "/etc/draguard/policies" and ns.kubeconfig is None and not ns.no_watch
    for name in ("draguard-certs", "draguard-certs-renew"):
        (certs,) = _args_of(overlay, name)
        ns = _parse(parser, certs)
        assert ns.command == "certs" and ns.out_dir is None and not ns.no_inject
        assert (ns.namespace, ns.service, ns.secret, ns.webhook_config) == (
            "draguard-system",
            "draguard-webhook",
            "draguard-webhook-tls",
            "draguard",
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_driver_args_parse_with_the_cli(overlay: str) -> None:
    parser = _parser("driver.cli")
    (args,) = _args_of(overlay, "draguard-driver")
    ns = _parse(parser, [a.replace("$(NODE_NAME)", "node-a") for a in args])
    assert callable(ns.func)
    assert ns.node_name == "node-a" and ns.driver_name == "gpu.nvidia.com"
    assert ns.plugin_dir == "/var/lib/kubelet/plugins/gpu.nvidia.com"
    assert ns.registry_dir == "/var/lib/kubelet/plugins_registry"
    assert ns.cdi_root == "/var/run/cdi" and int(ns.metrics_port) == 9400
    assert bool(ns.real) == (overlay != "local") and bool(ns.sim) == (overlay == "local")


def _review(paths: list[str], policies: Path) -> tuple[int, dict[str, Any] | list[Any], str]:
    parser = _parser("webhook.review.commands")
    ns = parser.parse_args(
        ["review", *paths, "--policies", str(policies), "--format", "json", "--no-progress"]
    )
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            rc = ns.func(ns)
    finally:
        os.chdir(cwd)
    return rc, json.loads(out.getvalue()), err.getvalue()


def _findings(report: Any) -> list[dict[str, Any]]:
    assert isinstance(report, dict) and "findings" in report, f"unexpected review JSON: {str(report)[:300]}"
    return list(report["findings"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_review_of_each_overlay_is_clean(overlay: str) -> None:
    rc, report, err = _review([str(KUSTOMIZE / "overlays" / overlay)], REPO / "policies")
    assert rc == 0, err
    assert _findings(report) == [], json.dumps(report, indent=1)[:2000]


def test_review_flags_a_device_class_written_like_the_seed(tmp_path: Path) -> None:
    """The same review catches the seed article's DeviceClass (attribute `migProfile` does not exist)."""
    (tmp_path / "seed-class.yaml").write_text(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: seed-mig\n"
        "spec:\n  selectors:\n    - cel:\n        expression: >-\n"
        "          device.driver == 'gpu.nvidia.com' &&\n"
        "          device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100 80GB PCIe' &&\n"
        "          device.attributes['gpu.nvidia.com'].migProfile == '3g.20gb'\n"
    )
    (tmp_path / "kustomization.yaml").write_text(
        f"resources:\n  - {os.path.relpath(KUSTOMIZE / 'overlays' / 'eks', tmp_path)}\n  - seed-class.yaml\n"
    )
    _rc, report, _ = _review([str(tmp_path)], REPO / "policies")
    hits = [f for f in _findings(report) if f["object"]["name"] == "seed-mig"]
    assert [f["rule"] for f in hits] == ["cel/unknown-attribute"], json.dumps(report, indent=1)[:2000]
    assert "profile" in hits[0]["message"]
