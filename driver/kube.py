"""A small JSON request helper over `kubernetes.client.ApiClient`, for both client generations.

kubernetes-client 34–35 has `call_api(resource_path, method, ...)`; 36+ (new generator) splits it
into `param_serialize` + `call_api(method, url, ...)`. The driver writes plain dicts for any
resource.k8s.io version, so it needs only this one call.
"""

from __future__ import annotations

import json
from typing import Any


class KubeHTTPError(Exception):
    """The API server answered with an HTTP error status."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        self.status = status
        self.reason = reason
        self.body = body
        # The API server's Status message says what was refused and why; the raw body is mostly noise.
        detail = body
        try:
            parsed = json.loads(body)
            if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
                detail = parsed["message"]
        except ValueError:
            pass
        super().__init__(f"HTTP {status} {reason}: {detail[:1000]}")


def request(
    api: Any,
    method: str,
    path: str,
    body: Any = None,
    query: list[tuple[str, str]] | None = None,
    timeout: float = 30.0,
    content_type: str = "application/json",
) -> Any:
    """Send one request; the parsed JSON answer (None when empty). HTTP errors → KubeHTTPError.

    `content_type` names the body's patch kind for PATCH (a JSON body is valid for each, server-side
    apply's application/apply-patch+yaml included)."""
    from kubernetes.client.exceptions import ApiException

    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    try:
        if hasattr(api, "param_serialize"):
            m, url, hdrs, ser_body, _post = api.param_serialize(
                method=method, resource_path=path, query_params=query or [], header_params=headers, body=body,
                auth_settings=["BearerToken"],
            )  # fmt: skip
            resp = api.call_api(m, url, header_params=hdrs, body=ser_body, _request_timeout=timeout)
            resp.read()
            status = int(resp.status)
            data = resp.data
            if not 200 <= status < 300:
                text = data.decode(errors="replace") if isinstance(data, bytes) else str(data or "")
                raise KubeHTTPError(status, str(resp.reason or ""), text)
        else:
            resp = api.call_api(
                path, method, query_params=query or [], header_params=headers, body=body,
                auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
                _request_timeout=timeout,
            )  # fmt: skip
            data = resp.data
    except ApiException as exc:
        raise KubeHTTPError(int(exc.status or 0), str(exc.reason or ""), str(exc.body or "")) from None
    if not data:
        return None
    return json.loads(data)
