"""Plain text for terminals: findings grouped by file, one summary line at the end."""

from __future__ import annotations

from itertools import groupby

from ...core.findings import Mode
from . import ReviewResult, neutralise_commands, terminal_safe

_COLOURS = {Mode.ENFORCE: "\033[31m", Mode.WARN: "\033[33m", Mode.AUDIT: "\033[36m"}
_BOLD = "\033[1m"
_DIM = "\033[2m"
_RESET = "\033[0m"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary_line(result: ReviewResult) -> str:
    s = result.report.summary()
    reviewed = f"{_plural(s['objects'], 'object')} in {_plural(len(set(result.files)), 'file')}"
    if result.ignored:
        reviewed += f" ({result.ignored} ignored: kinds no rule reads)"
    counts = (
        f"{_plural(s['errors'], 'error')} (enforce), {_plural(s['warnings'], 'warning')}, "
        f"{_plural(s['audits'], 'audit finding')}"
    )
    return f"{reviewed}: {counts}"


def render(result: ReviewResult, *, color: bool = False) -> str:
    def paint(text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if color else text

    out: list[str] = []
    findings = result.sorted_findings()
    for raw_file, group in groupby(findings, key=lambda f: f.file or "<input>"):
        # Names and messages come from the reviewed files: controls are written out, and no line
        # may read as a CI workflow command (see `neutralise_commands`, applied last).
        file = terminal_safe(raw_file)
        out.append(paint(file, _BOLD))
        for f in group:
            where = f"{file}:{f.line}" if f.line else file
            mode = paint(f.mode.value, _COLOURS[f.mode])
            out.append(f"  {where}  {mode}  {terminal_safe(f.rule)}  {terminal_safe(str(f.object))}")
            for line in terminal_safe(f.message, newlines=True).split("\n"):
                out.append(f"      {line}")
            if f.fix:
                fix_lines = terminal_safe(f.fix, newlines=True).split("\n")
                out.append(paint(f"      fix: {fix_lines[0]}", _DIM))
                out.extend(paint(f"           {line}", _DIM) for line in fix_lines[1:])
        out.append("")
    if result.kubernetes_version:
        out.append(paint(f"CEL selectors judged for Kubernetes {result.kubernetes_version} "
                         "(--kubernetes-version)", _DIM))
    out.append(summary_line(result))
    return neutralise_commands("\n".join(out)) + "\n"
