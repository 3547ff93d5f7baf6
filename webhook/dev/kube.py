"""A small HTTPS client for the local API server (client-certificate auth, JSON only)."""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        self.body = body
        message = body
        with contextlib.suppress(ValueError):
            message = str(json.loads(body).get("message", body))
        super().__init__(f"{method} {path}: HTTP {status}: {message}")


@dataclass(frozen=True)
class Kube:
    """Talks to one API server as the holder of a client certificate."""

    server: str
    ca: Path
    cert: Path
    key: Path
    timeout: float = 10.0

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.load_cert_chain(str(self.cert), str(self.key))
        return ctx

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
    ) -> Any:
        """Send one request; returns the decoded JSON answer (or the text for non-JSON)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._context(), timeout=self.timeout) as resp:
                raw = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, method, path, exc.read().decode(errors="replace")) from None
        try:
            return json.loads(raw)
        except ValueError:
            return raw

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def create(self, path: str, body: Any) -> Any:
        """POST, treating 'already exists' as success (idempotent set-up)."""
        try:
            return self.request("POST", path, body)
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str) -> None:
        try:
            self.request("DELETE", path)
        except ApiError as exc:
            if exc.status != 404:
                raise
