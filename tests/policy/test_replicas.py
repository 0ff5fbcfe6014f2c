"""Several replicas in the pure policy (policy/replicas.py): the leader's two-phase drain over
its peers' acknowledgements, lost peers settled only by the idle probe or by time, follow mode,
the change of leader, and fail-closed admission. Each machine is driven by hand."""

from __future__ import annotations

import math

from extproc.policy.events import (AdmissionLease, Admit, DrainAnnounced, Hold, IdleProbed,
                                   LeadershipChanged, MemberObserved, Notice, PeersObserved,
                                   ProbeIdle, Reject, RequestArrived, RequestEnded, Scale,
                                   StatusObserved, Tick)
from extproc.policy.model import Actuation, PeerState, PoolKey, PoolStatus
from extproc.policy.model import MemberObservation as Obs
from extproc.policy import replicas
from extproc.policy.state import Stage
from harness import two_members

KEY = PoolKey("ns", "pool")
READY = dict(phase="Ready", replicas=1, pods=1)
STOPPED = dict(phase="Stopped", replicas=0, pods=0)

machine = two_members  # (harness.py)


def kinds(commands: list, kind: type) -> list:
    return [c for c in commands if isinstance(c, kind)]


def peer(acked: int = 0, *, in_flight: dict | None = None, held: dict | None = None,
         lost: bool = False, since: float = 0.0, name: str = "r2") -> PeerState:
    return PeerState(name, since, lost, acked, in_flight or {}, held or {})


def test_one_replica_is_unchanged_no_announcement_needed() -> None:
    m = machine()
    out = m.handle(RequestArrived(1, "b"), 1.0)
    assert Scale("a", 0) in out  # no peers: the drain is today's drain
    assert replicas.announcement(m) == "b"


def test_leader_unloads_only_after_every_live_peer_acknowledged_the_epoch_drained() -> None:
    m = machine()
    m.handle(PeersObserved((peer(in_flight={"a": 1}),)), 0.5)
    out = m.handle(RequestArrived(1, "b"), 1.0)
    assert kinds(out, Hold) and not kinds(out, Scale)
    assert replicas.announcement(m) == "b"
    assert not kinds(m.handle(DrainAnnounced(7, "b"), 1.1), Scale)  # announced, not acked
    # acknowledged, but one of its requests still streams on a
    assert not kinds(m.handle(PeersObserved((peer(7, in_flight={"a": 1}),)), 1.2), Scale)
    # an acknowledgement of an older epoch does not count
    assert not kinds(m.handle(PeersObserved((peer(6),)), 1.3), Scale)
    assert Scale("a", 0) in m.handle(PeersObserved((peer(7),)), 1.4)


def test_an_announcement_for_another_target_or_being_rewritten_is_not_used() -> None:
    m = machine()
    m.handle(PeersObserved((peer(3),)), 0.5)
    m.handle(DrainAnnounced(3, "a"), 0.6)  # an older announcement, for a
    assert not kinds(m.handle(RequestArrived(1, "b"), 1.0), Scale)
    assert not kinds(m.handle(DrainAnnounced(2, "b"), 1.1), Scale)  # epochs never go back
    assert m.drain[0] == 3 and m.drain[1] != "b"
    m.handle(PeersObserved((peer(4),)), 1.2)
    assert Scale("a", 0) in m.handle(DrainAnnounced(4, "b"), 1.3)


def test_a_wish_that_changes_back_waits_for_the_announcement_to_be_told_again() -> None:
    m = machine()
    m.handle(PeersObserved((peer(5),)), 0.5)
    m.handle(RequestArrived(1, "b"), 1.0)
    m.handle(DrainAnnounced(5, "b"), 1.1)  # in force: acked, the peer has nothing on a
    assert m.stage is Stage.UNLOAD


def test_peer_demand_starts_a_swap_on_the_leader() -> None:
    m = machine()
    out = m.handle(PeersObserved((peer(held={"b": 2}),)), 1.0)
    assert [n.kind for n in kinds(out, Notice)] == ["SwapStarted"]
    assert m.swap is not None and m.swap.target == "b"


