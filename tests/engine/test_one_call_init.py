"""webhook.core.frozen.one_call_init: the same construction as the dataclass's own __init__."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest

from webhook.core.findings import Finding, Mode, ObjectRef, Severity
from webhook.core.frozen import one_call_init
from webhook.engine.context import Context


@dataclass(frozen=True, slots=True)
class _Plain:
    a: int
    b: str = "b"
    c: dict[str, int] = field(default_factory=dict)
    d: tuple[int, ...] = ()


@one_call_init
@dataclass(frozen=True, slots=True)
class _Fast:
    a: int
    b: str = "b"
    c: dict[str, int] = field(default_factory=dict)
    d: tuple[int, ...] = ()


def _fields(o: Any) -> dict[str, Any]:
    return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1,), {}), ((1, "x"), {}), ((1,), {"d": (2,)}), ((), {"a": 3, "c": {"k": 1}, "b": "y"})],
)
def test_the_values_are_those_the_generated_init_sets(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    assert _fields(_Fast(*args, **kwargs)) == _fields(_Plain(*args, **kwargs))


def test_parameters_and_errors_are_the_generated_inits() -> None:
    assert list(inspect.signature(_Fast).parameters) == ["a", "b", "c", "d"]
    for bad in [lambda: _Fast(), lambda: _Fast(1, "b", {}, (), 5), lambda: _Fast(1, e=2)]:  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            bad()
    with pytest.raises(TypeError):
        _Plain()  # type: ignore[call-arg]


def test_a_default_factory_runs_per_instance() -> None:
    one, two = _Fast(1), _Fast(1)
    assert one.c == {} and one.c is not two.c


def test_still_frozen_hashable_equal_and_replaceable() -> None:
    x = _Fast(1, "b", {}, (1,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.a = 2  # type: ignore[misc]
    y = dataclasses.replace(x, a=2)
    assert (y.a, y.b, y.d) == (2, "b", (1,))
    assert _Fast(1, d=(1,)) == _Fast(1, d=(1,)) and _Fast(1) != _Fast(2)
    ref = ObjectRef("v1", "Pod", "ns", "p")
    assert hash(ref) == hash(ObjectRef("v1", "Pod", "ns", "p"))
    assert repr(ref) == "ObjectRef(api_version='v1', kind='Pod', namespace='ns', name='p')"


def test_the_engines_classes_build_as_before() -> None:
    f = Finding("r", Severity.ERROR, Mode.ENFORCE, ObjectRef("v1", "Pod", None, "p"), "m")
    assert (f.fix, f.file, f.line, f.patch, f.generated) == ("", None, None, None, ())
    ctx = Context(admission=True)
    assert ctx.namespace_labels == {} and ctx.usage is None and ctx.admission
    assert ctx.today is not None and ctx.related == () and ctx.looked_up == {}


def test_refuses_classes_it_cannot_build_alike() -> None:
    @dataclass(frozen=True, slots=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class Hidden:
        a: int
        b: int = field(init=False, default=0)

    @dataclass(slots=True)
    class Mutable:
        a: int

    @dataclass(frozen=True)
    class NoSlots:
        a: int

    for cls in (Post, Hidden, Mutable, NoSlots):
        with pytest.raises(TypeError, match="one_call_init"):
            one_call_init(cls)
