"""One leader Lease for the replica set, against the API emulator: what the replicas send at
rest does not grow with the pools, announcements reach the followers through the Lease watch,
and a leader that dies hands every pool over at once."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from kube_helpers import NS, eventually
from extproc.platform.kube.leader import LeaderLease
from extproc.platform.kube.coordination import Replicas
from extproc.policy.model import PoolKey, PoolSpec, StartHints
from extproc.settings import Settings

POOLS = [PoolKey(NS, f"pool-{i}") for i in range(40)]
QUICK = dict(membership_lease_duration=3.0, membership_renew=0.5, lease_margin=0.5,
             leader_lease_duration=2.0, leader_renew_deadline=1.5, leader_retry=0.25,
             api_retry_initial=0.05, api_retry_max=0.5, lease_namespace=NS, namespaces=[NS])


class Machines:
    """A listener standing for the runtime: what each pool's machine was told."""

    def __init__(self) -> None:
        self.leading: dict[PoolKey, bool] = {}
        self.announced: dict[PoolKey, tuple[int, str]] = {}
        self.told: Counter[PoolKey] = Counter()  # announcements heard, per pool

    def pool_changed(self, spec: PoolSpec, hints: StartHints) -> None:
        """Nothing to do."""

    def pool_removed(self, key: PoolKey) -> None:
        """Nothing to do."""

    def admission_changed(self, until: float) -> None:
        """Nothing to do."""

    def peers_changed(self, peers: object) -> None:
        """Nothing to do."""

    def leadership_changed(self, key: PoolKey, leading: bool) -> None:
        """Record."""
        self.leading[key] = leading

    def drain_announced(self, key: PoolKey, epoch: int, target: str) -> None:
        """Record."""
        self.announced[key] = (epoch, target)
        self.told[key] += 1

    def replica_load(self) -> dict:
        """Nothing held, nothing in flight."""
        return {}

    def leads_all(self) -> bool:
        """Told it leads every pool."""
        return all(self.leading.get(key) for key in POOLS)


@contextlib.asynccontextmanager
async def replica(api: Any, name: str) -> AsyncIterator[tuple[Replicas, Machines]]:
    """A replica's Lease machinery serving every pool of POOLS, until the block ends."""
    fresh = asyncio.Event()
    fresh.set()
    replicas = Replicas(api, Settings(replica_name=name, **QUICK), lambda: fresh)
    machines = Machines()
    await replicas.start()
    listener = replicas.attach(machines)
    task = asyncio.create_task(replicas.run())
    for key in POOLS:
        listener.pool_changed(PoolSpec(key, ("a", "b"), default="a"), StartHints())
    try:
        yield replicas, machines
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_at_rest_the_replicas_send_the_same_few_lease_calls_whatever_the_pools(
        emulator: Any, api: Any) -> None:
    async with replica(api, "replica-a") as (a, seen_a), replica(api, "replica-b") as (b, seen_b):
        await eventually(lambda: seen_a.leads_all() or seen_b.leads_all(), 10, "one leads all")
        leader, follower = (seen_a, seen_b) if seen_a.leads_all() else (seen_b, seen_a)
        assert not any(follower.leading.values())
        await asyncio.sleep(1.0)  # the takeover's writes and watch events behind us
        emulator.requests.clear()
        await asyncio.sleep(2.0)
        leases = [r for r in emulator.requests if r.resource == "leases"]
        # one leader Lease for every pool, renewed by its holder without a read; the follower
        # watches it and sends nothing for it; each replica renews its own membership
        names = {lease["metadata"]["name"] for lease in emulator.list("leases", NS)}
        assert names == {"modelpool-extproc-leader", "modelpool-extproc-replica-a",
                         "modelpool-extproc-replica-b"}
        assert {r.verb for r in leases} == {"update"}, leases
        renews = [r for r in leases if r.name == "modelpool-extproc-leader"]
        assert 2 <= len(renews) <= 2.0 / QUICK["leader_retry"] + 2, renews
        assert len(leases) - len(renews) <= 2 * (2.0 / QUICK["membership_renew"] + 2)
        # the leader's machines heard "no announcement" once in force; nothing more since
        assert set(leader.announced.values()) == {(0, "")} and follower.announced == {}


