"""GitHub Actions workflow commands: one `::error`/`::warning`/`::notice` annotation per finding."""

from __future__ import annotations

from webhook.core.findings import Mode
from webhook.review.formats import ReviewResult
from webhook.review.formats.text import summary_line

_COMMAND = {Mode.ENFORCE: "error", Mode.WARN: "warning", Mode.AUDIT: "notice"}


def escape_data(value: str) -> str:
    """Escape a command's message (the part after `::`)."""
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(value: str) -> str:
    """Escape a property value (`file=`, `title=`): also `:` and `,`, which delimit properties."""
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


def render(result: ReviewResult) -> str:
    out: list[str] = []
    for f in result.sorted_findings():
        props: list[str] = []
        if f.file and not f.file.startswith("<"):
            props.append(f"file={escape_property(f.file)}")
            if f.line:
                props.append(f"line={f.line}")
        props.append(f"title={escape_property(f'{f.rule} ({f.mode.value})')}")
        message = f"{f.object}: {f.message}"
        if f.fix:
            message += f"\nfix: {f.fix}"
        out.append(f"::{_COMMAND[f.mode]} {','.join(props)}::{escape_data(message)}")
    out.append(summary_line(result))
    return "\n".join(out) + "\n"