def test_lost_peer_needs_the_idle_probe_or_the_wait() -> None:
    m = machine(lost_replica_wait=60.0)
    m.handle(PeersObserved((peer(lost=True, since=0.0),)), 0.5)
    out = m.handle(RequestArrived(1, "b"), 1.0)
    assert kinds(out, ProbeIdle) == [ProbeIdle("a")] and not kinds(out, Scale)
    out = m.handle(IdleProbed("a", False), 1.1)  # busy: deferred, asked again later
    assert not kinds(out, Scale) and m.stage is Stage.DRAIN
    out = m.handle(Tick(), 1.1 + m.limits.probe_retry)
    assert kinds(out, ProbeIdle) == [ProbeIdle("a")]
    assert Scale("a", 0) in m.handle(IdleProbed("a", True), 1.2 + m.limits.probe_retry)


def test_lost_peer_settles_by_time_when_no_probe_can_tell() -> None:
    m = machine(lost_replica_wait=30.0, probe_retry=100.0)
    m.handle(PeersObserved((peer(lost=True, since=0.0),)), 0.5)
    m.handle(RequestArrived(1, "b"), 1.0)
    m.handle(IdleProbed("a", None), 1.1)  # cannot tell
    assert math.isclose(m.next_deadline(), 30.0)  # the wait ends before the probe retry
    assert Scale("a", 0) in m.handle(Tick(), 30.0)


def test_follower_holds_the_incumbent_from_the_announcement_and_releases_on_status() -> None:
    m = machine(Actuation.FOLLOW)
    assert kinds(m.handle(RequestArrived(1, "a"), 1.0), Admit)
    m.handle(DrainAnnounced(4, "b"), 1.1)
    assert m.drain == (4, "b")  # what its membership Lease acknowledges
    out = m.handle(RequestArrived(2, "a"), 1.2)
    assert kinds(out, Hold) and not kinds(out, Admit)
    out = m.handle(RequestArrived(3, "b"), 1.3)
    assert kinds(out, Hold) and not kinds(out, Scale)  # a follower never actuates
    m.handle(RequestEnded(1), 1.4)
    m.handle(MemberObserved(Obs("a", **STOPPED)), 2.0)
    assert not kinds(m.handle(MemberObserved(Obs("b", **READY)), 3.0), Admit)
    out = m.handle(StatusObserved(PoolStatus(resident="b")), 3.1)
    assert [a.rid for a in kinds(out, Admit)] == [3]  # b's request; a's waits for a swap back


def test_follower_holds_while_the_status_names_a_pending_member() -> None:
    m = machine(Actuation.FOLLOW)
    m.handle(StatusObserved(PoolStatus(resident="a", pending="b")), 1.0)
    assert kinds(m.handle(RequestArrived(1, "a"), 1.1), Hold)


def test_new_leader_resumes_the_swap_and_drains_again() -> None:
    m = machine(Actuation.FOLLOW)
    m.handle(LeadershipChanged(False), 0.1)  # start-up: no Notice
    m.handle(DrainAnnounced(4, "b"), 1.0)
    m.handle(RequestArrived(1, "b"), 1.1)
    assert m.stage is Stage.TRIGGERED
    m.handle(PeersObserved((peer(4, name="r3"),)), 1.2)
    out = m.handle(LeadershipChanged(True), 2.0)
    assert [n.kind for n in kinds(out, Notice)][:1] == ["ActuationChanged"]
    assert m.actuation is Actuation.OWN
    assert Scale("a", 0) in out  # the announcement in force is for b, the peer obeys it


def test_first_leadership_answer_is_silent() -> None:
    m = machine(Actuation.FOLLOW)
    out = m.handle(LeadershipChanged(True), 0.1)
    assert m.actuation is Actuation.OWN and not kinds(out, Notice)


