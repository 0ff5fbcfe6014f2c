"""The one home of test support shared by tests/, e2e/, bench/ and devstack/: polling, an
OpenAI chat client through Envoy, a one-shot POST and the static demo pool. Kubernetes
objects are built by ``stack_manifests``.

Nothing here is product code; it lives in ``devstack`` because that is the package all four
can import.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

T = TypeVar("T")


# The static pools file of the in-process stacks: members judge and coder share one slot.
DEMO_POOLS = """
pools:
  - namespace: demo
    name: shared-gpu
    members: [judge, coder]
    default: judge
"""


class TimedOut(AssertionError):
    """A condition did not hold in time (an AssertionError, so pytest reports it as a failure)."""


def wait_until(check: Callable[[], Any], timeout: float, what: str = "condition",
               interval: float = 0.05) -> Any:
    """Poll a blocking ``check`` until it returns something truthy; TimedOut after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimedOut(f"timed out after {timeout:g}s waiting for {what} (last: {result!r})")
        time.sleep(interval)


async def eventually(check: Callable[[], Any], timeout: float = 5.0, what: str = "condition",
                     *, interval: float = 0.02, blocking: bool = False) -> Any:
    """Poll ``check`` (plain or async; ``blocking`` runs it in a thread) until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        result = await asyncio.to_thread(check) if blocking else check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimedOut(f"timed out after {timeout:g}s waiting for {what} (last: {result!r})")
        await asyncio.sleep(interval)


async def finish_within(awaitable: Awaitable[T], seconds: float, what: str) -> T:
    """Await ``awaitable`` for at most ``seconds``; TimedOut naming ``what`` if it is not done.

    For fixture teardowns: unlike ``asyncio.timeout``, this returns even when the awaited work
    ignores its cancellation (a task caught in a swallowed cancel), so a stuck stop fails the
    test in seconds, saying what it waited for, instead of hanging until pytest-timeout.
    """
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        raise TimedOut(f"teardown: {what} did not finish within {seconds:g}s")
    return task.result()


async def stop_front_to_back(envoy: Any, stop_service: Awaitable[Any], grace: float,
                             upstreams: Iterable[Any]) -> None:
    """Tear a data path down in order: Envoy (if started), the ext_proc (draining for up to
    its ``grace``), then the fake members (``UpstreamHandle``s), each within a bound."""
    if envoy is not None:
        envoy.stop()
    await finish_within(stop_service, grace + 15, "the ext_proc to drain and stop")
    for handle in upstreams:
        await finish_within(handle.stop(), 15, f"fake member {handle.name} to stop")


def chat_body(model: str, *, stream: bool = False, tokens: int = 8, **extra: Any) -> bytes:
    """A small /v1/chat/completions request naming ``model``."""
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}],
                       "stream": stream, "max_tokens": tokens, **extra}).encode()


@contextlib.asynccontextmanager
async def posted(url: str, **request: Any) -> AsyncIterator[aiohttp.ClientResponse]:
    """POST ``url`` from a client session of its own; yields the open response."""
    async with aiohttp.ClientSession() as session:
        async with session.post(url, **request) as resp:
            yield resp


@dataclass
class Reply:
    """What a client saw: status, headers (lower-case), body, timing and SSE events."""

    status: int
    headers: dict[str, str]
    body: str
    began: float  # time.monotonic() when the request was sent
    ended: float  # ... and when its last byte arrived
    events: list[str] = field(default_factory=list)  # SSE data payloads, in order

    @property
    def served_by(self) -> str:
        """The member that answered (the fake upstream's x-served-by header)."""
        return self.headers.get("x-served-by", "")

    @property
    def took(self) -> float:
        """Seconds from send to the last byte."""
        return self.ended - self.began

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


async def chat(session: aiohttp.ClientSession, base_url: str, model: str, *,
               stream: bool = False, tokens: int = 8, token_delay_ms: int = 0,
               timeout: float = 60.0, headers: dict[str, str] | None = None,
               **extra: Any) -> Reply:
    """POST /v1/chat/completions to ``base_url`` (with extra ``headers``) and read the answer."""
    # the fake upstream paces SSE tokens by ?delay_ms=
    url = f"{base_url}/v1/chat/completions?delay_ms={token_delay_ms}"
    began = time.monotonic()
    async with session.post(url, data=chat_body(model, stream=stream, tokens=tokens, **extra),
                            headers={"content-type": "application/json", **(headers or {})},
                            timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        headers = {k.lower(): v for k, v in resp.headers.items()}
        if not (stream and resp.status == 200):
            text = await resp.text()
            return Reply(resp.status, headers, text, began, time.monotonic())
        events = []
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line[len(b"data: "):].decode().strip())
        return Reply(resp.status, headers, "", began, time.monotonic(), events)


def seed_from_env() -> None:
    """Seed Python's ``random`` from $MODELPOOL_TEST_SEED when set (devstack/soak.py's
    rounds): the test process's jitter and choices then repeat with the seed."""
    seed = os.environ.get("MODELPOOL_TEST_SEED")
    if seed:
        random.seed(int(seed))
