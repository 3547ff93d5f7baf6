"""Renderings of an assessment (the JSON document `analyze.Assessor.result` returns): text for a
terminal, Markdown for a migration ticket, JSON for tools, and one self-contained HTML page with
inline SVG charts (no script, no external resource). Every cluster-supplied string is escaped."""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .checklist import SECTIONS

FORMATS = ("text", "markdown", "json", "html")
# Image names, messages and labels are free text: no terminal control sequence reaches the screen.
_CONTROL = {c: "?" for c in [*range(0x20), *range(0x7F, 0xA0)] if c != 0x0A}
_MARK = {"pass": "PASS", "fail": "FAIL", "unknown": "????"}


def _owner(w: Mapping[str, Any]) -> str:
    o = w["owner"]
    return f"{o['kind']}/{o['namespace']}/{o['name']}" if o.get("namespace") else f"{o['kind']}/{o['name']}"


def _gpus(w: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in w.get("legacyGpus", {}).items()) or "-"


def _migration(w: Mapping[str, Any]) -> str:
    m = w.get("migration") or {}
    parts = [str(m.get("status", "-"))]
    tmpl = ", ".join(f"{t['name']} ({t['count']} x {t['deviceClass']})" for t in m.get("templates") or [])
    if tmpl:
        parts.append(f"template {tmpl}")
    q = m.get("quota")
    if q:
        devs = ", ".join(f"{k}: {v}" for k, v in q["devices"].items()) or "nothing"
        parts.append(f"charges {devs} ({q['gpuEquivalents']:g} GPU-equivalents, {q['replicas']} replicas)")
    for key in ("tier", "quota"):
        for f in (m.get(key) or {}).get("findings") or []:
            parts.append(f"{f['rule']}: {f['message']}")
    if m.get("unmapped"):
        parts.append("unmapped: " + "; ".join(m["unmapped"]))
    return "; ".join(parts)


def _summary_lines(a: Mapping[str, Any]) -> list[tuple[str, str]]:
    srv = a.get("server") or {}
    pods = a.get("pods") or {}
    claims = a.get("claims") or {}
    use = a.get("gpuUse") or {}
    return [
        ("Kubernetes", str(srv.get("gitVersion", "?"))),
        ("resource.k8s.io served", ", ".join(a["dra"]["served"]) or "none"),
        ("Nodes", f"{a.get('nodeCount', 0)} ({len(a.get('nodes') or [])} advertise nvidia.com/gpu)"),
        ("DRA devices", str(sum(a.get("devicesByModel", {}).values()))),
        ("Pods", f"{pods.get('total', 0)} ({pods.get('legacy', 0)} legacy GPU, {pods.get('dra', 0)} DRA)"),
        ("ResourceClaims", f"{claims.get('total', 0)} ({claims.get('allocated', 0)} allocated, "
                           f"{claims.get('pending', 0)} pending)"),
        ("GPUs in use", f"{use.get('legacy', 0)} via the device plugin, {use.get('dra', 0)} via DRA"),
        ("Legacy workloads", str(a.get("legacyWorkloadCount", 0))),
        ("Would be denied today", str(a.get("wouldDenyCount", 0))),
    ]  # fmt: skip


def counts(a: Mapping[str, Any]) -> dict[str, int]:
    out = {"pass": 0, "fail": 0, "unknown": 0}
    for item in a.get("checklist") or []:
        out[item["status"]] = out.get(item["status"], 0) + 1
    return out


# -- text ------------------------------------------------------------------------------------------


