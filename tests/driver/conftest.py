"""Fixtures for the driver tests: simulated NVML, a claim reader playing the API, a kubelet client."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from driver_helpers import NODE, InMemoryClaims, Kubelet, make_state

from driver.cdi import CdiWriter
from driver.plugin import PluginServer


@pytest.fixture(autouse=True)
def specs_pass_the_cdi_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every CDI spec a driver test writes in this process goes through the real CDI library."""
    from cdicheck import check_spec_file

    from driver.cdi import spec_path

    original = CdiWriter.write

    def checked(self: CdiWriter, claim_uid: str, devices: Any) -> list[str]:
        ids = original(self, claim_uid, devices)
        check_spec_file(spec_path(self.root, claim_uid))
        return ids

    monkeypatch.setattr(CdiWriter, "write", checked)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory path: unix socket paths must stay under 108 bytes."""
    d = Path(tempfile.mkdtemp(prefix="dg-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def claims() -> InMemoryClaims:
    return InMemoryClaims()


@pytest.fixture
async def plugin(short_dir: Path, claims: InMemoryClaims) -> AsyncIterator[tuple[PluginServer, Kubelet]]:
    state = make_state(short_dir, claims, topology="h100-8x-nvlink")
    server = PluginServer(
        state,
        driver_name="gpu.nvidia.com",
        plugin_dir=short_dir / "plugins",
        registry_dir=short_dir / "registry",
    )
    await server.start()
    kubelet = Kubelet(server.paths.registration)
    try:
        yield server, kubelet
    finally:
        await kubelet.close()
        await server.stop(0)


__all__ = ["NODE"]
