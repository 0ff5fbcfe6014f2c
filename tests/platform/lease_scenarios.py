"""Lease scenarios run against the emulator (tests/platform) and the real kube-apiserver
(tests/kube_real): the Lease client, two memberships, the leader handover. Each takes the
service's own `KubeClient` and a namespace, and asserts what must hold on either server."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devstack.testkit import eventually
from extproc.platform.kube.leader import LeaderLease
from extproc.platform.kube._calls import KUBE_REQUESTS
from extproc.platform.kube.leases import LeaseClient, LeaseConflict
from extproc.platform.contract import PoolLoad
from extproc.names import ROLE_LABEL
from extproc.platform.kube.membership import MEMBER_ROLE, Load, Membership
from extproc.settings import Settings

# short Leases so the loops turn quickly; the ratios are the defaults' (renew << duration - margin)
QUICK = Settings(membership_lease_duration=3.0, membership_renew=0.2, lease_margin=0.5,
                 membership_write_interval=0.05)


POOL = "ml/shared-gpu"
clock_now = time.monotonic


class ManualClock:
    """A monotonic clock the test moves by hand, so "a full duration" is exact, not slept."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Counts:
    """A replica's mutable Load, read by its membership on each write."""

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}
        self.held: dict[str, int] = {}

    def __call__(self) -> Load:
        return Load({POOL: PoolLoad(0, dict(self.in_flight), dict(self.held))})


@contextlib.asynccontextmanager
async def member(api: Any, namespace: str, identity: str, counts: Counts,
                 settings: Settings = QUICK) -> AsyncIterator[Membership]:
    """A started Membership, stopped (Lease deleted) when the block ends."""
    membership = Membership(api, namespace, identity, counts, settings)
    await membership.start()
    try:
        yield membership
    finally:
        await membership.stop()


async def stale_renew_conflicts(api: Any, namespace: str) -> None:
    """Create, renew with a payload, then a renew and a delete from the old version: LeaseConflict."""
    leases = LeaseClient(api, namespace)
    first = await leases.create("lease-a", holder="replica-a", duration_seconds=10,
                                labels={"t": "x"}, payload={"n": 1})
    with pytest.raises(LeaseConflict):
        await leases.create("lease-a", holder="replica-b", duration_seconds=10)
    renewed = await leases.renew(first, holder="replica-a", duration_seconds=10, payload={"n": 2})
    assert renewed.resource_version != first.resource_version
    with pytest.raises(LeaseConflict):
        await leases.renew(first, holder="replica-b", duration_seconds=10, transitions=1)
    with pytest.raises(LeaseConflict):
        await leases.delete(first)
    read = await leases.get("lease-a")
    assert read is not None
    assert (read.holder, read.payload, read.transitions, read.labels, read.duration_seconds) == \
        ("replica-a", {"n": 2}, 0, {"t": "x"}, 10)
    assert [lease.name for lease in await leases.list("t=x")] == ["lease-a"]
    await leases.delete(read)
    assert await leases.get("lease-a") is None
    await leases.delete(read)  # gone already: nothing to do, no error


async def memberships_see_each_other(api: Any, namespace: str) -> None:
    """Two replicas publish counts, see each other's, and a stopped one's Lease goes at once."""
    a_counts, b_counts = Counts(), Counts()
    a_counts.in_flight["coder"] = 2
    async with member(api, namespace, "replica-a", a_counts) as a:
        async with member(api, namespace, "replica-b", b_counts) as b:
            assert a.is_valid() and b.is_valid()
            seen_by_b = await eventually(lambda: [p for p in b.peers() if p.pools], 10, "b sees a")
            assert [(p.identity, p.lost, p.pools) for p in seen_by_b] == \
                [("replica-a", False, {POOL: PoolLoad(0, {"coder": 2}, {})})]
            b_counts.held["writer"] = 3
            b.request_write()  # held 0 -> 3: published before the next renew is due

            def a_sees_b_holding() -> bool:
                return any(p.pools and p.pools[POOL].held == {"writer": 3} for p in a.peers())
            await eventually(a_sees_b_holding, 10, "a sees b's held count")
            assert await LeaseClient(api, namespace).get(b.name) is not None
        assert await LeaseClient(api, namespace).get("modelpool-extproc-replica-b") is None
        await eventually(lambda: not a.peers(), 10, "a drops the replica that left")


async def silent_peer_is_lost_with_unknown_counts(api: Any, namespace: str) -> None:
    """A peer Lease that stops changing (a SIGSTOPped or cut-off replica) is lost after its
    duration + margin on our clock: its counts are then unknown, not zero, and its Lease stays."""
    leases = LeaseClient(api, namespace)
    published = Load({POOL: PoolLoad(3, {"coder": 1}, {})})
    silent = await leases.create("modelpool-extproc-replica-b", holder="replica-b",
                                 duration_seconds=int(QUICK.membership_lease_duration),
                                 labels={ROLE_LABEL: MEMBER_ROLE}, payload=published.to_payload())
    async with member(api, namespace, "replica-a", Counts()) as a:
        [peer] = a.peers()
        assert (peer.identity, peer.lost, peer.pools) == ("replica-b", False, published.pools)
        [lost] = await eventually(lambda: [p for p in a.peers() if p.lost], 15, "b lost")
        assert lost.identity == "replica-b" and lost.pools is None
        assert clock_now() - lost.silent_since > QUICK.membership_lease_duration + QUICK.lease_margin
    assert await leases.get(silent.name) is not None  # only a clean leave deletes a Lease