def render_text(a: Mapping[str, Any]) -> str:
    out = ["draguard assess", ""]
    out += [f"  {k + ':':<24}{v}" for k, v in _summary_lines(a)]
    signals = (a.get("dra") or {}).get("signals") or []
    if signals:
        out += ["", "DRA features in use"] + [f"  {x}" for x in signals]
    out += ["", "DRA drivers"]
    for d in a.get("drivers") or []:
        out.append(f"  {d['driver']}: {d['devices']} devices, {d['slices']} slices, {len(d['byNode'])} nodes")
        out += [f"    {m}: {n}" for m, n in d["byModel"].items()]
    if not a.get("drivers"):
        out.append("  none")
    if a.get("daemonSets"):
        out += ["", "GPU DaemonSets"]
        out += [
            f"  {d['kind']}: {d['namespace']}/{d['name']} ready {d['ready']}/{d['desired']}"
            for d in a["daemonSets"]
        ]
    if a.get("nodes"):
        out += ["", "Nodes with device-plugin GPUs (capacity / allocatable)"]
        for n in a["nodes"]:
            res = sorted(set(n["capacity"]) | set(n["allocatable"]))
            text = ", ".join(f"{r} {n['capacity'].get(r, '-')}/{n['allocatable'].get(r, '-')}" for r in res)
            out.append(f"  {n['name']} ({n['model']}): {text}")
    out += ["", "DeviceClasses (live devices selected)"]
    for c in a.get("deviceClasses") or []:
        n = "error" if c.get("devices") is None else str(c["devices"])
        out.append(
            f"  {c['name']}: {n}" + (f" ({c.get('allocated', 0)} allocated)" if c.get("devices") else "")
        )
        out += [f"    {f['severity']}: {f['rule']}: {f['message']}" for f in c.get("lint") or []]
    if not a.get("deviceClasses"):
        out.append("  none")
    out += ["", f"Legacy GPU workloads ({a.get('legacyWorkloadCount', 0)})"]
    for w in a.get("legacyWorkloads") or []:
        out.append(f"  {_owner(w)}: {w['pods']} pods, {_gpus(w)}")
        out.append(f"    migration: {_migration(w)}")
    out += ["", f"Running workloads today's policies would deny ({a.get('wouldDenyCount', 0)})"]
    for w in a.get("wouldDeny") or []:
        out.append(f"  {_owner(w)} ({w['pods']} pods)")
        out += [f"    {f['rule']}: {f['message']}" for f in w["deny"]]
    c = counts(a)
    out += ["", f"Production checklist: {c['pass']} pass, {c['fail']} fail, {c['unknown']} unknown"]
    for key, title in SECTIONS:
        items = [i for i in a.get("checklist") or [] if i["section"] == key]
        if items:
            out.append(f"  {title}")
            out += [f"    [{_MARK[i['status']]}] {i['title']}: {i['evidence']}" for i in items]
    for what, why in (a.get("unreadable") or {}).items():
        out.append(f"note: {what} not read: {why}")
    return "\n".join(out).translate(_CONTROL) + "\n"


# -- markdown --------------------------------------------------------------------------------------


def _md(text: Any) -> str:
    """Table-cell safe: names come from the cluster and may hold pipes or markup."""
    s = str(text).replace("\n", " ").translate(_CONTROL).replace("\\", "\\\\").replace("|", "\\|")
    for ch in "`*_<>[]":
        s = s.replace(ch, "\\" + ch)
    return s


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_md(c) for c in r) + " |" for r in rows]
    return [*out, ""]


def render_markdown(a: Mapping[str, Any]) -> str:
    c = counts(a)
    out = ["# GPU assessment (draguard assess)", ""]
    out += _table(["", ""], _summary_lines(a))
    out += ["## Production checklist", "", f"{c['pass']} pass, {c['fail']} fail, {c['unknown']} unknown.", ""]
    for key, title in SECTIONS:
        items = [i for i in a.get("checklist") or [] if i["section"] == key]
        if items:
            out += [f"### {title}", ""]
            out += [f"- [{'x' if i['status'] == 'pass' else ' '}] **{_md(i['title'])}** ({i['status']}): "
                    f"{_md(i['evidence'])}" for i in items]  # fmt: skip
            out.append("")
    out += ["## Legacy GPU workloads", ""]
    out += _table(
        ["Workload", "Pods", "GPUs held", "Migration"],
        [[_owner(w), w["pods"], _gpus(w), _migration(w)] for w in a.get("legacyWorkloads") or []],
    )
    out += ["## Running workloads today's policies would deny", ""]
    out += _table(
        ["Workload", "Pods", "Rule", "Why"],
        [
            [_owner(w), w["pods"], f["rule"], f["message"]]
            for w in a.get("wouldDeny") or []
            for f in w["deny"]
        ],
    )
    signals = (a.get("dra") or {}).get("signals") or []
    if signals:
        out += ["## DRA features in use", ""] + [f"- {_md(x)}" for x in signals] + [""]
    out += ["## DRA drivers and devices", ""]
    out += _table(
        ["Driver", "Model", "Devices"],
        [[d["driver"], m, n] for d in a.get("drivers") or [] for m, n in d["byModel"].items()],
    )
    out += ["## DeviceClasses", ""]
    out += _table(
        ["DeviceClass", "Devices", "Allocated", "Lint"],
        [[c["name"], "error" if c.get("devices") is None else c["devices"], c.get("allocated", 0),
          "; ".join(f"{f['severity']}: {f['message']}" for f in c.get("lint") or []) or "-"]
         for c in a.get("deviceClasses") or []],
    )  # fmt: skip
    if a.get("nodes"):
        out += ["## Nodes with device-plugin GPUs", ""]
        out += _table(
            ["Node", "Model", "Capacity", "Allocatable"],
            [
                [n["name"], n["model"], json.dumps(n["capacity"]), json.dumps(n["allocatable"])]
                for n in a["nodes"]
            ],
        )
    return "\n".join(out)


# -- json ------------------------------------------------------------------------------------------


def render_json(a: Mapping[str, Any]) -> str:
    return json.dumps({"apiVersion": "draguard.io/v1alpha1", "kind": "Assessment", **a}, indent=2) + "\n"


