"""A small JSON client for the Kubernetes API over aiohttp: the few calls the service makes.

Why not the ``kubernetes`` package's ApiClient: importing any part of that package imports
both its sync and asyncio model classes (thousands of them, ~45 MB resident), while the
service sends four kinds of raw JSON requests (list, watch, merge patch, create) and decodes
the answers itself. Credentials come from ``credentials.py``.

Two connection pools. A watch holds its HTTP/1.1 connection for as long as it streams (up
to ``--watch-timeout``), and the service runs three per watched namespace plus the Leases'.
Sharing one bounded pool with the writes would let enough watches take every connection, and
a Lease renewal would then wait for one until this replica's admission ran out. So watches
get a pool of their own, unbounded (one connection each, as many as there are watches), and
every other request uses the bounded pool, which no watch ever occupies.
"""

from __future__ import annotations

import asyncio
import json
from importlib import metadata
from typing import Any

import aiohttp
from yarl import URL

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


# Requests other than watches: short, so a bounded pool serves any number of pools' writes.
REQUEST_CONNECTIONS = 100


class KubeClient:
    """HTTP connection pools to the API server (watches apart from the rest), with the
    credentials' headers and TLS."""

    def __init__(self, credentials: Credentials, request_timeout: float = 60.0) -> None:
        self.credentials = credentials
        # the policy counts a write of ours as possibly landing this long (--api-request-timeout)
        self.request_timeout = request_timeout
        self._sessions: dict[bool, aiohttp.ClientSession] = {}  # keyed by "is a watch"

    def _http(self, watch: bool) -> aiohttp.ClientSession:
        """The watches' or the requests' session, made on first use (inside the running loop)."""
        session = self._sessions.get(watch)
        if session is None or session.closed:
            session = self._sessions[watch] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.credentials.ssl_context(),
                                               limit=0 if watch else REQUEST_CONNECTIONS))
        return session

    async def open(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                   body: Any = None, content_type: str = MERGE_PATCH,
                   timeout: float | None = None) -> aiohttp.ClientResponse:
        """Send a request and return the response unread (for watch streams); any status.

        ``path`` is sent exactly as given (every segment quoted by its builder,
        ``_calls.segment``): nothing decodes or folds it, so a name can never become ``..``.
        A request with ``watch`` set goes over the watches' connections, any other over the
        requests'. Redirects are not followed: the API server sends none to these paths.
        An expired exec credential is renewed first; a 401 renews it (when it can be) and
        sends the request once more. A write names this service as its field manager.
        """
        data = None if body is None else json.dumps(body).encode()
        query = {k: _query_value(v) for k, v in (params or {}).items() if v is not None}
        if method in WRITE_METHODS:
            query.setdefault("fieldManager", OUR_MANAGER)
        url = URL(self.credentials.server.rstrip("/") + path, encoded=True)
        session = self._http(query.get("watch") == "true")
        retried = False
        while True:
            await self.credentials.refresh()
            sent = self.credentials.headers()
            headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **sent}
            if data is not None:
                headers["Content-Type"] = content_type
            resp = await session.request(
                method, url, params=query, data=data, headers=headers, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout or self.request_timeout))
            if resp.status != 401 or retried or not await self.credentials.rejected(sent):
                return resp
            resp.release()
            retried = True

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
        for session in self._sessions.values():
            await session.close()
        if self._sessions:
            # aiohttp needs a loop turn to close TLS transports cleanly
            await asyncio.sleep(0)


def _query_value(value: Any) -> str:
    """A query parameter as the API server reads it (booleans in lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
