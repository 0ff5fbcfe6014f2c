"""The HTTP/2 server's async tests run on both event loops: asyncio's, and uvloop, which the
service runs on by default (``--event-loop``); their transports differ in when they read,
write and close."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import uvloop


def pytest_asyncio_loop_factories(config: Any, item: Any) -> dict[str, Callable[[], Any]]:
    """Each async test under tests/transport, once per event loop."""
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
