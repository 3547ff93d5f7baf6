"""Reading the cluster: paginated list calls (`limit` + `continue`) streamed page by page, single
GETs of owners through API discovery, and a progress line on stderr for long runs.

The only module of `webhook.assess` that talks to the API server; everything it returns is plain
JSON data. Credentials come from a kubeconfig or the in-cluster service account (`KubeHttp`).
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

from ..server.caches import ApiError, KubeHttp

PAGE_SIZE = 500
# Owners fetched once and remembered (ReplicaSets, Deployments, ...): bounded, least recently used out.
OWNER_CACHE = 2048
PROGRESS_AFTER = 2.0  # seconds before the first progress line, and between lines


class CollectError(Exception):
    """The cluster cannot be read at all (connection, credentials); one line for the user."""


class Progress:
    """`draguard assess: <what> ...` on stderr once a run is long, at most every PROGRESS_AFTER s."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.start = time.monotonic()
        self.last = self.start

    def tick(self, text: str) -> None:
        now = time.monotonic()
        if self.enabled and now - self.last >= PROGRESS_AFTER:
            self.last = now
            print(f"draguard assess: {text} ({now - self.start:.0f}s)", file=self.stream, flush=True)


def _path(api_version: str, plural: str, namespace: str | None = None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


class ClusterReader:
    """Read-only access to one cluster."""

    def __init__(self, http: KubeHttp, progress: Progress | None = None, page_size: int = PAGE_SIZE) -> None:
        self.http = http
        self.progress = progress or Progress(enabled=False)
        self.page_size = page_size
        self._plurals: dict[str, dict[str, tuple[str, bool]] | None] = {}
        self._owners: OrderedDict[tuple[str, str, str, str], Mapping[str, Any] | None] = OrderedDict()
        self.requests = 0

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, progress: Progress | None = None) -> ClusterReader:
        try:
            return cls(KubeHttp.from_kubeconfig(kubeconfig), progress)
        except Exception as e:  # the kubernetes client raises several types for bad configs
            where = kubeconfig or "in-cluster service account / $KUBECONFIG / ~/.kube/config"
            raise CollectError(f"cannot load credentials from {where}: {e}") from None

    def get(self, path: str) -> dict[str, Any]:
        self.requests += 1
        try:
            return self.http.get_json(path, timeout=30.0)
        except ApiError:
            raise
        except Exception as e:  # connection refused, TLS, timeouts
            raise CollectError(f"cannot reach the API server ({type(e).__name__}: {e})") from None

    def pages(
        self, api_version: str, plural: str, kind: str, what: str | None = None
    ) -> Iterator[list[dict[str, Any]]]:
        """Every object of a resource, one page (at most `page_size` items) at a time, each item
        with apiVersion/kind set. Raises ApiError (403, 404) for the caller to record."""
        path = _path(api_version, plural)
        token = ""
        seen = 0
        while True:
            query: list[tuple[str, Any]] = [("limit", self.page_size)]
            if token:
                query.append(("continue", token))
            self.requests += 1
            try:
                doc = self.http.get_json(path, query, timeout=60.0)
            except ApiError as e:
                if e.status == 410:
                    raise CollectError(
                        f"listing {plural} took longer than the API server keeps a list consistent "
                        "(410 Gone: continue token expired); run again, or closer to the API server"
                    ) from None
                raise
            except Exception as e:
                raise CollectError(f"cannot reach the API server ({type(e).__name__}: {e})") from None
            items = [i for i in doc.get("items") or [] if isinstance(i, dict)]
            for it in items:
                it.setdefault("apiVersion", api_version)
                it.setdefault("kind", kind)
                meta = it.get("metadata")
                if isinstance(meta, dict):
                    meta.pop("managedFields", None)
            seen += len(items)
            self.progress.tick(f"listed {seen} {what or plural}")
            yield items
            token = str((doc.get("metadata") or {}).get("continue") or "")
            if not token:
                return

    def items(self, api_version: str, plural: str, kind: str) -> Iterator[dict[str, Any]]:
        for page in self.pages(api_version, plural, kind):
            yield from page

    def _resources(self, api_version: str) -> dict[str, tuple[str, bool]] | None:
        """kind -> (plural, namespaced) of one group version, from discovery (None: not served)."""
        if api_version not in self._plurals:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            try:
                doc = self.get(path)
            except ApiError:
                self._plurals[api_version] = None
            else:
                out: dict[str, tuple[str, bool]] = {}
                for r in doc.get("resources") or []:
                    name = str(r.get("name") or "")
                    if name and "/" not in name and r.get("kind"):
                        out[str(r["kind"])] = (name, bool(r.get("namespaced")))
                self._plurals[api_version] = out
        return self._plurals[api_version]

    def lookup(self, api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """One object by reference (an owner), remembered; None when gone, unknown or forbidden."""
        key = (api_version, kind, namespace, name)
        if key in self._owners:
            self._owners.move_to_end(key)
            return self._owners[key]
        found: Mapping[str, Any] | None = None
        res = self._resources(api_version)
        if res is not None and kind in res:
            plural, namespaced = res[kind]
            base = _path(api_version, plural, namespace if namespaced else None)
            try:
                obj = self.get(f"{base}/{name}")
            except ApiError:
                obj = None
            if obj is not None:
                obj.setdefault("apiVersion", api_version)
                obj.setdefault("kind", kind)
                meta = obj.get("metadata")
                if isinstance(meta, dict):
                    meta.pop("managedFields", None)
                found = obj
        self._owners[key] = found
        if len(self._owners) > OWNER_CACHE:
            self._owners.popitem(last=False)
        return found

    def resource_plurals(self, api_version: str) -> list[str]:
        """The resources one group version serves (discovery), e.g. to tell which DRA APIs are on."""
        return sorted(plural for plural, _ns in (self._resources(api_version) or {}).values())

    def server_version(self) -> dict[str, Any]:
        return self.get("/version")

    def group_versions(self, group: str) -> list[str]:
        """Served versions of an API group, preferred first; [] when the group is not served."""
        try:
            doc = self.get(f"/apis/{group}")
        except ApiError as e:
            if e.status == 404:
                return []
            raise
        served = [str(v.get("version")) for v in doc.get("versions") or [] if isinstance(v, dict)]
        pref = str((doc.get("preferredVersion") or {}).get("version") or "")
        return sorted(served, key=lambda v: (v != pref, served.index(v)))
