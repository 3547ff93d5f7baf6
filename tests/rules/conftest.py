"""Shared fixtures for the rule tests: seed manifests and a two-node inventory (real YAML files)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.review.inputs import parse_yaml_documents

FIXTURES = Path(__file__).parent / "fixtures"
SEED = Path(__file__).parents[1] / "fixtures" / "seed"


def load_docs(path: Path) -> list[dict[str, Any]]:
    """Every mapping document of a YAML file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, Mapping)]


def read_sources(path: Path) -> list[SourceObject]:
    """SourceObjects with file and line maps, as `draguard review` reads them."""
    docs = parse_yaml_documents(path.read_text(), str(path))
    return [SourceObject(d.data, file=str(path), line=d.line, doc_index=d.index, lines=d.lines) for d in docs]


@pytest.fixture
def seed_dir() -> Path:
    return SEED


@pytest.fixture
def sources() -> Callable[[Path], list[SourceObject]]:
    return read_sources


@pytest.fixture
def legacy_pod() -> dict[str, Any]:
    return load_docs(SEED / "legacy-pod.yaml")[0]


@pytest.fixture
def seed_deployment() -> list[dict[str, Any]]:
    return load_docs(SEED / "inference-deployment.yaml")


@pytest.fixture
def seed_classes() -> list[dict[str, Any]]:
    return load_docs(SEED / "deviceclasses.yaml")


@pytest.fixture
def inventory_docs() -> list[dict[str, Any]]:
    return load_docs(FIXTURES / "inventory.yaml")


@pytest.fixture
def inventory(inventory_docs: list[dict[str, Any]]) -> Inventory:
    """node-a: 2x A100 80GB PCIe + 2x MIG 3g.20gb (on a third A100); node-h: 4x H100 80GB HBM3."""
    return Inventory.from_objects(inventory_docs)
