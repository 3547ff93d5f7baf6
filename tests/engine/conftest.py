"""Session fixtures for the engine tests."""

from __future__ import annotations

import pytest
from engine_helpers import POLICIES, SEED

from webhook.dra.inventory import Inventory, load_inventory
from webhook.policy.load import load_policies
from webhook.policy.model import PolicySet


@pytest.fixture(scope="session")
def seed_inventory() -> Inventory:
    return load_inventory(SEED / "cluster-inventory.yaml")


@pytest.fixture(scope="session")
def shipped() -> PolicySet:
    return load_policies(POLICIES)
