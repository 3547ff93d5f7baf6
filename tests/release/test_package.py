"""The wheel users get from `pip install draguard`: one import name, the default policies inside, and
offline commands that run with only the core dependencies.

The wheel is built from this checkout and unpacked; each command runs from a directory outside the
checkout with the wheel first on the path and an import hook that refuses what the light install
does not carry (the extras' packages) and the repository's own top-level names (`webhook`,
`driver`), so a command that still needs either fails here.
"""

from __future__ import annotations

import email.parser
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

# What only the extras install, and the names the repository layout has but the wheel must not need.
EXTRAS_ONLY = ("aiohttp", "kubernetes", "grpc", "cryptography", "prometheus_client", "pynvml", "orjson")
REFUSED = (*EXTRAS_ONLY, "webhook", "driver")

RUNNER = """\
import runpy, sys

refused = set(sys.argv[1].split(","))


class Refuse:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in refused or name == "google.protobuf" or name.startswith("google.protobuf."):
            raise ModuleNotFoundError(f"No module named {name!r} (refused by the test)", name=name)
        return None


sys.meta_path.insert(0, Refuse())
sys.argv = ["draguard", *sys.argv[2:]]
runpy.run_module("draguard", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
         str(ROOT)],
        capture_output=True, text=True, timeout=240,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return next(out.glob("draguard-*.whl"))


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(root)
    (root / "run_draguard.py").write_text(RUNNER)
    return root


def _draguard(
    site: Path, cwd: Path, *args: str, refused: tuple[str, ...] = REFUSED
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("DRAGUARD_CONFIG", None)
    return subprocess.run(
        [sys.executable, str(site / "run_draguard.py"), ",".join(refused), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(zf.read(name).decode())


def test_the_wheel_has_one_import_name_and_carries_the_default_policies(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        tops = {n.split("/", 1)[0] for n in names}
        assert {t for t in tops if not t.endswith(".dist-info")} == {"draguard"}
        top_level = next(n for n in names if n.endswith("top_level.txt"))
        assert zf.read(top_level).decode().split() == ["draguard"]
        shipped = {n.rsplit("/", 1)[1]: zf.read(n) for n in names if n.startswith("draguard/policies/")}
        entry_points = zf.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    defaults = {p.name: p.read_bytes() for p in (ROOT / "policies").glob("*.yaml")}
    assert defaults and shipped == defaults, "draguard/policies must equal the repository's policies/*.yaml"
    assert "draguard/webhook/cli.py" in names and "draguard/driver/plugin.py" in names
    assert "draguard = draguard.webhook.cli:main" in entry_points
    assert "kubectl-draguard = draguard.webhook.cli:main" in entry_points


def test_the_core_requirements_leave_the_server_and_driver_packages_to_extras(wheel: Path) -> None:
    meta = _metadata(wheel)
    core, extras = set(), {}
    for req in meta.get_all("Requires-Dist") or []:
        name, _, marker = req.partition(";")
        dist = name.split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip().lower()
        if "extra ==" in marker:
            extras.setdefault(marker.split("==")[1].strip().strip("'\""), set()).add(dist)
        else:
            core.add(dist)
    heavy = {
        "aiohttp", "kubernetes", "grpcio", "protobuf", "cryptography", "prometheus-client", "nvidia-ml-py",
        "orjson",
    }
    assert not core & heavy, f"pip install draguard would pull {sorted(core & heavy)}"
    assert {"aiohttp", "kubernetes", "cryptography", "prometheus-client", "orjson"} <= extras["webhook"]
    assert {"grpcio", "protobuf", "nvidia-ml-py"} <= extras["driver"]
    assert {"webhook", "driver", "dev"} <= set(meta.get_all("Provides-Extra") or [])


def test_the_package_imports_from_the_wheel_not_the_checkout(site: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(site)}
    res = subprocess.run(
        [sys.executable, "-c",
         "import draguard, draguard.webhook.cli as c; print(draguard.__file__, c.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert all(Path(p).is_relative_to(site) for p in res.stdout.split()), res.stdout


def test_review_without_a_policy_directory_uses_the_shipped_policies(site: Path, tmp_path: Path) -> None:
    args = ("review", str(EXAMPLES), "--inventory", str(EXAMPLES / "inventory.yaml"), "--format", "json")
    light = _draguard(site, tmp_path, *args)
    assert "Traceback" not in light.stderr, light.stderr
    assert "judged by the default policies shipped with draguard" in light.stderr, light.stderr
    # The same verdicts as the repository's policies give, named explicitly.
    repo = subprocess.run(
        [sys.executable, "-m", "webhook.cli", *args, "--policies", str(ROOT / "policies")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert light.returncode == repo.returncode == 1, (light.stderr, repo.stderr)
    def verdicts(out: str) -> list[tuple[str, str, str]]:
        found = json.loads(out)["findings"]
        return sorted((f["rule"], f["mode"], json.dumps(f["object"], sort_keys=True)) for f in found)

    ids = verdicts(light.stdout)
    assert ids == verdicts(repo.stdout)
    assert any(rule.startswith("tier/") for rule, _, _ in ids), "the shipped tier policy did not run"


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (("--version",), "draguard "),
        (("schema",), '"$schema"'),
        (("rules",), "tier/"),
        (("completion", "bash"), "complete"),
        (("test", str(ROOT / "policies/tests")), "passed"),
        (("migrate", str(EXAMPLES / "teams")), "resourceClaimTemplateName"),
        (("explain", str(EXAMPLES / "teams"), "--inventory", str(EXAMPLES / "inventory.yaml")),
         "can be allocated"),
        (("lint-cel", "device.driver == 'gpu.nvidia.com'"), "device.driver"),
        (("preflight", str(EXAMPLES / "inventory.yaml")), ""),
        (("quota", "render", "--policies", str(ROOT / "policies")), "ResourceQuota"),
    ],
    ids=lambda v: v[0] if isinstance(v, tuple) else None,
)
def test_offline_commands_run_with_the_core_dependencies_only(
    site: Path, tmp_path: Path, args: tuple[str, ...], expect: str
) -> None:
    res = _draguard(site, tmp_path, *args)
    out = res.stdout + res.stderr
    assert "Traceback" not in out and "refused by the test" not in out, out[-3000:]
    assert res.returncode in (0, 1), out[-3000:]
    assert expect in out, out[-3000:]


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (("serve", "--help"), None),
        (("serve", "--tls-cert", "tls.crt", "--tls-key", "tls.key", "--policies", "."), "webhook"),
        (("driver", "run", "--help"), None),
    ],
)
def test_cluster_commands_name_the_extra_they_need(
    site: Path, tmp_path: Path, args: tuple[str, ...], extra: str | None
) -> None:
    res = _draguard(site, tmp_path, *args)
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    if extra is None:  # help needs no extra
        assert res.returncode == 0 and "usage:" in res.stdout
    else:
        assert res.returncode == 2
        assert f"pip install 'draguard[{extra}]'" in res.stderr, res.stderr


def test_each_command_is_registered_by_the_module_the_cli_imports_for_it() -> None:
    """A run of one command builds only its module's part of the parser: the table must be right."""
    from webhook import cli

    full = cli.build_parser()
    names = set(_commands(full))
    assert names == set(cli.COMMANDS), f"commands without a module entry: {names ^ set(cli.COMMANDS)}"
    for name in names:
        assert name in _commands(cli.build_parser(name)), name


def test_one_command_imports_only_its_own_module(tmp_path: Path) -> None:
    code = (
        "import sys; from webhook import cli; cli.build_parser('review'); "
        "print(','.join(m for m in cli.COMMAND_MODULES if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "webhook.review.commands"


def _commands(parser: Any) -> list[str]:
    import argparse

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)
