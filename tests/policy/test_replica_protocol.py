"""The two-phase drain as a protocol: one leader and two followers, each a real PoolMachine,
joined by a simulated cluster whose every message (status, member observations, the leader
Lease's announcement, the membership Leases' counts) arrives after a random delay.

Seeded random runs check the guarantee docs/design/replicas.md asks of several replicas: the leader
never asks a member down while any replica still streams from it, and no replica admits a request
to a member the leader has asked down (it would be cut off when the pods go)."""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable

import pytest

from extproc.platform.contract import PoolLoad
from extproc.policy import replicas
from extproc.policy.events import (
    Admit,
    DrainAnnounced,
    MemberObserved,
    PeersObserved,
    RequestArrived,
    RequestEnded,
    Scale,
    StatusObserved,
    Tick,
)
from extproc.policy.machine import PoolMachine
from extproc.policy.model import Actuation, PeerState, PoolKey, PoolSpec, PoolStatus
from extproc.policy.model import MemberObservation as Obs
from harness import limits

KEY = PoolKey("ns", "pool")
MEMBERS = ("a", "b", "c")
NAMES = ("leader", "f1", "f2")


class Cluster:
    """Replicas, the API's state, and a queue of messages in flight."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now = 0.0
        self.queue: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        spec = PoolSpec(KEY, MEMBERS, default="a", fairness_window=1.0, swap_budget=30.0)
        self.machines = {name: PoolMachine(spec, limits(drain_linger=0.0), 0.0,
                                           actuation=Actuation.OWN if name == "leader"
                                           else Actuation.FOLLOW) for name in NAMES}
        self.replicas = {m: 1 if m == "a" else 0 for m in MEMBERS}  # spec.replicas
        self.ready = {m: m == "a" for m in MEMBERS}
        self.pods = {m: 1 if m == "a" else 0 for m in MEMBERS}
        self.lease = (0, "")  # the leader Lease's announcement for this pool
        self.counter = 0  # the Lease's one counter (other pools' announcements move it too)
        self.seen_own = (0, "")  # ... as the leader's own Lease watch last showed it
        self.writing = False
        self.loads: dict[str, PoolLoad] = {}  # membership Leases as landed
        self.rids = itertools.count(1)
        self.streams: dict[int, tuple[str, str]] = {}  # rid -> (replica, member)
        self.asked_down: set[str] = set()
        self.violations: list[str] = []
        self.delivered: dict[str, float] = {}
        self.leader_peers: dict[str, PoolLoad] = {}  # the membership Leases the leader saw
        # Every replica's membership Lease exists before it reads pool state
        # (docs/design/replicas.md), so the leader knows its peers from the start.
        for name in NAMES[1:]:
            self.leader_peers[name] = self.loads[name] = PoolLoad()
        self.machines["leader"].handle(PeersObserved(self.peer_states()), 0.0)
        for name in NAMES:
            self.feed(name, StatusObserved(PoolStatus(resident="a")))
            for m in MEMBERS:
                self.feed(name, MemberObserved(self.obs(m)))

    # ---- the message queue ------------------------------------------------------------------

    def later(self, action: Callable[[], None], low: float = 0.001, high: float = 0.08) -> None:
        heapq.heappush(self.queue, (self.now + self.rng.uniform(low, high), next(self.seq),
                                    action))

    def watch(self, name: str, action: Callable[[], None]) -> None:
        """Deliver through channel ``name`` (a replica's watch, one object's writer): after a
        lag, in the order sent."""
        at = max(self.now + self.rng.uniform(0.001, 0.08), self.delivered.get(name, 0.0))
        self.delivered[name] = at
        heapq.heappush(self.queue, (at, next(self.seq), action))

    def run(self, until: float) -> None:
        while self.queue and self.queue[0][0] <= until:
            self.now, _, action = heapq.heappop(self.queue)
            action()

    # ---- replicas ------------------------------------------------------------------------

    def feed(self, name: str, event: object) -> None:
        machine = self.machines[name]
        before = (machine.drain[0], dict(machine.requests.held_by),
                  {m: machine.requests.busy(m) for m in MEMBERS})
        for command in machine.handle(event, self.now):
            self.execute(name, command)
        after = (machine.drain[0], dict(machine.requests.held_by),
                 {m: machine.requests.busy(m) for m in MEMBERS})
        if name == "leader":
            self.leader_wants(replicas.announcement(machine))
            # one writer per object: its writes land in the order sent
            self.watch("status-writer", lambda v=machine.view(): self.status_lands(v))
        elif after != before:
            self.watch(f"lease-writer-{name}",
                       lambda n=name, load=self.load_of(machine): self.membership_lands(n, load))

    def execute(self, name: str, command: object) -> None:
        if isinstance(command, Admit):
            if command.member in self.asked_down:
                self.violations.append(f"{self.now:.3f} {name} admitted to {command.member} "
                                       "after the leader asked it down")
            self.streams[command.rid] = (name, command.member)
            self.later(lambda rid=command.rid: self.stream_ends(rid), 0.01, 0.6)
        elif isinstance(command, Scale):
            assert name == "leader", "a follower actuated"
            if command.replicas == 0:
                busy = [f"{n}:{m}" for rid, (n, m) in self.streams.items() if m == command.member]
                if busy:
                    self.violations.append(f"{self.now:.3f} {command.member} asked down while "
                                           f"{busy} stream from it")
                self.asked_down.add(command.member)
            else:
                self.asked_down.discard(command.member)
            self.later(lambda c=command: self.scaled(c.member, c.replicas))

    @staticmethod
    def load_of(machine: PoolMachine) -> PoolLoad:
        book = machine.requests
        return PoolLoad(machine.drain[0], {m: book.busy(m) for m in MEMBERS if book.busy(m)},
                        dict(book.held_by))

    def membership_lands(self, name: str, load: PoolLoad) -> None:
        self.loads[name] = load
        self.watch("leader", lambda: self.leader_sees(name, load))

    def leader_sees(self, name: str, load: PoolLoad) -> None:
        self.leader_peers[name] = load
        self.feed("leader", PeersObserved(self.peer_states()))

    def peer_states(self) -> tuple[PeerState, ...]:
        return tuple(PeerState(n, self.now, False, lo.acked, lo.in_flight, lo.held)
                     for n, lo in sorted(self.leader_peers.items()))

    def stream_ends(self, rid: int) -> None:
        name, _ = self.streams.pop(rid)
        self.feed(name, RequestEnded(rid))

    # ---- the leader Lease --------------------------------------------------------------------

    def leader_wants(self, target: str) -> None:
        if not self.writing and target != self.lease[1]:
            self.writing = True
            self.later(self.lease_written)
        elif not self.writing and target == self.lease[1] and self.seen_own == self.lease:
            self.later(lambda t=self.lease: self.told_at_rest(t), 0.0005, 0.002)

    def lease_written(self) -> None:
        want = replicas.announcement(self.machines["leader"])
        # the counter's next value (other pools' announcements may have taken some); an
        # ended announcement has no entry and reads as (counter, "")
        self.counter += self.rng.choice((1, 1, 2, 5))
        self.lease = (self.counter, want)
        self.writing = False
        self.lease_shown()
        self.leader_wants(replicas.announcement(self.machines["leader"]))

    def lease_shown(self) -> None:
        for name in NAMES:  # the Lease watch brings it to every replica, the leader too
            self.watch(name, lambda n=name, a=self.lease: self.announcement_seen(n, a))

    def other_pool_announces(self) -> None:
        """Another pool's announcement moves the counter: this pool, with no entry, reads a
        newer epoch with no target."""
        if not self.writing and not self.lease[1] and \
                not replicas.announcement(self.machines["leader"]):
            self.counter += 1
            self.lease = (self.counter, "")
            self.lease_shown()
        self.later(self.other_pool_announces, 0.05, 0.6)

    def announcement_seen(self, name: str, announced: tuple[int, str]) -> None:
        if name != "leader":
            self.feed(name, DrainAnnounced(*announced))
            return
        self.seen_own = announced  # our own write, after every Lease event before it
        self.told_at_rest(announced)

    def told_at_rest(self, announced: tuple[int, str]) -> None:
        leader = self.machines["leader"]
        if announced == self.lease == self.seen_own and not self.writing and \
                replicas.announcement(leader) == announced[1] and leader.drain != announced:
            self.feed("leader", DrainAnnounced(*announced))

    # ---- the API's objects -------------------------------------------------------------------

    def status_lands(self, view: object) -> None:
        status = PoolStatus(resident=view.resident, pending=view.pending)
        for name in NAMES[1:]:
            self.watch(name, lambda n=name: self.feed(n, StatusObserved(status)))

    def obs(self, member: str) -> Obs:
        phase = "Ready" if self.ready[member] else ("Stopped" if not self.pods[member]
                                                    else "Progressing")
        return Obs(member, phase=phase, replicas=self.replicas[member], pods=self.pods[member])

    def scaled(self, member: str, count: int) -> None:
        self.replicas[member] = count
        if count == 0:
            self.ready[member] = False
            self.later(lambda: self.pods_gone(member), 0.05, 0.2)
        else:
            self.pods[member] = 1
            self.later(lambda: self.became_ready(member), 0.1, 0.4)
        self.observed(member)

    def pods_gone(self, member: str) -> None:
        if self.replicas[member] == 0:
            self.pods[member] = 0
            self.observed(member)

    def became_ready(self, member: str) -> None:
        if self.replicas[member] > 0:
            self.ready[member] = True
            self.observed(member)

    def observed(self, member: str) -> None:
        for name in NAMES:
            self.watch(name, lambda n=name, o=self.obs(member): self.feed(n, MemberObserved(o)))

    # ---- clients -----------------------------------------------------------------------------

    def arrive(self) -> None:
        name = self.rng.choice(NAMES)
        member = self.rng.choice(MEMBERS) if self.rng.random() < 0.4 else "a"
        self.feed(name, RequestArrived(next(self.rids), member))


@pytest.mark.parametrize("seed", range(40))
def test_no_replica_streams_from_or_admits_to_a_member_the_leader_asked_down(seed: int) -> None:
    cluster = Cluster(seed)
    if seed % 2:  # the Lease is shared by every pool: others' announcements move its counter
        cluster.later(cluster.other_pool_announces, 0.05, 0.6)
    for step in range(400):
        cluster.run(cluster.now + cluster.rng.uniform(0.0, 0.05))
        cluster.arrive()
        if step % 25 == 0:
            for name in NAMES:
                cluster.later(lambda n=name: cluster.feed(n, Tick()))
    cluster.run(cluster.now + 60.0)
    assert cluster.violations == []
    leader = cluster.machines["leader"]
    swaps = leader.history
    assert swaps is not None and cluster.asked_down, "the run made no swap: it tested nothing"
