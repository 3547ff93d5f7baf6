"""Helpers for the robustness regression tests: the seed inventory, the repository policies, and
in-process runs of `draguard review` and of the engine."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core.findings import Report
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory, load_inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import load_policies
from webhook.policy.model import PolicySet

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "tests" / "fixtures" / "seed"
POLICIES = ROOT / "policies"


@dataclass
class Run:
    code: int
    out: str
    err: str
    seconds: float


@pytest.fixture(scope="session")
def inventory_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seed cluster (16 devices on 3 nodes) and its DeviceClasses in one file."""
    docs: list[Any] = list(yaml.safe_load_all((SEED / "cluster-inventory.yaml").read_text()))
    docs += list(yaml.safe_load_all((SEED / "deviceclasses.yaml").read_text()))
    path = tmp_path_factory.mktemp("inv") / "inventory.yaml"
    path.write_text(yaml.safe_dump_all([d for d in docs if d is not None]))
    return path


@pytest.fixture(scope="session")
def inventory(inventory_path: Path) -> Inventory:
    return load_inventory(inventory_path)


@pytest.fixture(scope="session")
def policies() -> PolicySet:
    return load_policies(str(POLICIES))


def run_review(argv: Sequence[str]) -> Run:
    """`draguard review ...` in this process, as a user would run it (exit code, stdout, stderr)."""
    from webhook.cli import main

    out, err = io.StringIO(), io.StringIO()
    # CPU time of this process (`seconds`): what the review costs, whatever else shares the machine.
    t0 = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["review", *argv])
    return Run(code, out.getvalue(), err.getvalue(), time.process_time() - t0)


def evaluate_one(obj: Any, policies: PolicySet, inventory: Inventory, *, admission: bool = False) -> Report:
    item = SourceObject(obj=obj, file="<test>", line=1, doc_index=0, lines={})
    return evaluate([item], policies, inventory, Context(default_namespace="team-a", admission=admission))
