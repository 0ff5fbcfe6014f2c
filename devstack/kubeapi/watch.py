"""One watch stream: replay from a resourceVersion, then live events, bookmarks, timeout, 410.

The stream ends when timeoutSeconds elapse, the client goes away (checked at least once a
second, since an idle watch writes nothing that could fail), the store asks it to end (compaction
with expiry, emulated outage, shutdown), or the client reads too slowly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from devstack.kubeapi import errors, tables
from devstack.kubeapi.resources import ResourceType
from devstack.kubeapi.store import CLOSED, EXPIRED, Event, Store

_LIVENESS_POLL = 1.0


@dataclasses.dataclass(frozen=True)
class WatchOptions:
    """What the client asked for, already parsed from the query string."""

    since: int | None
    matches: Callable[[dict[str, Any]], bool]
    timeout: float
    bookmarks: bool
    bookmark_interval: float
    table_include: str | None = None  # set when the client asked for Table output


def present(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    """An object as served under the requested version (versions of a CRD share storage)."""
    return obj if obj.get("apiVersion") == rt.api_version else {**obj, "apiVersion": rt.api_version}


def visible(event: Event, matches: Callable[[dict[str, Any]], bool]) -> str | None:
    """The event type this watcher sees: an object leaving its selector is DELETED to it, entering is ADDED."""
    if event.type == "DELETED":
        return "DELETED" if matches(event.obj) else None
    was = event.prev is not None and matches(event.prev)
    now = matches(event.obj)
    if now:
        return "MODIFIED" if was else "ADDED"
    return "DELETED" if was else None


async def _send(response: web.StreamResponse, event_type: str, obj: dict[str, Any]) -> None:
    await response.write(json.dumps({"type": event_type, "object": obj}).encode() + b"\n")


def _client_gone(request: web.BaseRequest) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def serve_watch(request: web.BaseRequest, store: Store, rt: ResourceType,
                      options: WatchOptions) -> web.StreamResponse:
    """Stream watch events as JSON lines until timeout, disconnect, expiry or shutdown."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    try:
        initial, watcher = store.open_watch(rt, options.since)
    except errors.ApiError as exc:
        # a watch from a compacted version starts fine and fails in-stream, as with the real server
        await response.prepare(request)
        await _send(response, "ERROR", exc.status())
        await response.write_eof()
        return response

    last_rv = options.since or store.resource_version

    async def deliver(event: Event) -> None:
        nonlocal last_rv
        last_rv = event.rv
        event_type = visible(event, options.matches)
        if event_type is None:
            return
        obj = present(rt, event.obj)
        if options.table_include is not None:
            obj = tables.table(rt, [obj], obj["metadata"]["resourceVersion"], options.table_include)
        await _send(response, event_type, obj)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + options.timeout
    next_bookmark = loop.time() + options.bookmark_interval
    try:
        await response.prepare(request)
        for event in initial:
            await deliver(event)
        while not watcher.overflowed and not _client_gone(request):
            now = loop.time()
            if now >= deadline:
                break
            if options.bookmarks and now >= next_bookmark and watcher.queue.empty():
                # an empty queue means every event up to the current version has been delivered
                await _send(response, "BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version,
                                                   "metadata": {"resourceVersion": str(store.resource_version)}})
                next_bookmark = now + options.bookmark_interval
            wake = min(deadline, next_bookmark if options.bookmarks else deadline, now + _LIVENESS_POLL)
            # asyncio.timeout, not wait_for: 3.11's wait_for swallows a cancellation that meets
            # a queued event, and this handler must end when the emulator stops
            try:
                async with asyncio.timeout(max(wake - now, 0.001)):
                    item = await watcher.queue.get()
            except TimeoutError:
                continue
            if item == EXPIRED:
                await _send(response, "ERROR", errors.gone(last_rv, store.oldest_resumable).status())
                break
            if item == CLOSED:
                break
            assert isinstance(item, Event)
            await deliver(item)
        await response.write_eof()
    except ConnectionError:
        pass  # the client went away mid-write; nothing left to tell it
    finally:
        store.close_watch(watcher)
    return response
