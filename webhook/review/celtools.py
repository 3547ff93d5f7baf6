"""`draguard lint-cel` and `draguard explain`: print what the CEL linter and the engine's explainer
found. All the analysis lives in `webhook.cel` and `webhook.engine.explain`; this only formats."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from ..core.findings import Severity
from ..dra.device import Device
from .inputs import InputError, read_paths
from .pipeline import ReviewError, load_inventory_file

PRODUCT_ATTRIBUTE = "productName"


def product_of(device: Device) -> str:
    """`NVIDIA A100 80GB PCIe` (plus ` MIG 3g.20gb` for a MIG device), or the driver when unnamed."""
    attrs = device.attributes.get(device.driver, {})
    name = attrs.get(PRODUCT_ATTRIBUTE)
    label = str(name) if name is not None else f"{device.driver} device"
    profile = attrs.get("profile")
    if profile is not None:
        label += f" MIG {profile}"
    return label


def group_by_product(devices: Sequence[Device]) -> list[tuple[str, int, dict[str, int]]]:
    """(product, count, {node: count}) sorted by count then name."""
    per: dict[str, Counter[str]] = defaultdict(Counter)
    for d in devices:
        per[product_of(d)][d.node or "(network-attached)"] += 1
    rows = [(p, sum(nodes.values()), dict(sorted(nodes.items()))) for p, nodes in per.items()]
    return sorted(rows, key=lambda r: (-r[1], r[0]))


def lint(expression: str, *, inventory: str | None, driver: str | None) -> tuple[str, int]:
    """Text report and exit code (1 when an error-severity issue is found)."""
    from ..cel.lint import lint_selector

    inv = load_inventory_file(inventory) if inventory else None
    devices = list(inv.devices) if inv is not None else None
    issues = lint_selector(expression, devices=devices, driver=driver)
    out = [f"selector: {expression}"]
    if not issues:
        out.append("ok: compiles, type-checks and reads only published attributes")
    for issue in issues:
        where = f"{issue.line}:{issue.column}  " if issue.line is not None else ""
        out.append(f"  {where}{issue.severity.value}  {issue.check}  {issue.message}")
        if issue.fix:
            out.append(f"      fix: {issue.fix}")
    compiles = not any(i.check in ("cel/syntax", "cel/type") for i in issues)
    if inv is not None and compiles:
        out.extend(_match_report(expression, list(inv.devices)))
    code = 1 if any(i.severity is Severity.ERROR for i in issues) else 0
    return "\n".join(out) + "\n", code


def _match_report(expression: str, devices: list[Device]) -> list[str]:
    from ..cel.match import match_devices

    try:
        result = match_devices([expression], devices)
    except Exception as exc:  # the linter already reported why; do not fail the command on it
        return [f"matching skipped: {exc}"]
    out = [f"matches {len(result.matched)} of {len(devices)} devices in the inventory"]
    for product, n, nodes in group_by_product(result.matched):
        node_text = ", ".join(f"{node} x{c}" for node, c in list(nodes.items())[:6])
        if len(nodes) > 6:
            node_text += f", ... {len(nodes) - 6} more nodes"
        out.append(f"  {n:>6}  {product}  ({node_text})")
    for err in result.errors[:5]:
        out.append(f"  evaluation error on {err.devices} device(s) like {err.device.name}: {err.message}")
    return out


# --------------------------------------------------------------------------- explain


def explain_paths(paths: Sequence[str], *, inventory: str | None, namespace: str, fmt: str) -> str:
    """The engine's explanations for every claim and workload request in `paths`."""
    return explain_report(paths, inventory=inventory, namespace=namespace, fmt=fmt)[0]


def explain_report(
    paths: Sequence[str], *, inventory: str | None, namespace: str, fmt: str
) -> tuple[str, bool]:
    """(the explanations as text or JSON, whether some request CANNOT be allocated)."""
    from ..engine.explain import explain

    inv = load_inventory_file(inventory)
    try:
        inputs = read_paths(paths, exclude=[Path(inventory)] if inventory else ())
    except InputError as exc:
        raise ReviewError(str(exc)) from None
    explanations = explain(inputs.objects, inv, namespace)
    blocked = any(e.satisfiable is False for e in explanations)
    if fmt == "json":
        return json.dumps([e.to_json() for e in explanations], indent=2, ensure_ascii=False) + "\n", blocked
    if not explanations:
        return "no claims, claim templates or workloads with resource claims in the input\n", False
    blocks = [e.render() for e in explanations]
    if inv.is_empty:
        blocks.append("(no --inventory: device matches were not checked)")
    return "\n\n".join(blocks) + "\n", blocked
