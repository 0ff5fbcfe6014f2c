"""Apply the replicas the policy wants, one worker per member, latest wish wins.

This is the one retry loop for scaling: the platform makes a single attempt per call. A
worker re-reads the wanted replicas before every attempt, so a slow or retrying patch can
never land after a newer one, and a wish that changes back and forth while a call is under
way costs one more call at most.

When it stops (``cancel``) it says which members a scale-up of ours may have reached: it
counts the wishes per member as the policy counts its asks (``policy.landing``), and
remembers the latest one a scale-up carried that was not refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass

from ..backoff import Backoff
from ..logs import get_logger
from ..platform.contract import Platform, WriteRefused
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
        self._asks: dict[str, int] = {}  # member -> wishes so far (the policy counts the same)
        self._reached: dict[str, int] = {}  # member -> latest wish a scale-up may land (0: none)
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._triggers: dict[str, asyncio.Task[None]] = {}

    def want(self, member: str, replicas: int) -> None:
        """Ask for ``member`` at ``replicas``; starts its worker unless one is running."""
        self._wanted[member] = replicas
        self._asks[member] = self._asks.get(member, 0) + 1
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

    def cancel(self) -> tuple[tuple[str, int], ...]:
        """Stop every worker; per member, the latest wish whose scale-up may still land or
        has landed (a call cut off on the wire counts: it may land yet)."""
        for task in [*self._workers.values(), *self._triggers.values()]:
            task.cancel()
        return tuple(sorted((m, ask) for m, ask in self._reached.items() if ask))

    async def _work(self, member: str) -> None:
        applied = None
        backoff = Backoff(self._retry.initial, self._retry.maximum)
        while (wanted := self._wanted[member]) != applied:
            before = self._reached.get(member, 0)
            if wanted > 0:
                self._reached[member] = self._asks[member]  # it may land from here on
            failure = await _call(self._platform.scale(self._key, member, wanted))
            if failure is None:
                applied = wanted
                backoff.reset()
                continue
            if isinstance(failure, WriteRefused):
                self._reached[member] = before  # it changed nothing
            await self._wait_out(failure, backoff, "scale", member, wanted)

    async def _trigger(self, member: str) -> None:
        backoff = Backoff(self._retry.initial, self._retry.maximum)
        while (failure := await _call(self._platform.trigger(self._key, member))) is not None:
            await self._wait_out(failure, backoff, "trigger", member, 1)

    async def _wait_out(self, failure: Exception, backoff: Backoff, verb: str, member: str,
                        replicas: int) -> None:
        """Log a failed platform call and sleep a backoff before the next attempt."""
        # Giving up would leave the policy waiting for a change that never comes, so keep
        # asking, ever more slowly, until the cause is fixed: a conflict passes at once
        # (the next attempt reads a fresher view), a 403 or a webhook's 422 waits for an
        # operator (the swap stays visible as Swapping meanwhile). A conflict is not the
        # same write again: the platform re-read the member, the policy heard it, and the
        # next attempt takes the wish as it is now, with the member's fresh version.
        delay = backoff.next_delay()
        log.error(f"{verb} failed; will retry", namespace=self._key.namespace,
                  pool=self._key.name, member=member, replicas=replicas,
                  error=f"{type(failure).__name__}: {failure}", retry_in_s=round(delay, 3))
        await asyncio.sleep(delay)


async def _call(call: Awaitable[None]) -> Exception | None:
    """Await one platform call: None when it went through, else what it raised."""
    try:
        await call
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return exc
    return None
