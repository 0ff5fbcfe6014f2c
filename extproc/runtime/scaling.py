"""Apply the replicas the policy wants, one worker per member, latest wish wins.

This is the one retry loop for scaling: the platform makes a single attempt per call. A
worker re-reads the wanted replicas before every attempt, so a slow or retrying patch can
never land after a newer one, and a wish that changes back and forth while a call is under
way costs one more call at most.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass

from ..backoff import Backoff
from ..logs import get_logger
from ..platform.contract import Platform
from ..policy.model import PoolKey

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Retry:
    """Delays between attempts of a platform call that failed (jittered, doubling)."""

    initial: float
    maximum: float


class Scaler:
    """Keeps one pool's members at the replicas last asked for, retrying until it sticks."""

    def __init__(self, platform: Platform, key: PoolKey, retry: Retry) -> None:
        self._platform = platform
        self._key = key
        self._retry = retry
        self._wanted: dict[str, int] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._triggers: dict[str, asyncio.Task[None]] = {}

    def want(self, member: str, replicas: int) -> None:
        """Ask for ``member`` at ``replicas``; starts its worker unless one is running."""
        self._wanted[member] = replicas
        if member not in self._workers:
            task = asyncio.get_running_loop().create_task(self._work(member))
            self._workers[member] = task
            task.add_done_callback(lambda _: self._workers.pop(member, None))

    def trigger(self, member: str) -> None:
        """llmkube mode: ask LLMKube for ``member`` (0 -> 1), retrying until it sticks."""
        if member not in self._triggers:
            task = asyncio.get_running_loop().create_task(self._trigger(member))
            self._triggers[member] = task
            task.add_done_callback(lambda _: self._triggers.pop(member, None))

    async def settled(self) -> None:
        """Wait until every wish so far has been applied (tests, shutdown)."""
        while tasks := [*self._workers.values(), *self._triggers.values()]:
            await asyncio.wait(tasks)

    def cancel(self) -> None:
        """Stop every worker (the pool is closing)."""
        for task in [*self._workers.values(), *self._triggers.values()]:
            task.cancel()

    async def _work(self, member: str) -> None:
        applied = None
        backoff = Backoff(self._retry.initial, self._retry.maximum)
        while (wanted := self._wanted[member]) != applied:
            if await self._attempt(self._platform.scale(self._key, member, wanted), backoff,
                                   "scale", member, wanted):
                applied = wanted

    async def _trigger(self, member: str) -> None:
        backoff = Backoff(self._retry.initial, self._retry.maximum)
        while not await self._attempt(self._platform.trigger(self._key, member), backoff,
                                      "trigger", member, 1):
            pass

    async def _attempt(self, call: Awaitable[None], backoff: Backoff, verb: str,
                       member: str, replicas: int) -> bool:
        """Await one platform call: True when it went through, else log and sleep a backoff."""
        try:
            await call
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Giving up would leave the policy waiting for a change that never comes, so keep
            # asking, ever more slowly, until the cause is fixed: a conflict passes at once
            # (the next attempt reads a fresher view), a 403 or a webhook's 422 waits for an
            # operator (the swap stays visible as Swapping meanwhile). A conflict is not the
            # same write again: the platform re-read the member, the policy heard it, and the
            # next attempt takes the wish as it is now, with the member's fresh version.
            delay = backoff.next_delay()
            log.error(f"{verb} failed; will retry", namespace=self._key.namespace,
                      pool=self._key.name, member=member, replicas=replicas,
                      error=f"{type(exc).__name__}: {exc}", retry_in_s=round(delay, 3))
            await asyncio.sleep(delay)
            return False
        backoff.reset()
        return True
