"""Leases, memberships and the leader Lease against the API emulator, including what only the
emulator can play on cue: an unreachable API server and a stopped (silent) replica."""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from extproc.platform.contract import PoolLoad
from extproc.platform.kube.membership import Load

from kube_helpers import NS, eventually
from lease_scenarios import (
    QUICK,
    Counts,
    a_candidate_that_missed_a_renew_is_refused,
    announcements_continue_across_leaders,
    leader_moves_after_a_full_duration,
    member,
    memberships_see_each_other,
    silent_peer_is_lost_with_unknown_counts,
    stale_renew_conflicts,
)


async def test_stale_renew_conflicts(emulator: Any, api: Any) -> None:
    await stale_renew_conflicts(api, NS)


async def test_memberships_see_each_other(emulator: Any, api: Any) -> None:
    await memberships_see_each_other(api, NS)
    assert emulator.list("leases", NS) == []  # both stopped: no Lease left behind


async def test_leader_moves_after_a_full_duration(emulator: Any, api: Any) -> None:
    await leader_moves_after_a_full_duration(api, NS)


async def test_a_candidate_that_missed_a_renew_is_refused(emulator: Any, api: Any) -> None:
    await a_candidate_that_missed_a_renew_is_refused(api, NS)


async def test_announcements_continue_across_leaders(emulator: Any, api: Any) -> None:
    await announcements_continue_across_leaders(api, NS)


async def test_unrenewable_replica_reports_itself_invalid(emulator: Any, api: Any) -> None:
    async with member(api, NS, "replica-a", Counts()) as a:
        await eventually(lambda: a.failed_renews == 0 and len(_renews(emulator)) >= 2, 10,
                         "two renews landed")
        cut_at = time.monotonic()
        await _switch_unavailable(emulator, True)
        # every renew now fails: validity stops where the last one that landed put it
        await eventually(lambda: a.failed_renews >= 2, 10, "renews failing")
        assert a.valid_until <= cut_at + QUICK.membership_lease_duration - QUICK.lease_margin
        await eventually(lambda: not a.is_valid(), 10, "a stops counting itself valid")
        await _switch_unavailable(emulator, False)
        await eventually(a.is_valid, 10, "a valid again once a renew lands")


async def test_silent_peer_is_lost_with_unknown_counts(emulator: Any, api: Any) -> None:
    await silent_peer_is_lost_with_unknown_counts(api, NS)


async def test_renew_answered_429_is_a_failed_renew(emulator: Any, api: Any) -> None:
    async with member(api, NS, "replica-a", Counts()) as a:
        emulator.throttle_writes("leases", 3)
        await eventually(lambda: a.failed_renews >= 3, 10, "three throttled renews")
        assert emulator.handler.throttled == {("coordination.k8s.io", "leases"): 0}
        await eventually(lambda: a.failed_renews == 3 and a.is_valid() and
                         len(_renews(emulator)) > 3, 10, "renews landing again")


def _renews(emulator: Any) -> list[Any]:
    return [r for r in emulator.requests if r.resource == "leases" and r.verb == "update"]


async def _switch_unavailable(emulator: Any, on: bool) -> None:
    """The emulator's outage switch, over HTTP as the e2e fault suite flips it."""
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.post("/_emulator/unavailable", json={"on": on}) as response:
            assert await response.json() == {"on": on}


def test_a_pool_at_rest_is_left_out_of_the_membership_lease() -> None:
    busy = PoolLoad(acked=2, in_flight={"a": 1}, held={"b": 3})
    payload = Load({"ns/idle": PoolLoad(), "ns/busy": busy}).to_payload()
    assert list(payload["pools"]) == ["ns/busy"]  # a thousand idle pools: an empty map
    assert Load.from_payload(payload) == Load({"ns/busy": busy})
