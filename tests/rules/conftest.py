"""Shared fixtures for the rule tests: seed manifests and a two-node inventory (real YAML files)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

FIXTURES = Path(__file__).parent / "fixtures"


def load_docs(name: str) -> list[dict[str, Any]]:
    """Every YAML document of a fixture file (copies of the seed article's manifests)."""
    return [d for d in yaml.safe_load_all((FIXTURES / name).read_text()) if isinstance(d, Mapping)]


@pytest.fixture
def legacy_pod() -> dict[str, Any]:
    return load_docs("seed-legacy-pod.yaml")[0]


@pytest.fixture
def seed_deployment() -> list[dict[str, Any]]:
    return load_docs("seed-deployment.yaml")


@pytest.fixture
def seed_classes() -> list[dict[str, Any]]:
    return load_docs("seed-deviceclasses.yaml")


@pytest.fixture
def inventory_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((FIXTURES / "inventory.yaml").read_text()) if d]
