"""draguard's own driver package, as the engine may see it: its published schema and config checks.

The two packages sit side by side: top-level `webhook` and `driver` in the repository, `draguard.webhook`
and `draguard.driver` in the installed distribution. A relative import cannot reach across the
repository's two top-level packages, so this one module names the sibling by the prefix both share.
Only the pure modules are exposed (dependency rule 3: the engine knows a driver by its schema).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from . import PREFIX


def module(name: str) -> ModuleType:
    """The driver's module `name` (e.g. "sim"), under whichever prefix this installation uses."""
    return importlib.import_module(f"{PREFIX}driver.{name}")


if TYPE_CHECKING:
    from driver import config, schema
    from driver.config import API_VERSION, ConfigError
    from driver.schema import DRIVER_NAME, K8S_DOMAIN, AttrSpec, AttrType, Kind
else:
    config = module("config")
    schema = module("schema")
    API_VERSION = config.API_VERSION
    ConfigError = config.ConfigError
    DRIVER_NAME = schema.DRIVER_NAME
    K8S_DOMAIN = schema.K8S_DOMAIN
    AttrSpec = schema.AttrSpec
    AttrType = schema.AttrType
    Kind = schema.Kind

__all__ = [
    "API_VERSION", "DRIVER_NAME", "K8S_DOMAIN", "PREFIX", "AttrSpec", "AttrType", "ConfigError", "Kind",
    "config", "module", "schema",
]
