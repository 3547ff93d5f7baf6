"""Markdown for a pull-request comment: counts, then a table of findings, enforce first."""

from __future__ import annotations

from webhook.core.findings import Finding, Mode
from webhook.review.formats import MODE_ORDER, ReviewResult, finding_sort_key
from webhook.review.formats.text import summary_line

# GitHub rejects comments over 65,536 characters; stop listing well before that.
MAX_ROWS = 200
_ICON = {Mode.ENFORCE: "❌ enforce", Mode.WARN: "⚠️ warn", Mode.AUDIT: "ℹ️ audit"}


def cell(text: str) -> str:
    """Text safe inside a table cell: pipes escaped, newlines as <br>, no raw HTML.

    `<` and `&` are escaped outside code spans only: inside backticks GitHub shows entities
    literally, and HTML is inert there anyway.
    """
    parts = text.replace("\r", "").split("`")
    if len(parts) % 2 == 0:  # an unmatched backtick: treat the whole text as prose
        parts = [text.replace("`", "'")]
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    joined = "`".join(parts)
    return joined.replace("|", "\\|").replace("\n", "<br>")


def _location(f: Finding) -> str:
    if not f.file:
        return ""
    return f"`{cell(f.file)}:{f.line}`" if f.line else f"`{cell(f.file)}`"


def render(result: ReviewResult) -> str:
    s = result.report.summary()
    out = [f"### {result.title}", ""]
    verdict = "❌ **denied**" if s["errors"] else ("⚠️ passes with warnings" if s["warnings"] else "✅ passes")
    out.append(f"{verdict} — {summary_line(result)}")
    out.append("")
    out.append("| Enforce | Warn | Audit | Objects | Ignored |")
    out.append("|---:|---:|---:|---:|---:|")
    out.append(f"| {s['errors']} | {s['warnings']} | {s['audits']} | {s['objects']} | {result.ignored} |")
    findings = sorted(result.report.findings, key=lambda f: (MODE_ORDER[f.mode], *finding_sort_key(f)))
    if findings:
        out += ["", "| Mode | Location | Rule | Object | Message | Fix |", "|---|---|---|---|---|---|"]
        for f in findings[:MAX_ROWS]:
            out.append(
                f"| {_ICON[f.mode]} | {_location(f)} | `{cell(f.rule)}` | {cell(str(f.object))} "
                f"| {cell(f.message)} | {cell(f.fix)} |"
            )
        if len(findings) > MAX_ROWS:
            out.append("")
            out.append(f"_…and {len(findings) - MAX_ROWS} more; run `draguard review` locally for all._")
    return "\n".join(out) + "\n"
