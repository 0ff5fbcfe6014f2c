"""Object storage with one global resourceVersion counter and a bounded event history for watches.

Rules of this file: every write goes through `put` or `remove`, which bump the counter, stamp the
object, append an event and hand it to open watches, all without awaiting, so a watch opened
between two writes sees exactly the events after its starting version. Stored dicts are never
mutated after `put`; writers build a new dict.

A watch may resume from version V only while the history still holds every event after V
(`V >= oldest`). `compact()` forgets the history, so older versions answer 410 Gone.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any

from devstack.kubeapi.errors import gone
from devstack.kubeapi.resources import ResourceType

ObjectKey = tuple[str | None, str]

# Markers a watcher's queue may carry instead of an event.
EXPIRED = "EXPIRED"  # the history this watch relies on was compacted: send 410 and end
CLOSED = "CLOSED"  # the server stops or goes unavailable: end the stream


@dataclasses.dataclass(frozen=True)
class Event:
    """One committed change: the object after it (or as deleted) and before it."""

    rv: int
    type: str
    key: tuple[str, str]
    obj: dict[str, Any]
    prev: dict[str, Any] | None


class Watcher:
    """One open watch on one resource: a queue the store fills synchronously."""

    def __init__(self, key: tuple[str, str], limit: int):
        self.key = key
        self.limit = limit
        self.queue: asyncio.Queue[Event | str] = asyncio.Queue()
        self.overflowed = False

    def offer(self, item: Event | str) -> None:
        """Queue an event or marker; a reader that falls too far behind is cut off, like a slow real watcher."""
        if self.overflowed:
            return
        self.queue.put_nowait(item)
        if self.queue.qsize() > self.limit:
            self.overflowed = True


def _key_of(obj: dict[str, Any]) -> ObjectKey:
    meta = obj["metadata"]
    return (meta.get("namespace"), meta["name"])


class Store:
    """All objects of all resource types, their version counter, history and open watches."""

    def __init__(self, history_limit: int = 10_000, watcher_queue_limit: int = 10_000):
        self._objects: dict[tuple[str, str], dict[ObjectKey, dict[str, Any]]] = collections.defaultdict(dict)
        self._history: collections.deque[Event] = collections.deque(maxlen=history_limit)
        self._watchers: set[Watcher] = set()
        self._watcher_queue_limit = watcher_queue_limit
        self._rv = 0
        self._oldest = 0

    @property
    def resource_version(self) -> int:
        """The version of the latest write (0 before any)."""
        return self._rv

    @property
    def oldest_resumable(self) -> int:
        """The oldest version a watch can still resume from."""
        return self._oldest

    @property
    def open_watches(self) -> int:
        """How many watch streams are open (lets tests check that clients close theirs)."""
        return len(self._watchers)

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The stored object, or None."""
        return self._objects[rt.storage_key].get((namespace, name))

    def items(self, rt: ResourceType, namespace: str | None = None) -> list[dict[str, Any]]:
        """Objects of a type, in one namespace or all, ordered by namespace and name like the real server."""
        objects = self._objects[rt.storage_key]
        keys = sorted((k for k in objects if namespace is None or k[0] == namespace), key=lambda k: (k[0] or "", k[1]))
        return [objects[k] for k in keys]

    def put(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new or changed object under the next version; returns it as stored."""
        key = _key_of(obj)
        prev = self._objects[rt.storage_key].get(key)
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        self._objects[rt.storage_key][key] = obj
        self._record(Event(self._rv, "ADDED" if prev is None else "MODIFIED", rt.storage_key, obj, prev))
        return obj

    def remove(self, rt: ResourceType, namespace: str | None, name: str,
               final: dict[str, Any] | None = None) -> dict[str, Any]:
        """Delete an object; the DELETED event carries its `final` (default: stored) state at the deletion's version."""
        prev = self._objects[rt.storage_key].pop((namespace, name))
        last = final if final is not None else prev
        gone_obj = {**last, "metadata": {**last["metadata"], "resourceVersion": str(self._next_rv())}}
        self._record(Event(self._rv, "DELETED", rt.storage_key, gone_obj, prev))
        return gone_obj

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _record(self, event: Event) -> None:
        if self._history.maxlen is not None and len(self._history) == self._history.maxlen:
            self._oldest = self._history[0].rv  # the deque is about to forget this event
        self._history.append(event)
        for watcher in self._watchers:
            if watcher.key == event.key:
                watcher.offer(event)

    def open_watch(self, rt: ResourceType, since: int | None) -> tuple[list[Event], Watcher]:
        """Events to send first and a watcher for the rest; `since=None` starts with the current objects.

        Raises 410 Gone when `since` is older than the history kept.
        """
        if since is not None and since < self._oldest:
            raise gone(since, self._oldest)
        if since is None:
            initial = [Event(int(o["metadata"]["resourceVersion"]), "ADDED", rt.storage_key, o, None)
                       for o in self.items(rt)]
            initial.sort(key=lambda e: e.rv)
        else:
            initial = [e for e in self._history if e.rv > since and e.key == rt.storage_key]
        watcher = Watcher(rt.storage_key, self._watcher_queue_limit)
        self._watchers.add(watcher)
        return initial, watcher

    def close_watch(self, watcher: Watcher) -> None:
        """Forget a watcher whose stream ended."""
        self._watchers.discard(watcher)

    def compact(self, *, expire_watches: bool = True) -> int:
        """Drop the event history; with `expire_watches`, open watches end with 410 too. Returns the new floor."""
        self._history.clear()
        self._oldest = self._rv
        if expire_watches:
            self.end_watches(EXPIRED)
        return self._oldest

    def end_watches(self, marker: str = CLOSED) -> None:
        """Ask every open watch to end (after the events already queued)."""
        for watcher in self._watchers:
            watcher.offer(marker)
