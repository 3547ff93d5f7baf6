"""The controller's failure handling (no cluster, broken policy changes) and how far apart the full
scans that watches ask for are."""

from __future__ import annotations

import shutil
from pathlib import Path

from webhook.audit.controller import AuditController, AuditOptions
from webhook.server.caches import KubeHttp

ROOT = Path(__file__).resolve().parents[2]
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def _controller(tmp_path: Path) -> tuple[AuditController, Path]:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(KUBECONFIG)  # nothing listens on port 1 of loopback
    policies = tmp_path / "policies"
    shutil.copytree(ROOT / "policies", policies, ignore=shutil.ignore_patterns("tests"))
    return AuditController(KubeHttp.from_kubeconfig(str(cfg)), AuditOptions(str(policies))), policies


def _sample(ctl: AuditController, name: str, **labels: str) -> float | None:
    return ctl.metrics.registry.get_sample_value(name, labels)


def test_an_unreachable_api_server_is_a_failed_scan_not_a_crash(tmp_path: Path) -> None:
    ctl, _ = _controller(tmp_path)
    assert ctl.load_policies()
    assert ctl.scan_once() is None
    assert _sample(ctl, "draguard_audit_scans_total", outcome="error") == 1.0
    assert ctl.scans_ok == 0  # /readyz stays 503


def test_a_broken_policy_change_keeps_the_last_good_set(tmp_path: Path) -> None:
    ctl, policies = _controller(tmp_path)
    assert ctl.load_policies()
    good = ctl.policies
    (policies / "broken.yaml").write_text("apiVersion: policy.draguard.io/v1alpha1\nkind: GpuTierPolicy\n")
    assert ctl.watcher.changed()
    assert not ctl.load_policies()
    assert ctl.policies is good
    assert not ctl.watcher.changed()  # the same broken content is not retried every tick
    assert _sample(ctl, "draguard_audit_policy_reloads_total", outcome="invalid") == 1.0


def test_full_scans_that_watches_ask_for_take_at_most_a_fifth_of_the_time(tmp_path: Path) -> None:
    # A cluster whose ResourceSlices change all the time (an autoscaler adding and removing GPU
    # nodes) must not keep the audit listing everything over and over.
    ctl, _ = _controller(tmp_path)
    assert ctl.full_scan_gap() == 60.0  # none yet: the configured gap
    ctl.last_full_seconds = 2.0  # a small cluster: the configured gap still rules
    assert ctl.full_scan_gap() == 60.0
    ctl.last_full_seconds = 52.0  # 50,000 objects (docs/audit.md): five times the scan
    assert ctl.full_scan_gap() == 260.0
    assert ctl.load_policies()
    assert ctl.scan_once() is None  # a failed scan (nothing listens) leaves the last good duration
    assert ctl.last_full_seconds == 52.0
