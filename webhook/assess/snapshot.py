"""`--snapshot FILE`: the cluster state review reads, written while the lists stream by.

One JSON `List` of Namespaces (what `draguard review --cluster-state` reads), ResourceSlices,
DeviceClasses, ResourceClaimTemplates and ResourceClaims (what `--inventory` and `quota usage
--claims/--inventory` read). Items are written page by page, so the file never sits in memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

KINDS = frozenset({"Namespace", "ResourceSlice", "DeviceClass", "ResourceClaimTemplate", "ResourceClaim"})


class SnapshotError(Exception):
    pass


class SnapshotWriter:
    """Written to FILE.tmp and renamed on close: a failed run leaves no half-written snapshot."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.f: TextIO = open(self.tmp, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        except OSError as e:
            raise SnapshotError(f"{path}: cannot write the snapshot: {e.strerror or e}") from None
        self.f.write('{"apiVersion": "v1", "kind": "List", "items": [\n')
        self.count = 0

    def write(self, items: Iterable[Mapping[str, Any]]) -> None:
        for it in items:
            if it.get("kind") not in KINDS:
                continue
            if self.count:
                self.f.write(",\n")
            self.f.write(json.dumps(it, separators=(",", ":"), sort_keys=True))
            self.count += 1

    def close(self, ok: bool = True) -> None:
        if self.f.closed:
            return
        if not ok:
            self.f.close()
            self.tmp.unlink(missing_ok=True)
            return
        self.f.write("\n]}\n")
        self.f.close()
        os.replace(self.tmp, self.path)

    def __enter__(self) -> SnapshotWriter:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(ok=et is None)
