"""Leases, memberships and the leader Lease against the API emulator, including what only the
emulator can play on cue: an unreachable API server and a stopped (silent) replica."""

from __future__ import annotations

import time
from typing import Any

from kube_helpers import NS, eventually
from lease_scenarios import (
    QUICK,
    Counts,
    leader_moves_after_a_full_duration,
    member,
    memberships_see_each_other,
    stale_renew_conflicts,
)


async def test_stale_renew_conflicts(emulator: Any, api: Any) -> None:
    await stale_renew_conflicts(api, NS)


async def test_memberships_see_each_other(emulator: Any, api: Any) -> None:
    await memberships_see_each_other(api, NS)
    assert emulator.list("leases", NS) == []  # both stopped: no Lease left behind


async def test_leader_moves_after_a_full_duration(emulator: Any, api: Any) -> None:
    await leader_moves_after_a_full_duration(api, NS)


async def test_unrenewable_replica_reports_itself_invalid(emulator: Any, api: Any) -> None:
    async with member(api, NS, "replica-a", Counts()) as a:
        await eventually(lambda: a.failed_renews == 0 and len(_renews(emulator)) >= 2, 10,
                         "two renews landed")
        cut_at = time.monotonic()
        emulator.set_unavailable(True)
        # every renew now fails: validity stops where the last one that landed put it
        await eventually(lambda: a.failed_renews >= 2, 10, "renews failing")
        assert a.valid_until <= cut_at + QUICK.membership_lease_duration - QUICK.lease_margin
        await eventually(lambda: not a.is_valid(), 10, "a stops counting itself valid")
        emulator.set_unavailable(False)
        await eventually(a.is_valid, 10, "a valid again once a renew lands")


async def test_silent_peer_is_lost_with_unknown_counts(emulator: Any, api: Any) -> None:
    b_counts = Counts()
    b_counts.in_flight["ml/coder"] = 1
    async with member(api, NS, "replica-a", Counts()) as a, \
            member(api, NS, "replica-b", b_counts) as b:
        await eventually(lambda: [p.load for p in a.peers()] == [b_counts()], 10, "a sees b")
        assert b._task is not None
        b._task.cancel()  # b goes silent without leaving, like a SIGSTOPped or cut-off replica
        [lost] = await eventually(lambda: [p for p in a.peers() if p.lost], 10, "b lost")
        assert lost.identity == "replica-b" and lost.load is None  # unknown, not zero
        assert lost.silent_for > QUICK.membership_lease_duration + QUICK.lease_margin
        assert emulator.get("leases", b.name, NS) is not None  # still there: not a clean leave


async def test_renew_answered_429_is_a_failed_renew(emulator: Any, api: Any) -> None:
    async with member(api, NS, "replica-a", Counts()) as a:
        emulator.throttle_writes("leases", 3)
        await eventually(lambda: a.failed_renews >= 3, 10, "three throttled renews")
        assert emulator.handler.throttled == {("coordination.k8s.io", "leases"): 0}
        await eventually(lambda: a.failed_renews == 3 and a.is_valid() and
                         len(_renews(emulator)) > 3, 10, "renews landing again")


def _renews(emulator: Any) -> list[Any]:
    return [r for r in emulator.requests if r.resource == "leases" and r.verb == "update"]
