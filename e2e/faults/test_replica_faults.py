"""Three replicas under faults (docs/design/replicas.md's failure table): a rolling restart of
every replica under mixed traffic, API throttling of the Lease writes, and a soak in which a replica is killed every
10 s. Each ends with the invariant gate: the API history (exclusive slot), Envoy's access log
(no request sent to a member that could not serve it) and what every client saw (its own
member, or an explicit error: 503 + Retry-After)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Awaitable, Callable

import aiohttp
from faultkit import at_rest, attempt, emulator, violations
from invariants import ApiRecorder, Outcome

from devstack.stack import LocalStack
from e2e_support import notices, pools

POOLS = {"rep1": ["rep1-a", "rep1-b"], "rep2": ["rep2-a", "rep2-b", "rep2-c"]}
STACK_DOCS = pools(*((name, members, {"default": members[0], "swap_budget": "8s",
                                      "fairness_window": "2s"})
                     for name, members in POOLS.items()))
# A killed replica's in-flight requests are unknown until the member's idle probe says idle
# (devstack.proberouter answers it from the member's /slots) or, failing that, this wait.
STACK_OPTIONS = {"replicas": 3, "load_delay": 0.3, "unload_delay": 0.1,
                 "extproc_args": ["--lost-replica-wait", "15s"]}
CONCURRENCY = 40
MAX_REQUESTS = 50_000  # a bound on every load loop besides its time


class Traffic:
    """Client workers over every pool's members, recording each outcome."""

    def __init__(self, stack: LocalStack, session: aiohttp.ClientSession, seed: int) -> None:
        self.stack, self.session = stack, session
        self.rng = random.Random(seed)
        self.outcomes: list[Outcome] = []
        self.deadline = 0.0

    async def run(self, duration: float) -> None:
        """CONCURRENCY workers, back to back, for ``duration`` seconds."""
        self.deadline = time.monotonic() + duration
        await asyncio.wait_for(asyncio.gather(*(self._worker() for _ in range(CONCURRENCY))),
                               duration + 60)

    async def _worker(self) -> None:
        while time.monotonic() < self.deadline and len(self.outcomes) < MAX_REQUESTS:
            members = POOLS[self.rng.choice(list(POOLS))]
            model = members[0] if self.rng.random() < 0.6 else self.rng.choice(members)
            self.outcomes.append(await attempt(self.session, self.stack, model, tokens=4,
                                               timeout=30))

    def served(self) -> int:
        return sum(1 for o in self.outcomes if o.status == 200)

    def without_retry_after(self) -> list[Outcome]:
        """Errors other than 503 (a 503 from us or Envoy's catch-all carries Retry-After)."""
        return [o for o in self.outcomes if o.status not in (0, 200, 503)]


async def serves_every_member(stack: LocalStack) -> None:
    """Every member of every pool is served again (a few tries each, a second apart): how
    many requests the fault let through depends on the machine's speed, that the pools come
    back does not."""
    async with aiohttp.ClientSession() as http:
        for members in POOLS.values():
            for member in members:
                for _ in range(10):
                    outcome = await attempt(http, stack, member, tokens=4, timeout=30)
                    if outcome.status == 200:
                        break
                    await asyncio.sleep(1.0)
                assert outcome.status == 200 and outcome.served_by == member, outcome


async def traffic_beside(stack: LocalStack, seed: int, duration: float,
                         fault: Callable[[], Awaitable[None]]) -> Traffic:
    """Mixed traffic (its choices drawn from ``seed``) for ``duration`` s, ``fault`` beside it."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as http:
        traffic = Traffic(stack, http, seed)
        await asyncio.gather(traffic.run(duration), fault())
    return traffic


async def comes_back(stack: LocalStack, recorder: ApiRecorder, traffic: Traffic,
                     fault: str) -> None:
    """Once the fault is over: the pools at rest, every member served again, every error an
    explicit 503 (Retry-After), and the invariant gate passed."""
    await at_rest(stack, timeout=60)
    print(f"{fault}: {len(traffic.outcomes)} requests, {traffic.served()} served, "
          f"the rest {Counter((o.status, o.code) for o in traffic.outcomes if o.status != 200)}")
    await serves_every_member(stack)
    assert traffic.without_retry_after() == []
    assert violations(stack, recorder.ordered(), traffic.outcomes) == []


async def test_rolling_restart_of_every_replica_under_mixed_traffic(
        stack: LocalStack, recorder: ApiRecorder) -> None:
    async def roll() -> None:
        await asyncio.sleep(2)
        for replica in stack.replicas:  # one by one, as a RollingUpdate does
            await asyncio.to_thread(replica.restart, 60)
            await asyncio.sleep(1)
    traffic = await traffic_beside(stack, 14, 25, roll)
    await comes_back(stack, recorder, traffic, "rolling restart")


async def test_throttled_lease_writes_defer_never_force(stack: LocalStack,
                                                        recorder: ApiRecorder) -> None:
    async def throttle() -> None:
        for _ in range(4):  # bursts of 429s on every Lease write, for ~12 s in all
            await asyncio.to_thread(emulator, stack, "faults/throttle",
                                    {"resource": "leases", "count": 20})
            await asyncio.sleep(3)
    traffic = await traffic_beside(stack, 15, 15, throttle)
    await comes_back(stack, recorder, traffic, "throttled lease writes")


async def test_soak_with_a_replica_killed_every_10s(stack: LocalStack,
                                                    recorder: ApiRecorder) -> None:
    swaps_before = sum(len(notices(stack, name, "SwapCompleted")) for name in POOLS)
    rng = random.Random(16)
    kills = 0

    async def kill_one_every_10s() -> None:
        nonlocal kills
        for _ in range(4):
            await asyncio.sleep(10)
            victim = rng.choice(stack.replicas)
            await asyncio.to_thread(victim.kill)
            kills += 1
            await asyncio.to_thread(victim.start, 60)  # same name: it takes its Leases back
    traffic = await traffic_beside(stack, 16, 45, kill_one_every_10s)
    await at_rest(stack, timeout=90)
    swaps = sum(len(notices(stack, name, "SwapCompleted")) for name in POOLS) - swaps_before
    print(f"replica soak: {len(traffic.outcomes)} requests, {traffic.served()} served, "
          f"{swaps} swaps, {kills} replicas killed")
    assert kills == 4 and traffic.served() >= 300 and swaps >= 3
    assert stack.metric("llmkube_modelpool_held_requests") == 0
    assert traffic.without_retry_after() == []
    # a killed replica's held streams end at Envoy's catch-all: 503 + Retry-After, JSON
    assert violations(stack, recorder.ordered(), traffic.outcomes) == []