async def test_a_drain_announcement_reaches_the_follower_and_the_leader_at_rest(
        emulator: Any, api: Any) -> None:
    async with replica(api, "replica-a") as (a, seen_a), replica(api, "replica-b") as (b, seen_b):
        await eventually(lambda: seen_a.leads_all() or seen_b.leads_all(), 10, "one leads all")
        (lead, led), (follow, followed) = sorted(
            [(a, seen_a), (b, seen_b)], key=lambda pair: not pair[1].leads_all())
        lead.announce(POOLS[7], "b")
        lead.announce(POOLS[3], "a")
        await eventually(lambda: followed.announced.get(POOLS[7], (0, ""))[1] == "b"
                         and followed.announced.get(POOLS[3], (0, ""))[1] == "a", 10,
                         "the follower sees both announcements")
        await eventually(lambda: all(led.announced.get(key) == followed.announced[key]
                                     for key in (POOLS[3], POOLS[7])), 10,
                         "the leader's machines hear them once in force")
        assert followed.announced[POOLS[7]][0] != followed.announced[POOLS[3]][0]
        epoch = followed.announced[POOLS[7]][0]
        lead.announce(POOLS[7], "")  # the swap is done: the pool's entry goes
        await eventually(lambda: followed.announced[POOLS[7]][1] == "", 10, "ended")
        ended = followed.announced[POOLS[7]][0]
        assert ended > epoch  # an ended announcement reads as a newer epoch
        lead.announce(POOLS[7], "a")
        await eventually(lambda: followed.announced[POOLS[7]][1] == "a", 10, "the next one")
        assert followed.announced[POOLS[7]][0] > ended  # a pool's epochs only grow
        assert followed.announced[POOLS[3]][1] == "a"  # the other pool's drain stays


async def test_a_dead_leaders_pools_are_all_led_again_within_the_lease_duration(
        emulator: Any, api: Any) -> None:
    async with replica(api, "replica-b") as (b, seen_b):
        async with replica(api, "replica-a") as (a, seen_a):
            await eventually(lambda: seen_b.leads_all(), 10, "the first replica leads all")
            b.announce(POOLS[5], "b")
            await eventually(lambda: seen_a.announced.get(POOLS[5], (0, ""))[1] == "b", 10,
                             "announced")
            # b dies: its leader loop stops without releasing anything (a SIGKILL)
            assert b._task is not None
            b._task.cancel()
            loop = asyncio.get_running_loop()
            killed = loop.time()
            await eventually(lambda: seen_a.leads_all(), 10, "the other replica leads all")
            took = loop.time() - killed
            assert took < QUICK["leader_lease_duration"] + 3, took
            # the new leader's machines heard the dead leader's announcement as followers;
            # its first write ends it unless its machine wants it (here: it does not)
            await eventually(lambda: seen_a.announced.get(POOLS[5], (0, "b"))[1] == "", 10,
                             "ended")


async def test_a_renew_that_lands_after_the_lead_ran_out_is_a_new_term(
        emulator: Any, api: Any) -> None:
    """While a slow renew was in flight the lead ran out by our clock and writes were refused;
    when it lands the machines hear the lead lost and taken again (so they write again)."""
    now = [1000.0]
    lead = LeaderLease(api, NS, "replica-a", Settings(**QUICK), clock=lambda: now[0])
    renew, calls = lead.leases.renew, []

    async def slow_second_renew(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        answered = await renew(*args, **kwargs)
        if len(calls) == 1:
            now[0] += 1.0  # the next renew is sent 1 s after this one
        elif len(calls) == 2:
            # answered 1.6 s after the first one was sent: past its renew deadline (1.5 s),
            # though within this one's, so after it the lead looks unbroken
            now[0] += 0.6
        return answered

    lead.leases.renew = slow_second_renew  # type: ignore[method-assign]
    changes: list[bool] = []
    task = asyncio.create_task(lead.run(on_change=changes.append))
    try:
        await eventually(lambda: len(calls) >= 3, 10, "three renews")
        assert changes[:3] == [True, False, True], changes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_one_pools_announcements_are_told_to_no_other_pool(emulator: Any, api: Any) -> None:
    async with replica(api, "replica-a") as (a, seen_a), replica(api, "replica-b") as (b, seen_b):
        await eventually(lambda: seen_a.leads_all() or seen_b.leads_all(), 10, "one leads all")
        (lead, led), (_, followed) = sorted(
            [(a, seen_a), (b, seen_b)], key=lambda pair: not pair[1].leads_all())
        await eventually(lambda: all(led.told[key] for key in POOLS), 10, "in force at rest")
        at_rest = dict(led.told)
        for target in ("b", "", "a", ""):  # two swaps of one pool: the Lease's counter moves
            lead.announce(POOLS[7], target)
            await eventually(lambda: followed.announced.get(POOLS[7], (0, ""))[1] == target
                             and led.announced[POOLS[7]] == followed.announced[POOLS[7]],
                             10, f"{target!r} in force")
        # the other pools' machines heard nothing of it, on either replica
        others = [key for key in POOLS if key != POOLS[7]]
        assert [key for key in others if followed.told[key]] == []
        assert [key for key in others if led.told[key] != at_rest[key]] == []
        assert led.told[POOLS[7]] == at_rest[POOLS[7]] + 4 and followed.told[POOLS[7]] == 4
