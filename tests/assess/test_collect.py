"""The progress line and the command's argument checks (the list calls themselves run against the
real API server in tests/e2e/test_assess.py)."""

from __future__ import annotations

import io

import pytest

from webhook.assess import collect
from webhook.cli import main


def test_progress_speaks_only_once_a_run_is_long(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    p = collect.Progress(enabled=True, stream=out)
    p.tick("listed 500 pods")
    assert out.getvalue() == ""  # a short run stays quiet
    monkeypatch.setattr(collect, "PROGRESS_AFTER", 0.0)
    p.tick("listed 1000 pods")
    assert out.getvalue().startswith("draguard assess: listed 1000 pods (")
    quiet = collect.Progress(enabled=False, stream=out)
    quiet.tick("x")
    assert out.getvalue().count("\n") == 1


def test_bad_arguments_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["assess", "--page-size", "0"])
    assert exc.value.code == 2
    assert "expected a whole number from 1 to 10000" in capsys.readouterr().err
    rc = main(["assess", "--policies", "/nonexistent/policies", "--kubeconfig", "/nonexistent/kubeconfig"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("draguard assess: /nonexistent/policies: policy directory not found")
    rc = main(["assess", "--kubeconfig", "/nonexistent/kubeconfig", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("draguard assess: cannot load credentials from /nonexistent/kubeconfig")
    assert "Traceback" not in err
