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
from extproc.platform.kube.leases import LeaseClient, LeaseConflict
from extproc.platform.contract import PoolLoad
from extproc.platform.kube.membership import MEMBER_ROLE, ROLE_LABEL, Load, Membership
from extproc.policy.model import PoolKey
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


async def leader_moves_after_a_full_duration(api: Any, namespace: str) -> None:
    """B takes the pool's leader Lease only once A's renews stopped for a whole duration on B's clock."""
    clock = ManualClock()
    a = LeaderLease(api, namespace, PoolKey(namespace, "shared-gpu"), "replica-a", Settings(), clock=clock)
    b = LeaderLease(api, namespace, PoolKey(namespace, "shared-gpu"), "replica-b", Settings(), clock=clock)
    assert a.name == f"modelpool-extproc-leader.{namespace}.shared-gpu"
    assert await a.try_acquire_or_renew() and a.is_leader() and a.epoch == 0
    assert not await b.try_acquire_or_renew() and not b.is_leader()
    clock.now += 5
    assert await a.try_acquire_or_renew()  # a renew: B sees the Lease change and restarts its wait
    assert not await b.try_acquire_or_renew()
    clock.now += a.renew_deadline  # A stops renewing: past its renew deadline it is no leader
    assert not a.is_leader()
    clock.now += a.duration - a.renew_deadline - 0.001  # a hair short of a full duration
    assert not await b.try_acquire_or_renew()
    clock.now += 0.001
    assert await b.try_acquire_or_renew() and b.is_leader() and b.epoch == 1
    assert not await a.try_acquire_or_renew()  # A, back, finds B holding a fresh Lease
    await b.release()
    assert not b.is_leader()
    assert await a.try_acquire_or_renew() and a.epoch == 2  # released: taken at once
    lease = await LeaseClient(api, namespace).get(a.name)
    assert lease is not None and (lease.holder, lease.transitions) == ("replica-a", 2)
