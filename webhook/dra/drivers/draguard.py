"""The bundled driver's schema, as the engine sees it: `driver/schema.py` (what it publishes)
and `driver/config.py` (the opaque configs it accepts, the validator it runs at prepare time)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._driver import ConfigError, config, schema
from . import DriverSchema


def _validate(driver: str, params: Mapping[str, Any], device_types: set[str] | None) -> list[ConfigError]:
    return config.validate_opaque_config(params, device_types)


SCHEMA = DriverSchema(
    name="draguard",
    title="draguard's bundled driver",
    driver_name=schema.DRIVER_NAME,
    drivers=frozenset({schema.DRIVER_NAME}),
    attributes=schema.ATTRIBUTES,
    device_types={schema.DRIVER_NAME: schema.DEVICE_TYPES},
    config_kinds={schema.DRIVER_NAME: config.KINDS},
    validator=_validate,
)
