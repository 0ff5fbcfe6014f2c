"""Soak: 60 s of mixed-model load at 500 concurrent client streams over two pools, with random
client disconnects and random member faults (loads failing for a while), then every invariant:
exclusive slot, no request to a member that could not serve it, no silent misroute, gauges
back to zero, and no growth of the ext_proc's memory, descriptors or threads."""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
from faultkit import at_rest, attempt, violations
from invariants import ApiRecorder, Outcome, find_pid, resource_growth, sample_process

from devstack.procs import LOCALHOST
from devstack.stack import LocalStack
from e2e_support import notices, pools

DURATION = 60.0
WARMUP = 10.0  # the process sample is taken after this much load (caches and pools built)
CONCURRENCY = 500
MAX_REQUESTS = 200_000  # a bound on the loop besides time
FAULT_EVERY = 6.0
SEED = 8

POOLS = {"soak1": ["soak1-a", "soak1-b", "soak1-c"], "soak2": ["soak2-a", "soak2-b"]}
STACK_OPTIONS = {"load_delay": 0.3, "unload_delay": 0.1}
STACK_DOCS = pools(*((name, members, {"default": members[0], "swap_budget": "5s",
                                      "fairness_window": "2s"})
                     for name, members in POOLS.items()))


class Load:
    """The client side of the soak: workers, their outcomes, and the random faults."""

    def __init__(self, stack: LocalStack, session: aiohttp.ClientSession) -> None:
        self.stack, self.session = stack, session
        self.rng = random.Random(SEED)
        self.outcomes: list[Outcome] = []
        self.faults_injected = 0
        self.deadline = 0.0

    def _model(self) -> str:
        members = POOLS[self.rng.choice(list(POOLS))]
        # Mostly the pool's first two members, so both coalescing and swaps happen.
        return members[0] if self.rng.random() < 0.6 else self.rng.choice(members)

    async def worker(self) -> None:
        """Requests back to back until the deadline; some streamed, some abandoned midway."""
        while time.monotonic() < self.deadline and len(self.outcomes) < MAX_REQUESTS:
            model = self._model()
            request = attempt(self.session, self.stack, model, stream=self.rng.random() < 0.2,
                              tokens=8, timeout=20)
            patience = self.rng.uniform(0.01, 1.0) if self.rng.random() < 0.05 else None
            try:
                self.outcomes.append(await asyncio.wait_for(request, patience))
            except asyncio.TimeoutError:  # the client hangs up midway, on purpose
                self.outcomes.append(Outcome(model, gave_up=True))

    async def faults(self) -> None:
        """Every few seconds make a random member's loads fail for 3 s.

        Pod kills are exercised on their own, where their in-flight casualties can be told
        apart from misroutes: test_process_faults.py::test_swap_right_after_the_resident_pod_dies.
        """
        while time.monotonic() < self.deadline - FAULT_EVERY:
            await asyncio.sleep(FAULT_EVERY)
            member = self.rng.choice([m for ms in POOLS.values() for m in ms])
            await asyncio.to_thread(self.stack.annotate, member, "sim.llmkube.dev/fail", "true")
            self.faults_injected += 1
            await asyncio.sleep(3)
            await asyncio.to_thread(self.stack.annotate, member, "sim.llmkube.dev/fail", None)


async def test_soak(stack: LocalStack, recorder: ApiRecorder) -> None:
    pid = find_pid(f"{LOCALHOST}:{stack.ports.extproc}")
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    # Tasks alive with no traffic (watches, the status publisher, the servers' own).
    tasks_idle = await asyncio.to_thread(stack.metric, "modelpool_extproc_event_loop_tasks")
    async with aiohttp.ClientSession(connector=connector) as session:
        load = Load(stack, session)
        load.deadline = time.monotonic() + DURATION
        workers = [asyncio.create_task(load.worker()) for _ in range(CONCURRENCY)]
        faults = asyncio.create_task(load.faults())
        await asyncio.sleep(WARMUP)
        before = sample_process(pid)
        await asyncio.wait_for(asyncio.gather(*workers, faults), DURATION + 60)
    await at_rest(stack, timeout=60)
    after = sample_process(pid)
    tasks_after = await asyncio.to_thread(stack.metric, "modelpool_extproc_event_loop_tasks")

    served = [o for o in load.outcomes if o.status == 200]
    swaps = sum(len(notices(stack, name, "SwapCompleted")) for name in POOLS)
    print(f"soak: {len(load.outcomes)} requests, {len(served)} served, {swaps} swaps, "
          f"{load.faults_injected} member faults, ext_proc {before} -> {after}")
    assert len(served) >= 1000 and swaps >= 5  # the soak did exercise the system
    assert violations(stack, recorder.ordered(), load.outcomes) == []
    assert resource_growth(before, after) == []
    # At rest again, no request's task is left behind (a few background ones may come and go).
    assert tasks_after <= tasks_idle + 5, (tasks_idle, tasks_after)
    # Every fault healed: each pool serves its first member again (after any failure backoff).
    async with aiohttp.ClientSession() as session:
        for members in POOLS.values():
            assert await healed(session, stack, members[0])


async def healed(session: aiohttp.ClientSession, stack: LocalStack, member: str) -> bool:
    """Whether ``member`` serves again within a bound (its failure backoff is 30 s)."""
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        final = await attempt(session, stack, member, timeout=30)
        if (final.status, final.served_by) == (200, member):
            return True
        assert final.status == 503 and final.code, final  # explicit while it recovers
        await asyncio.sleep(1)
    return False
