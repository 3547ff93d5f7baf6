"""Markdown for a pull-request comment: counts, then a table of findings, enforce first."""

from __future__ import annotations

import re

from ...core.findings import Finding, Mode
from . import MODE_ORDER, ReviewResult, finding_sort_key, terminal_safe
from .text import summary_line

# GitHub rejects comments over 65,536 characters; stop listing well before that.
MAX_ROWS = 200
_ICON = {Mode.ENFORCE: "❌ enforce", Mode.WARN: "⚠️ warn", Mode.AUDIT: "ℹ️ audit"}


def _prose(text: str) -> str:
    """Text outside code spans: nothing in it can start HTML, an entity, a link, a code span or a
    backslash escape (a `\\` before a backtick would turn it into a literal one and shift every
    code span after it)."""
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        .replace("\\", "&#92;").replace("`", "&#96;").replace("](", "]&#40;")
    )  # fmt: skip


def _table(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def cell(text: str) -> str:
    """Text safe inside a table cell: no raw HTML, pipes escaped, newlines as <br>.

    Code spans are found as CommonMark finds them (a run of N backticks up to the next run of
    exactly N) and kept, since messages quote names in them and HTML is inert there; everything
    else is escaped as prose. A name with backticks of its own therefore cannot close a span and
    leave what follows it to be read as HTML.
    """
    text = terminal_safe(text.replace("\r", ""), newlines=True)
    out: list[str] = []
    i = 0
    while i < len(text):
        tick = text.find("`", i)
        if tick < 0:
            out.append(_prose(text[i:]))
            break
        out.append(_prose(text[i:tick]))
        run = tick
        while run < len(text) and text[run] == "`":
            run += 1
        fence = text[tick:run]
        close = run
        while True:
            close = text.find(fence, close)
            if close < 0 or not text.startswith("`", close + len(fence)):
                break
            close += len(fence)
            while close < len(text) and text[close] == "`":
                close += 1
        if close < 0:  # no closing run: the backticks are literal text
            out.append(_prose(fence))
            i = run
            continue
        # A newline inside a code span is a space in CommonMark; `<br>` would be shown literally.
        out.append(fence + text[run:close].replace("\n", " ") + fence)
        i = close + len(fence)
    return _table("".join(out))


def code(text: str) -> str:
    """`text` as one code span whatever it holds: the fence is longer than any run of backticks
    inside, and padded with spaces when the text starts or ends with a backtick."""
    text = terminal_safe(text.replace("\r", "").replace("\n", " "))
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return _table(f"{fence}{pad}{text}{pad}{fence}")


def _location(f: Finding) -> str:
    if not f.file:
        return ""
    return code(f"{f.file}:{f.line}" if f.line else f.file)


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
                f"| {_ICON[f.mode]} | {_location(f)} | {code(f.rule)} | {cell(str(f.object))} "
                f"| {cell(f.message)} | {cell(f.fix)} |"
            )
        if len(findings) > MAX_ROWS:
            out.append("")
            out.append(f"_…and {len(findings) - MAX_ROWS} more; run `draguard review` locally for all._")
    return "\n".join(out) + "\n"
