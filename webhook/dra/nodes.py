"""Which nodes a device is reachable from: its node, all nodes, or a core/v1 NodeSelector.

Without the Node objects a selector can still be judged for `kubernetes.io/hostname` and the
`metadata.name` field; any other label makes the answer unknown (None), never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HOSTNAME = "kubernetes.io/hostname"


def _requirement(req: object, value_of: Mapping[str, str] | None, name: str, field: bool) -> bool | None:
    if not isinstance(req, Mapping):
        return False
    key = req.get("key")
    op = req.get("operator")
    raw_values = req.get("values")
    values = [v for v in raw_values if isinstance(v, str)] if isinstance(raw_values, list) else []
    if not isinstance(key, str):
        return False
    if field:
        if key != "metadata.name":
            return False
        current: str | None = name
    elif value_of is not None:
        current = value_of.get(key)
    elif key == HOSTNAME:
        current = name
    else:
        return None
    if op == "In":
        return current is not None and current in values
    if op == "NotIn":
        return current is None or current not in values
    if op == "Exists":
        return current is not None
    if op == "DoesNotExist":
        return current is None
    if op in ("Gt", "Lt") and len(values) == 1:
        try:
            have, want = int(current or ""), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def selector_matches(selector: Mapping[str, Any], name: str, labels: Mapping[str, str] | None) -> bool | None:
    """Whether node `name` (with `labels`, None when unknown) is selected; None when it cannot tell."""
    terms = selector.get("nodeSelectorTerms")
    unknown = False
    for term in terms if isinstance(terms, list) else ():
        if not isinstance(term, Mapping):
            continue
        exprs = term.get("matchExpressions")
        fields = term.get("matchFields")
        reqs = [(r, False) for r in (exprs if isinstance(exprs, list) else ())]
        reqs += [(r, True) for r in (fields if isinstance(fields, list) else ())]
        if not reqs:
            continue  # an empty term selects nothing
        results = [_requirement(r, labels, name, f) for r, f in reqs]
        if all(r is True for r in results):
            return True
        if not any(r is False for r in results):
            unknown = True
    return None if unknown else False


def named_nodes(selector: Mapping[str, Any]) -> set[str]:
    """Node names a selector spells out (hostname label or metadata.name with In)."""
    out: set[str] = set()
    terms = selector.get("nodeSelectorTerms")
    for term in terms if isinstance(terms, list) else ():
        if not isinstance(term, Mapping):
            continue
        for part, key in (("matchExpressions", HOSTNAME), ("matchFields", "metadata.name")):
            reqs = term.get(part)
            for r in reqs if isinstance(reqs, list) else ():
                if isinstance(r, Mapping) and r.get("key") == key and r.get("operator") == "In":
                    vals = r.get("values")
                    out.update(v for v in (vals if isinstance(vals, list) else ()) if isinstance(v, str))
    return out
