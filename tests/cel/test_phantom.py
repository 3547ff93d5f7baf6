"""Unknown domains read as empty maps on lookup only, whatever the key's spelling (webhook/cel/phantom.py)."""

from __future__ import annotations

import pytest

from webhook.cel.env import CelEvalError, compile_selector
from webhook.cel.phantom import collapse_parentheses, matching_close
from webhook.dra.device import Device

DEVICE = Device(
    driver="gpu.nvidia.com", pool="p", name="d", node="n",
    attributes={"gpu.nvidia.com": {"type": "gpu"}, "a]b": {"x": 1}, "it's": {"x": 2}, "\\": {"x": 3}},
    capacity={"gpu.nvidia.com": {"memory": "1Gi"}},
)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("'other.example.com' in device.attributes", False),
        ("size(device.attributes['other.example.com']) == 0", True),
        ("size(device.attributes) == 4", True),
        ("device.attributes.exists(d, d == 'other.example.com')", False),
        ("has(device.attributes.anything) && has(device.capacity.nothing)", True),
        ("device.attributes['a]b'].x == 1", True),
        ("device.attributes[\"it's\"].x == 2", True),
        ("device.attributes['\\\\'].x == 3", True),
        ("device.attributes[r'a]b'].x == 1 && device.attributes[R\"it's\"].x == 2", True),
        ("device.attributes[br'a]b'.size() == 3 ? 'a]b' : 'no'].x == 1", True),
        ("device.attributes['''a]b'''].x == 1 && device.attributes[\"\"\"it's\"\"\"].x == 2", True),
        ("device.attributes[device.attributes['gpu.nvidia.com'].type + '.example.com'].size() == 0", True),
        ("device.attributes [ 'other' ] . size() == 0 && device.capacity . other . size() == 0", True),
        ("'(' + ']' == '(]' && device.attributes['x)]'].size() == 0", True),
    ],
)
def test_lookup_of_any_key_spelling(expression: str, expected: bool) -> None:
    assert compile_selector(expression).evaluate(DEVICE) is expected


def test_unknown_name_in_known_domain_still_fails() -> None:
    with pytest.raises(CelEvalError, match="no such key"):
        compile_selector("device.attributes['gpu.nvidia.com'].nope == 1").evaluate(DEVICE)


def test_bracket_matching_skips_strings() -> None:
    text = "x['a]' + \"]\" + r'\\'][0]"
    assert matching_close(text, 1) == text.index("][0]")
    assert collapse_parentheses("((('))')))") == "('))')"
    assert collapse_parentheses("f((x)) && ((y))") == "f((x)) && (y)"
