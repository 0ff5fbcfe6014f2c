"""List one collection, then watch it from the list's resourceVersion, forever.

Theory of operation. A watch that ends at ``timeout_seconds`` is simply resumed from the last
version seen (bookmarks on). A 410 Gone (as an HTTP status or as an ERROR event) means that
version was compacted away: the loop re-lists and hands the whole list over, so a change made
while it was blind is still seen. Any other failure (API unreachable, 5xx, reset) is retried
with jittered exponential backoff, resuming from the last version. An event longer than
``EVENT_LIMIT`` (far above what etcd stores) is not read: the loop re-lists instead, so an
oversized object costs one list, never a watch that retries the same event for ever. The
ClusterWatcher runs one loop per (kind, namespace); the replicas' Lease watch runs one more.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from extproc.backoff import Backoff
from extproc.logs import get_logger
from extproc.metrics import KUBE_REQUESTS, WATCH_RESTARTS
from extproc.platform.kube._calls import describe, status_code
from extproc.platform.kube.rest import ApiError, KubeClient
from extproc.settings import Settings

log = get_logger(__name__)

# One watch event (one JSON line) at most this long. etcd keeps objects under 1.5 MiB by
# default and the API server's requests under 3 MiB; aiohttp's readline stops at its read
# buffer (512 KiB in 3.14, 128 KiB before), under what a big object reaches.
EVENT_LIMIT = 16 << 20


class EventTooLong(Exception):
    """A watch event exceeded EVENT_LIMIT: the stream cannot go on past it."""


class CollectionWatch:
    """One collection's list-then-watch loop, reporting lists and events to two callbacks."""

    def __init__(self, api: KubeClient, resource: str, path: str, settings: Settings, *,
                 on_list: Callable[[list[dict]], None],
                 on_event: Callable[[str, dict], None],
                 params: dict[str, Any] | None = None, scope: str = "",
                 absent_retry: float = 0.0) -> None:
        self._api = api
        self.resource = resource
        self._path = path
        self._params = {k: v for k, v in (params or {}).items() if v}
        self._on_list = on_list
        self._on_event = on_event
        self._scope = scope or "*"
        self._settings = settings
        self._timeout = max(1, round(settings.watch_timeout))
        # > 0: a 404 means the kind is not installed (an optional CRD): an empty collection,
        # asked again after this long, not a failure
        self._absent_retry = absent_retry

    async def run(self) -> None:
        """List then watch forever, re-listing after 410 Gone; never returns."""
        backoff = Backoff(self._settings.api_retry_initial, self._settings.api_retry_max)
        loop = asyncio.get_running_loop()
        version, gone_streak = "", 0
        while True:
            started = loop.time()
            try:
                if not version:
                    items, version = await self._list()
                    self._on_list(items)
                    # The server answers again: whatever failed before is over. Without this
                    # a 10 s outage leaves a 13-30 s delay ceiling for the next hiccup.
                    backoff.reset()
                version = await self._watch(version, backoff.reset)
                gone_streak = 0
                if loop.time() - started >= 1.0:
                    backoff.reset()
                    reason, delay = "timeout", 0.0
                else:
                    # A watch that ends cleanly at once would otherwise become a busy loop.
                    reason, delay = "early-end", backoff.next_delay()
            except EventTooLong as exc:
                # Resuming would meet the same event: a list reads the object whole and the
                # next watch starts after it.
                reason, version, delay = "too-long", "", backoff.next_delay()
                log.warning("watch event too long, re-listing", resource=self.resource,
                            namespace=self._scope, error=str(exc))
            except ApiError as exc:
                if exc.status == 404 and self._absent_retry and not version:
                    self._on_list([])  # not installed: nothing of it targets anything
                    reason, delay = "absent", self._absent_retry
                elif exc.status == 410:
                    # The version we hold was compacted: only a fresh list can tell what
                    # happened meanwhile. The first re-list is immediate, repeats back off.
                    reason, version, gone_streak = "gone", "", gone_streak + 1
                    delay = 0.0 if gone_streak == 1 else backoff.next_delay()
                    log.info("watch expired, re-listing", resource=self.resource,
                             namespace=self._scope)
                else:
                    reason, delay = status_code(exc), backoff.next_delay()
                    log.warning("watch failed", resource=self.resource, namespace=self._scope,
                                error=describe(exc), retry_in=round(delay, 3))
            except Exception as exc:
                reason, delay = "error", backoff.next_delay()
                log.warning("watch failed", resource=self.resource, namespace=self._scope,
                            error=describe(exc), retry_in=round(delay, 3))
            WATCH_RESTARTS.labels(self.resource, reason).inc()
            await asyncio.sleep(delay)

    async def _open(self, verb: str, timeout: float, **params: Any) -> Any:
        """Send a list or watch request, count it, and raise ApiError on a non-200."""
        try:
            resp = await self._api.open("GET", self._path, params={**self._params, **params},
                                        timeout=timeout)
        except Exception as exc:
            KUBE_REQUESTS.labels(verb, self.resource, status_code(exc)).inc()
            raise
        KUBE_REQUESTS.labels(verb, self.resource, str(resp.status)).inc()
        if resp.status != 200:
            body = (await resp.read())[:300].decode("utf-8", "replace")
            resp.release()
            raise ApiError(resp.status, body)
        return resp

    async def _list(self) -> tuple[list[dict], str]:
        """The collection's items and the list's resourceVersion."""
        resp = await self._open("list", 60.0)
        try:
            body = json.loads(await resp.read())
        finally:
            resp.release()
        return body.get("items") or [], body["metadata"]["resourceVersion"]

    async def _watch(self, version: str, progressed: Callable[[], None]) -> str:
        """Apply watch events from ``version`` until the server ends the stream; new version.

        ``progressed`` is called on the first event: the stream works, so any error after
        it starts retrying from the shortest delay.
        """
        # the client gives up a little after the server should have ended the watch
        resp = await self._open("watch", float(self._timeout + 30), watch=True,
                                allowWatchBookmarks=True, resourceVersion=version,
                                timeoutSeconds=self._timeout)
        first, lines = True, _Lines(resp.content)
        try:
            while line := await lines.next():
                if first:
                    progressed()
                    first = False
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise ApiError(status=int(obj.get("code") or 500),
                                   reason=obj.get("message") or "watch error event")
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if event.get("type") != "BOOKMARK":
                    self._on_event(event["type"], obj)
        finally:
            resp.close()
        return version



class _Lines:
    """A watch stream's lines, each of any length up to EVENT_LIMIT (aiohttp's readline stops
    at its read buffer's size)."""

    def __init__(self, content: Any) -> None:
        self._content = content
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no newline

    async def next(self) -> bytes:
        """The next line with its newline; b"" at the stream's end; EventTooLong past the
        limit."""
        while True:
            end = self._buf.find(b"\n", self._scanned)
            if end >= EVENT_LIMIT or (end < 0 and len(self._buf) > EVENT_LIMIT):
                raise EventTooLong(f"a watch event is over {EVENT_LIMIT} bytes")
            if end >= 0:
                line = bytes(self._buf[:end + 1])
                del self._buf[:end + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buf)
            chunk = await self._content.readany()
            if not chunk:
                line, self._buf, self._scanned = bytes(self._buf), bytearray(), 0
                return line
            self._buf += chunk
