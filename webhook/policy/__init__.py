"""Policy documents: their JSON Schema, models and loading."""

from importlib import resources


def schema_text() -> str:
    """The JSON Schema of policy documents as shipped (schema.json in this package), for `draguard schema`
    and the loader alike; here so that printing it imports no validator."""
    return resources.files(__name__).joinpath("schema.json").read_text(encoding="utf-8")
