"""GitHub Actions workflow commands: one `::error`/`::warning`/`::notice` annotation per finding."""

from __future__ import annotations

from ...core.findings import Mode
from . import ReviewResult, neutralise_commands, terminal_safe
from .text import summary_line

_COMMAND = {Mode.ENFORCE: "error", Mode.WARN: "warning", Mode.AUDIT: "notice"}


def escape_data(value: str) -> str:
    """Escape a command's message (the part after `::`): `%`, CR and LF as the runner decodes them,
    so a name from the reviewed tree can neither end the annotation nor start a command of its own
    (`::add-mask::`, `::stop-commands::`); other controls are written out."""
    escaped = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return terminal_safe(escaped)


def escape_property(value: str) -> str:
    """Escape a property value (`file=`, `title=`): also `:` and `,`, which delimit properties."""
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


ANNOTATIONS_PER_KIND = 10
"""GitHub shows at most 10 error, 10 warning and 10 notice annotations per step (50 per job) and
drops the rest silently (actions/toolkit docs/problem-matchers.md)."""


def render(result: ReviewResult) -> str:
    findings = result.sorted_findings()
    by_kind: dict[Mode, list[int]] = {}
    for i, f in enumerate(findings):
        by_kind.setdefault(f.mode, []).append(i)
    # Over the limit: the first 9 of a kind are annotations and the 10th says how many more there
    # are; every finding is still printed to the log below, so none is lost.
    annotated: set[int] = set()
    overflow: dict[Mode, int] = {}
    for mode, idx in by_kind.items():
        keep = idx if len(idx) <= ANNOTATIONS_PER_KIND else idx[: ANNOTATIONS_PER_KIND - 1]
        annotated.update(keep)
        if len(idx) > len(keep):
            overflow[mode] = len(idx) - len(keep)
    out: list[str] = []
    rest: list[str] = []
    for i, f in enumerate(findings):
        where = result.repo_path(f.file) if f.file else None
        message = f"{f.object}: {f.message}"
        if f.fix:
            message += f"\nfix: {f.fix}"
        if i not in annotated:
            loc = f"{where}:{f.line}: " if where and f.line else f"{where}: " if where else ""
            line = terminal_safe(f"{loc}{f.mode.value}: [{f.rule}] {' '.join(message.split())}")
            rest.append(neutralise_commands(line))
            continue
        props: list[str] = []
        if where:
            props.append(f"file={escape_property(where)}")
            if f.line:
                props.append(f"line={f.line}")
        props.append(f"title={escape_property(f'{f.rule} ({f.mode.value})')}")
        out.append(f"::{_COMMAND[f.mode]} {','.join(props)}::{escape_data(message)}")
    for mode, n in overflow.items():
        kind = {Mode.ENFORCE: "errors", Mode.WARN: "warnings", Mode.AUDIT: "notices"}[mode]
        out.append(
            f"::{_COMMAND[mode]} title={escape_property('draguard: more findings')}::"
            + escape_data(f"{n} more {kind} than GitHub annotates per step; this step's log lists them all")
        )
    if rest:
        out.append(f"::group::draguard: {len(rest)} findings not annotated (GitHub's per-step limit)")
        out.extend(rest)
        out.append("::endgroup::")
    out.append(summary_line(result))
    return "\n".join(out) + "\n"