def test_deposed_leader_follows_and_holds_the_incumbent() -> None:
    m = machine()
    m.handle(PeersObserved((peer(),)), 0.5)
    m.handle(RequestArrived(1, "b"), 1.0)
    m.handle(LeadershipChanged(False), 2.0)
    assert m.actuation is Actuation.FOLLOW and m.stage is Stage.TRIGGERED
    assert kinds(m.handle(RequestArrived(2, "a"), 2.1), Hold)


def test_llmkube_mode_ignores_peers() -> None:
    m = machine(Actuation.LLMKUBE)
    m.handle(PeersObserved((peer(in_flight={"a": 3}, held={"b": 1}),)), 0.5)
    out = m.handle(RequestArrived(1, "b"), 1.0)
    assert [c.member for c in out if type(c).__name__ == "Trigger"] == ["b"]


def test_admission_closes_at_the_lease_and_held_requests_wait() -> None:
    m = machine()
    m.handle(AdmissionLease(5.0), 0.0)
    assert kinds(m.handle(RequestArrived(1, "a"), 1.0), Admit)
    assert kinds(m.handle(RequestArrived(3, "b"), 2.0), Hold)  # a swap waits for request 1
    out = m.handle(RequestArrived(2, "a"), 5.0)
    [reject] = kinds(out, Reject)
    assert (reject.status, reject.code, reject.retry_after) == (503, "replica_unavailable", 1)
    assert Scale("a", 0) in m.handle(RequestEnded(1), 5.5)
    m.handle(MemberObserved(Obs("a", **STOPPED)), 6.0)
    out = m.handle(MemberObserved(Obs("b", **READY)), 7.0)
    assert [n.kind for n in kinds(out, Notice)] == ["SwapCompleted"] and not kinds(out, Admit)
    assert [a.rid for a in kinds(m.handle(AdmissionLease(20.0), 8.0), Admit)] == [3]


def test_follower_gives_up_a_swap_the_leader_dropped() -> None:
    m = machine(Actuation.FOLLOW)
    m.handle(DrainAnnounced(2, "b"), 1.0)
    m.handle(StatusObserved(PoolStatus(resident="a", pending="b")), 1.1)
    assert m.stage is Stage.TRIGGERED and kinds(m.handle(RequestArrived(1, "a"), 1.2), Hold)
    m.handle(DrainAnnounced(3, ""), 2.0)  # a cancelled reclaim, a new leader's other choice
    out = m.handle(StatusObserved(PoolStatus(resident="a")), 2.1)
    assert m.stage is Stage.IDLE and [a.rid for a in kinds(out, Admit)] == [1]
    assert kinds(m.handle(RequestArrived(2, "a"), 2.2), Admit)


def test_a_leadership_blip_while_unloading_asks_again_for_the_scale_down() -> None:
    m = machine()
    out = m.handle(RequestArrived(1, "b"), 1.0)
    assert Scale("a", 0) in out and m.stage is Stage.UNLOAD
    m.handle(LeadershipChanged(False), 12.0)  # the runtime drops the wish that never landed
    assert Scale("a", 0) in m.handle(LeadershipChanged(True), 14.0)


def test_the_next_swap_waits_for_peers_to_release_what_they_hold_for_the_new_resident() -> None:
    m = machine()
    m.handle(PeersObserved((peer(held={"b": 2}),)), 1.0)  # the peer's demand starts a->b
    m.handle(DrainAnnounced(1, "b"), 1.1)
    m.handle(PeersObserved((peer(1, held={"b": 2}),)), 1.2)
    m.handle(MemberObserved(Obs("a", **STOPPED)), 2.0)
    m.handle(RequestArrived(1, "a"), 2.5)  # demand for a, here
    out = m.handle(MemberObserved(Obs("b", **READY)), 3.0)
    assert [n.kind for n in kinds(out, Notice)] == ["SwapCompleted"]
    assert m.swap is None  # not straight back to a: the peer's two requests for b go first
    out = m.handle(PeersObserved((peer(1, in_flight={"b": 2}),)), 3.1)
    assert m.swap is not None and m.swap.target == "a"
