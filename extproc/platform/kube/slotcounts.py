"""llama.cpp members' slot counts: paced release's capacity when no annotation gives one.

A member's count is read from its ``/slots`` once each time it is Ready (a new pod may run
another ``--parallel``); until that answer is in, and if none comes, it is unpaced (0). The
watcher owns when to ask; this owns the cache and the read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

from extproc.logs import get_logger
from extproc.platform.kube.idle.slots import slot_count
from extproc.policy.model import MemberObservation
from extproc.settings import Settings

log = get_logger(__name__)


class SlotCounts:
    """Each Ready llama.cpp member's slot count, by (namespace, member)."""

    def __init__(self, url_of: Callable[[str, str], str], settings: Settings,
                 changed: Callable[[str, str], None]) -> None:
        self._url_of = url_of  # (namespace, member) -> its /slots URL
        self._timeout = settings.idle_probe_timeout
        self._paced = settings.paced_release
        self._changed = changed  # a count came in: report the member again
        self._counts: dict[tuple[str, str], int] = {}  # 0: asked, not answered

    def observed(self, namespace: str, obs: MemberObservation, slots_probe: bool,
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] | None
                 ) -> MemberObservation:
        """``obs`` with its slot count as capacity, for a paced member whose probe is llama.cpp's
        /slots and which has no capacity of its own; the first time it is Ready, ask (through
        ``spawn``) and answer unpaced meanwhile. A member that left Ready is asked again."""
        key = (namespace, obs.name)
        if not obs.ready:
            self._counts.pop(key, None)
            return obs
        if obs.capacity or not self._paced or not slots_probe or spawn is None:
            return obs
        if key not in self._counts:
            self._counts[key] = 0  # asked: once per load
            spawn(self._read(namespace, obs.name))
        return replace(obs, capacity=self._counts[key])

    async def _read(self, namespace: str, member: str) -> None:
        try:
            count = await slot_count(self._url_of(namespace, member), self._timeout)
        except Exception as exc:  # (never let it end the watch's task group)
            log.warning("slot count not read", namespace=namespace, member=member,
                        error=f"{type(exc).__name__}: {exc}")
            return
        if (namespace, member) in self._counts:  # (else it left Ready meanwhile)
            self._counts[(namespace, member)] = count
            log.info("member slot count read", namespace=namespace, member=member, slots=count)
            self._changed(namespace, member)
