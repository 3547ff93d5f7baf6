"""`draguard review --driver`: which driver serves the cluster, as a reviewer sets it, on NVIDIA's demo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from webhook import cli

NV = Path(__file__).parent / "fixtures" / "nvidia"
VFIO = str(NV / "gpu-test-vfio-config.yaml")
POLICIES = str(Path(__file__).parents[2] / "policies")


def _review(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, object]]]:
    capsys.readouterr()
    code = cli.main(["review", VFIO, "--policies", POLICIES, "-f", "json", *args])
    out = json.loads(capsys.readouterr().out)
    return code, [f for f in out["findings"] if f["rule"] == "config/opaque"]


def test_review_judges_by_the_driver_set_or_detected(capsys: pytest.CaptureFixture[str]) -> None:
    # The template requests vfio.gpu.nvidia.com, a class only NVIDIA's chart installs.
    assert _review(capsys) == (0, [])
    assert _review(capsys, "--driver", "nvidia") == (0, [])
    code, findings = _review(capsys, "--driver", "draguard")
    assert code == 1
    assert any("unsupported kind 'VfioDeviceConfig'" in str(f["message"]) for f in findings)


def test_unknown_driver_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["review", VFIO, "--driver", "amd"])
    assert exc.value.code == 2
    assert "invalid choice: 'amd'" in capsys.readouterr().err


def test_review_base_judges_both_sides_by_the_driver_set(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "README").write_text("base\n")
    git("add", "README")
    git("commit", "-q", "-m", "base")
    shutil.copy(VFIO, tmp_path / "vfio.yaml")  # the pull request adds NVIDIA's VFIO demo
    git("add", "vfio.yaml")
    monkeypatch.chdir(tmp_path)
    codes = {}
    for driver in ("nvidia", "draguard"):
        capsys.readouterr()
        codes[driver] = cli.main(["review", "vfio.yaml", "--base", "HEAD", "--policies", POLICIES,
                                  "--driver", driver])
    assert codes == {"nvidia": 0, "draguard": 1}
    assert "VfioDeviceConfig" in capsys.readouterr().out
