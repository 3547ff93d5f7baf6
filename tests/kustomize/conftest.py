"""Bundle tests need a kustomize (standalone or kubectl's); without one they skip and say why."""

from __future__ import annotations

import pytest
from kbundle import kustomize_command


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if kustomize_command() is not None:
        return
    skip = pytest.mark.skip(
        reason="neither `kustomize` nor `kubectl` on PATH; install one to build the bundle"
    )
    for item in items:
        if "tests/kustomize/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
