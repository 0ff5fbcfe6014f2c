"""Ask a llama.cpp server whether it is idle, and how many slots it has (its ``--parallel``,
paced release's capacity), through its ``/slots`` endpoint."""

from __future__ import annotations

import json

import aiohttp

from extproc.logs import get_logger
from extproc.platform.kube.idle.fetch import fetch

log = get_logger(__name__)


async def probe_idle(session: aiohttp.ClientSession, url: str, timeout: float) -> bool | None:
    """True when no slot is processing, False when one is, None when the answer is unknown."""
    answer = await fetch(session, url, timeout)
    if answer is None:
        return None
    status, body = answer
    if status != 200:
        log.warning("idle probe answered non-200", url=url, status=status)
        return None
    try:
        slots = json.loads(body)
    except ValueError:
        slots = None
    # Anything but a non-empty list of slot objects with a boolean is_processing is "unknown": the
    # caller then defers the swap rather than unloading a server that may be mid-generation.
    if not isinstance(slots, list) or not slots or not all(
            isinstance(s, dict) and isinstance(s.get("is_processing"), bool) for s in slots):
        log.warning("idle probe answer not understood", url=url)
        return None
    return not any(s["is_processing"] for s in slots)


async def slot_count(url: str, timeout: float) -> int:
    """How many slots the server's ``/slots`` lists (0: it could not tell)."""
    async with aiohttp.ClientSession() as session:
        answer = await fetch(session, url, timeout)
    if answer is None or answer[0] != 200:
        return 0
    try:
        slots = json.loads(answer[1])
    except ValueError:
        return 0
    return len(slots) if isinstance(slots, list) and all(isinstance(s, dict) for s in slots) \
        else 0