def _calls() -> float:
    return sum(s.value for m in KUBE_REQUESTS.collect() for s in m.samples
               if s.name.endswith("_total"))


async def leader_moves_after_a_full_duration(api: Any, namespace: str) -> None:
    """B takes the replica set's leader Lease only once A's renews stopped for a whole duration
    on B's clock, as B's Lease watch showed them; while A renews, B sends nothing."""
    clock, leases = ManualClock(), LeaseClient(api, namespace)
    a = LeaderLease(api, namespace, "replica-a", Settings(), clock=clock)
    b = LeaderLease(api, namespace, "replica-b", Settings(), clock=clock)
    assert a.name == b.name == "modelpool-extproc-leader"  # one for every pool
    assert await a.try_acquire_or_renew() and a.is_leader() and a.epoch == 0
    assert not await b.try_acquire_or_renew() and not b.is_leader()  # (B read it once)
    for _ in range(3):
        clock.now += 2
        before = _calls()
        assert await a.try_acquire_or_renew()  # a renew is one write, no read first
        assert _calls() - before == 1
        b.observe(await leases.get(a.name))  # B's Lease watch shows it: B restarts its wait
        before = _calls()
        assert not await b.try_acquire_or_renew()
        assert _calls() == before  # a candidate sends nothing while the holder renews
    clock.now += a.renew_deadline  # A stops renewing: past its renew deadline it is no leader
    assert not a.is_leader()
    clock.now += a.duration - a.renew_deadline - 0.001  # a hair short of a full duration
    assert not await b.try_acquire_or_renew()
    clock.now += 0.001
    assert await b.try_acquire_or_renew() and b.is_leader() and b.epoch == 1
    assert not await a.try_acquire_or_renew()  # A, back, writes from a stale version: refused
    assert not await a.try_acquire_or_renew() and not a.is_leader()  # re-read: B holds it
    await b.release()
    assert not b.is_leader()
    a.observe(await leases.get(a.name))
    assert await a.try_acquire_or_renew() and a.epoch == 2  # released: taken at once
    lease = await leases.get(a.name)
    assert lease is not None and (lease.holder, lease.transitions) == ("replica-a", 2)


async def a_candidate_that_missed_a_renew_is_refused(api: Any, namespace: str) -> None:
    """B's watch missed A's renews: at what B takes for a full duration of silence, its write
    carries the version it saw, the API refuses it, and B reads the Lease and waits again."""
    clock = ManualClock()
    a = LeaderLease(api, namespace, "replica-a", Settings(), clock=clock)
    b = LeaderLease(api, namespace, "replica-b", Settings(), clock=clock)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    clock.now += a.duration - 1
    assert await a.try_acquire_or_renew()  # B never hears of it
    clock.now += 1.001
    assert not await b.try_acquire_or_renew() and not b.is_leader()
    assert a.is_leader() and (await LeaseClient(api, namespace).get(a.name)).holder == "replica-a"
    assert not await b.try_acquire_or_renew()  # read again: A's renew is news, B waits anew
    clock.now += a.duration - 0.5
    assert await a.try_acquire_or_renew() and a.is_leader()


async def announcements_continue_across_leaders(api: Any, namespace: str) -> None:
    """Each change of a pool's drain announcement takes the next value of one counter, kept
    in the Lease: a pool's epochs only grow, across leaders too; a pool with no target has no
    entry and reads as (counter, "")."""
    clock, leases = ManualClock(), LeaseClient(api, namespace)
    a = LeaderLease(api, namespace, "replica-a", Settings(), clock=clock)
    b = LeaderLease(api, namespace, "replica-b", Settings(), clock=clock)
    for lead in (a, b):
        lead.add_pool("ml/p1")
        lead.add_pool("ml/p2")

    async def drains() -> dict[str, list[object]]:
        lease = await leases.get(a.name)
        assert lease is not None
        return lease.payload["drains"]

    async def counter() -> int:
        lease = await leases.get(a.name)
        assert lease is not None
        return lease.payload["counter"]

    a.announce("ml/p1", "x")
    assert await a.try_acquire_or_renew() and await drains() == {"ml/p1": [1, "x"]}
    a.announce("ml/p2", "y")
    assert await a.try_acquire_or_renew()
    assert await drains() == {"ml/p1": [1, "x"], "ml/p2": [2, "y"]}
    a.announce("ml/p1", "")  # ended: the entry goes, p1 now reads (3, "")
    assert await a.try_acquire_or_renew() and await drains() == {"ml/p2": [2, "y"]}
    assert await counter() == 3 and a.announced.of("ml/p1") == (3, "")
    await a.release()
    assert await drains() == {"ml/p2": [2, "y"]}  # a release keeps them for the next leader
    b.announce("ml/p2", "y")  # the new leader's machine resumes the swap it found
    b.announce("ml/p1", "x")
    assert await b.try_acquire_or_renew() and b.is_leader()
    assert await drains() == {"ml/p1": [4, "x"], "ml/p2": [2, "y"]}
    b.remove_pool("ml/p2")
    assert await b.try_acquire_or_renew() and await drains() == {"ml/p1": [4, "x"]}
    assert await counter() == 5
