"""The rule registry: every module here exposes `RULES: tuple[Rule, ...]`."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache

from .base import Rule

RULE_MODULES: tuple[str, ...] = ("structure", "tier", "migrate", "quota", "cel_lint", "opaque", "release")
# The rules draguard's own failures are reported under: `internal/<module>` when a rule module
# raised, `internal/engine` when the engine as a whole did (the server's guard around it).
ENGINE_FAILURE = "internal/engine"
INTERNAL_RULES: tuple[str, ...] = (*(f"internal/{m}" for m in RULE_MODULES), ENGINE_FAILURE)


@dataclass(frozen=True, slots=True)
class RuleModule:
    name: str
    rules: tuple[Rule, ...]
    # Set when the module failed to import; evaluate() reports it rather than skipping silently.
    error: str | None = None


@cache
def registry() -> tuple[RuleModule, ...]:
    """Every rule module, imported once. A module that does not exist yet is left out."""
    out: list[RuleModule] = []
    for name in RULE_MODULES:
        full = f"{__name__}.{name}"
        try:
            mod = importlib.import_module(full)
        except ModuleNotFoundError as e:
            if e.name == full:
                continue
            out.append(RuleModule(name, (), f"{type(e).__name__}: {e}"))
            continue
        except Exception as e:  # a broken rule module must surface, not vanish
            out.append(RuleModule(name, (), f"{type(e).__name__}: {e}"))
            continue
        rules = getattr(mod, "RULES", ())
        out.append(RuleModule(name, tuple(rules)))
    return tuple(out)


def modules(names: tuple[str, ...] | None = None) -> tuple[RuleModule, ...]:
    """The registry, optionally restricted to some module names (the same tuple for the same names,
    so evaluate()'s dispatch plans are built once per restriction)."""
    return registry() if names is None else _restricted(tuple(names))


@cache
def _restricted(names: tuple[str, ...]) -> tuple[RuleModule, ...]:
    return tuple(m for m in registry() if m.name in names)
