"""A small JSON client for the Kubernetes API over aiohttp: the few calls the service makes.

Why not the ``kubernetes`` package's ApiClient: importing any part of that package imports
both its sync and asyncio model classes (thousands of them, ~45 MB resident), while the
service sends four kinds of raw JSON requests (list, watch, merge patch, create) and decodes
the answers itself. Credentials come from ``credentials.py``.
"""

from __future__ import annotations

import asyncio
import json
from importlib import metadata
from typing import Any

import aiohttp

from extproc.platform.kube.credentials import Credentials
from extproc.policy.writers import OUR_MANAGER

MERGE_PATCH = "application/merge-patch+json"
# Every write names this service as its field manager (metadata.managedFields), so the API
# server, kubectl and our own watch can tell our writes from others' (policy/writers.py).
WRITE_METHODS = frozenset({"PATCH", "POST", "PUT"})


def _version() -> str:
    """This package's version for the User-Agent ("dev" when not installed)."""
    try:
        return metadata.version("modelpool-extproc")
    except metadata.PackageNotFoundError:
        return "dev"


USER_AGENT = f"{OUR_MANAGER}/{_version()}"


class ApiError(Exception):
    """The API server answered with a non-2xx status (``status``; ``reason`` is its text)."""

    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(f"{status} {reason}".strip())
        self.status = status
        self.reason = reason


class KubeClient:
    """One HTTP connection pool to the API server, with the credentials' headers and TLS."""

    def __init__(self, credentials: Credentials, request_timeout: float = 60.0) -> None:
        self.credentials = credentials
        # the policy counts a write of ours as possibly landing this long (--api-request-timeout)
        self.request_timeout = request_timeout
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        """The session, made on first use (it must be created inside the running loop)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                base_url=self.credentials.server,
                connector=aiohttp.TCPConnector(ssl=self.credentials.ssl_context()))
        return self._session

    async def open(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                   body: Any = None, content_type: str = MERGE_PATCH,
                   timeout: float | None = None) -> aiohttp.ClientResponse:
        """Send a request and return the response unread (for watch streams); any status."""
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT,
                   **self.credentials.headers()}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        query = {k: _query_value(v) for k, v in (params or {}).items() if v is not None}
        if method in WRITE_METHODS:
            query.setdefault("fieldManager", OUR_MANAGER)
        return await self._http().request(
            method, path, params=query, data=data, headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout or self.request_timeout))

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, dict]:
        """Send a request and decode its JSON answer: (status, body); ApiError on non-2xx."""
        resp = await self.open(method, path, **kwargs)
        async with resp:
            raw = await resp.read()
            if not 200 <= resp.status < 300:
                raise ApiError(resp.status, raw[:300].decode("utf-8", "replace"))
        return resp.status, json.loads(raw) if raw else {}

    async def close(self) -> None:
        """Close the connections (idempotent)."""
        if self._session is not None:
            await self._session.close()
            # aiohttp needs a loop turn to close TLS transports cleanly
            await asyncio.sleep(0)


def _query_value(value: Any) -> str:
    """A query parameter as the API server reads it (booleans in lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