# -- html ------------------------------------------------------------------------------------------


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def bar_chart(title: str, data: Mapping[str, int], color: str = "#3b7dd8", width: int = 640) -> str:
    """A horizontal bar chart as inline SVG; labels are escaped text nodes."""
    items = list(data.items())
    if not items:
        return f"<figure><figcaption>{_e(title)}</figcaption><p>none</p></figure>"
    top = max(v for _, v in items) or 1
    label_w, bar_h, gap = 260, 22, 6
    height = len(items) * (bar_h + gap) + gap
    rows = []
    for i, (label, value) in enumerate(items):
        y = gap + i * (bar_h + gap)
        w = max(1, round((width - label_w - 60) * value / top))
        rows.append(
            f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end">{_e(label[:40])}</text>'
            f'<rect x="{label_w}" y="{y}" width="{w}" height="{bar_h}" fill="{color}"><title>{_e(label)}: '
            f'{value}</title></rect><text x="{label_w + w + 6}" y="{y + 15}">{value}</text>'
        )
    return (
        f'<figure><figcaption>{_e(title)}</figcaption><svg xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" role="img" aria-label="{_e(title)}" font-size="12" '
        f'font-family="sans-serif">{"".join(rows)}</svg></figure>'
    )


def _html_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    if not rows:
        return "<p>none</p>"
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


_CSS = """body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}.pass{color:#17803d}.fail{color:#c0262d}
.unknown{color:#8a6d00}figure{margin:1em 0}figcaption{font-weight:bold;margin-bottom:.3em}"""


def render_html(a: Mapping[str, Any]) -> str:
    c = counts(a)
    use = a.get("gpuUse") or {}
    charts = [
        bar_chart("DRA devices by model", a.get("devicesByModel") or {}),
        bar_chart("Device-plugin GPUs (node capacity) by model", a.get("pluginGpusByModel") or {}, "#d88a3b"),
        bar_chart(
            "GPUs in use: device plugin vs DRA",
            {
                "device plugin (nvidia.com/gpu)": int(use.get("legacy", 0)),
                "DRA (allocated devices)": int(use.get("dra", 0)),
            },
            "#6a4fb3",
        ),
    ]
    check_rows = "".join(
        f"<tr><td>{_e(title)}</td><td>{_e(i['title'])}</td>"
        f'<td class="{_e(i["status"])}">{_e(i["status"])}</td>'
        f"<td>{_e(i['evidence'])}</td></tr>"
        for key, title in SECTIONS
        for i in a.get("checklist") or []
        if i["section"] == key
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>draguard assess</title>',
        # No script and nothing fetched: the report is safe to open and to attach to a ticket.
        '<meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<style>{_CSS}</style></head><body>",
        "<h1>GPU assessment</h1>",
        _html_table(["", ""], _summary_lines(a)),
        "<h2>GPUs</h2>",
        *charts,
        f"<h2>Production checklist</h2><p>{c['pass']} pass, {c['fail']} fail, {c['unknown']} unknown</p>",
        "<table><thead><tr><th>Section</th><th>Item</th><th>Status</th><th>Evidence</th></tr></thead>"
        f"<tbody>{check_rows}</tbody></table>",
        f"<h2>Legacy GPU workloads ({a.get('legacyWorkloadCount', 0)})</h2>",
        _html_table(
            ["Workload", "Pods", "GPUs held", "Migration"],
            [[_owner(w), w["pods"], _gpus(w), _migration(w)] for w in a.get("legacyWorkloads") or []],
        ),
        f"<h2>Running workloads today's policies would deny ({a.get('wouldDenyCount', 0)})</h2>",
        _html_table(
            ["Workload", "Pods", "Rule", "Why"],
            [
                [_owner(w), w["pods"], f["rule"], f["message"]]
                for w in a.get("wouldDeny") or []
                for f in w["deny"]
            ],
        ),
        "<h2>DRA drivers</h2>",
        _html_table(
            ["Driver", "Node", "Devices"],
            [[d["driver"], n, k] for d in a.get("drivers") or [] for n, k in d["byNode"].items()],
        ),
        "<h2>DeviceClasses</h2>",
        _html_table(
            ["DeviceClass", "Devices", "Allocated", "Lint"],
            [
                [
                    c["name"],
                    "error" if c.get("devices") is None else c["devices"],
                    c.get("allocated", 0),
                    "; ".join(f"{f['severity']}: {f['message']}" for f in c.get("lint") or []) or "-",
                ]
                for c in a.get("deviceClasses") or []
            ],
        ),
        "<h2>GPU DaemonSets</h2>",
        _html_table(
            ["Kind", "DaemonSet", "Ready"],
            [
                [d["kind"], f"{d['namespace']}/{d['name']}", f"{d['ready']}/{d['desired']}"]
                for d in a.get("daemonSets") or []
            ],
        ),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


RENDERERS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "text": render_text,
    "markdown": render_markdown,
    "json": render_json,
    "html": render_html,
}
