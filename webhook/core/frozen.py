"""A cheaper `__init__` for the frozen, slotted dataclasses the review path builds per request."""

from __future__ import annotations

import dataclasses
from itertools import repeat
from typing import Any, TypeVar

T = TypeVar("T")

_MISSING = object()


def one_call_init(cls: type[T]) -> type[T]:
    """Give a frozen slotted dataclass an `__init__` that sets every field in one C-level pass.

    The generated `__init__` of a frozen dataclass calls `object.__setattr__` once per field from
    Python (about eight bytecodes a field); this one passes the values to `map(object.__setattr__,
    ...)` at once. Same parameters, order, defaults and default factories; every other generated
    method (eq, hash, repr, replace) is the dataclass's own. Refused for what it does not copy:
    fields outside `__init__`, keyword-only fields, `__post_init__`, classes that are not frozen
    or have no slots.
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: one_call_init needs a frozen dataclass with slots=True")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: one_call_init does not run __post_init__")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names: list[str] = []
    sig: list[str] = []
    body: list[str] = []
    env: dict[str, Any] = {"_any": any, "_map": map, "_repeat": repeat, "_set": object.__setattr__,
                           "_MISSING": _MISSING}
    for f in fields:
        if not f.init or f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: one_call_init needs plain init fields")
        names.append(f.name)
        if f.default is not dataclasses.MISSING:
            env[f"_d_{f.name}"] = f.default
            sig.append(f"{f.name}=_d_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            env[f"_f_{f.name}"] = f.default_factory
            sig.append(f"{f.name}=_MISSING")
            body.append(f"    if {f.name} is _MISSING:\n        {f.name} = _f_{f.name}()\n")
        else:
            sig.append(f.name)
    env["_NAMES"] = tuple(names)
    values = "".join(f"{n}, " for n in names)
    src = (
        f"def __init__(self, {', '.join(sig)}):\n"
        + "".join(body)
        + f"    _any(_map(_set, _repeat(self), _NAMES, ({values})))\n"
    )
    exec(src, env)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    setattr(cls, "__init__", init)  # noqa: B010 - mypy refuses assigning to a method
    return cls
