"""How the local stack's processes wait for their end: the first SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import signal


async def until_signalled() -> None:
    """Return on the first SIGINT or SIGTERM (the stack stops its processes so)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
