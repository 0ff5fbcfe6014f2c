"""One GET for an idle probe: status and body, or None when no answer arrived."""

from __future__ import annotations

import asyncio

import aiohttp

from extproc.logs import get_logger

log = get_logger(__name__)


async def fetch(session: aiohttp.ClientSession, url: str,
                timeout: float) -> tuple[int, bytes] | None:
    """(status, body) of ``GET url``; None (logged) on a transport error or timeout."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return resp.status, await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        log.warning("idle probe failed", url=url, error=repr(exc))
        return None
