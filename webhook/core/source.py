"""One Kubernetes object and where it came from: the unit every reader produces and every rule reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .frozen import one_call_init


@one_call_init
@dataclass(frozen=True, slots=True)
class SourceObject:
    """One Kubernetes object and where it came from (a file in review, a request in admission)."""

    obj: Mapping[str, Any]
    file: str | None = None
    line: int | None = None  # line of the document's first key, 1-based
    doc_index: int = 0
    # JSON pointer ("/spec/devices/requests/0") -> line, where the reader knows it.
    lines: Mapping[str, int] = field(default_factory=dict)

    def line_of(self, pointer: str) -> int | None:
        """Best known line for a JSON pointer: the pointer itself or its nearest parent."""
        if not self.lines:  # admission: a request has no lines to look up
            return self.line
        p = pointer
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p.rsplit("/", 1)[0]
        return self.line
