"""The environment of the exhaustive search: a small cluster, LLMKube's reconciler and clients.

Everything here is a frozen value, so a state of the search is the real ``PoolMachine`` (copied)
plus one ``Env``. The environment is asynchronous: anything that may happen next is a move,
with no timers of its own (a load that takes 15 s or 15 min is the same move, early or late
against the machine's deadlines, which are the only clock jumps). Moves are split in two:

* progress: what a well-behaved cluster does by itself: a watch delivers a changed object,
  one of our patches lands, the kubelet takes a pod one step towards its spec, LLMKube's
  reconciler runs a pass, an idle probe answers truthfully, a slot save or restore is done,
  a client's stream ends;
* faults, bounded per trace: a foreign scale-up or scale-down (kubectl, an admin), another writer's
  status, LLMKube's stale pass (it decides from a pool read taken before its own ``pendingMember``
  write: docs/design/llmkube.md), a trigger refused by its resourceVersion, a pod stuck
  terminating, an idle probe that cannot tell, a watch re-list, a client leaving while held, a slot
  save or restore that fails (one never answered is time passing to its timeout).

LLMKube's reconciler is modelled from what its source does (docs/design/llmkube.md): the owner is a
member scaled up that is neither resident nor pending (a newer request), else the pending member,
else the resident, else ``spec.default``; every other member goes to 0 unless Ready and busy; the
owner is held at 0 (and recorded pending) while any other member has replicas or pods, and named
resident once Ready.

As a follower, the replica that leads the pool plays the same part (``lead``): it announces a
target under a new epoch in its leader Lease (for the member this replica holds requests for),
scales the incumbent down only once this replica acknowledged that epoch with nothing in flight
on it, loads the target once the others' pods are gone, and names it resident once Ready; a
member scaled up behind its back makes it announce the resident (its converging swap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from extproc.policy.model import MemberObservation, PoolStatus

NAMES = ("a", "b", "c")
STATUS = "status"
LEASE = "lease"  # the pool's leader Lease: its drain announcement (follow mode)
TRIGGER = -1  # a patch that is our llmkube trigger (0 -> 1 under a resourceVersion)


@dataclass(frozen=True, slots=True)
class Member:
    """One InferenceService and its pods, as the API server and kubelet have them."""

    replicas: int = 0
    pods: int = 0
    phase: str = "Stopped"
    stuck: bool = False  # its pod never finishes terminating (a node problem: not ours)


READY = Member(1, 1, "Ready")


@dataclass(frozen=True, slots=True)
class Env:
    """Everything outside the machine: the cluster, what the watch has not delivered yet, our
    writes in flight, the clients, and what may still happen (arrivals and faults left)."""

    llmkube: bool
    members: tuple[Member, ...]
    follow: bool = False  # another replica leads the pool (own mode); it acts through ``lead``
    epoch: int = 0  # the leader Lease's announcement: epoch and target
    announced: str = ""
    status: tuple[str, str] = ("", "")  # LLMKube's (residentMember, pendingMember)
    foreign: bool = False  # own mode: another writer rewrote the status
    dirty: frozenset[str] = frozenset()  # objects changed since the watch last delivered them
    # our scale patches and triggers in flight: (member, replicas, by when it lands or fails:
    # sent, the API client's request timeout later, Limits.write_landing; inf: not sent yet)
    patches: tuple[tuple[str, int, float], ...] = ()
    probes: tuple[str, ...] = ()  # idle probes asked, not answered
    admitted: tuple[tuple[int, str], ...] = ()  # streams on a member: (rid, member)
    held: tuple[int, ...] = ()
    rid: int = 1  # the next request's id
    arrivals: int = 2
    faults: int = 1
    fails: frozenset[str] = frozenset()  # members whose load ends Failed (the scenario's)
    capacity: int = 0  # what every member takes at once under paced release (0: unpaced)
    carry: bool = False  # every member carries its prompt cache over swaps (carry.py)
    carries: tuple[tuple[str, str], ...] = ()  # slot saves and restores asked, not answered
    # Each member as the watch last delivered it (None: as ``members`` at the start, where the
    # search hands every member to the machine): the safety checks judge the machine by what
    # it could know, in their own words, not its.
    seen: tuple[Member, ...] | None = None
    endless: bool = False  # admitted streams never end (clients that keep the incumbent busy)
    edits: bool = False  # the fault may be an operator removing a member from the pool's spec

    def __post_init__(self) -> None:
        if self.seen is None:
            object.__setattr__(self, "seen", self.members)

    def member(self, name: str) -> Member:
        """The member called ``name``."""
        return self.members[NAMES.index(name)]

    def with_member(self, name: str, member: Member) -> Env:
        """This environment with ``name`` changed (and marked for the watch)."""
        i = NAMES.index(name)
        if self.members[i] == member:
            return self
        members = self.members[:i] + (member,) + self.members[i + 1:]
        return replace(self, members=members, dirty=self.dirty | {name})

    def with_status(self, resident: str, pending: str) -> Env:
        """This environment with LLMKube's status written (and marked for the watch)."""
        if (resident, pending) == self.status:
            return self
        return replace(self, status=(resident, pending), dirty=self.dirty | {STATUS})

    def seen_member(self, name: str) -> Member:
        """``name`` as the watch last delivered it to the machine."""
        return self.seen[NAMES.index(name)]  # type: ignore[index]

    def delivered(self, name: str) -> Env:
        """This environment once the watch delivered ``name`` as it is now."""
        seen = list(self.seen)  # type: ignore[arg-type]
        seen[NAMES.index(name)] = self.member(name)
        return replace(self, seen=tuple(seen))

    def busy(self, name: str) -> bool:
        """A stream of ours is on ``name`` (what its idle probe would say)."""
        return any(m == name for _, m in self.admitted)

    def observe(self, name: str) -> MemberObservation:
        """What a watch event for ``name`` carries."""
        m = self.member(name)
        return MemberObservation(name, True, m.phase, m.replicas, m.pods, self.capacity,
                                 self.carry)

    def pool_status(self) -> PoolStatus:
        """What a watch event for the ModelPool's status carries."""
        if self.llmkube:
            return PoolStatus(resident=self.status[0], pending=self.status[1], llmkube=True)
        if self.follow:
            return PoolStatus(resident=self.status[0], pending=self.status[1])
        return PoolStatus(resident=self.status[0], foreign=self.foreign)

    def broken(self) -> bool:
        """Something outside our control keeps a swap from completing (a stuck pod, a failing
        member): there a refused request is fine if it is told the truth."""
        return bool(self.fails) or any(m.stuck for m in self.members)


def kubelet_step(env: Env, name: str) -> Env | None:
    """One step of the member's controller and kubelet towards its spec (None: at rest)."""
    m = env.member(name)
    if m.replicas == 0:
        if m.pods and not m.stuck:
            return env.with_member(name, Member(0, 0, "Stopped"))
        if m.phase != "Stopped":
            return env.with_member(name, replace(m, phase="Stopped"))
        return None
    if not m.pods or m.phase == "Stopped":
        return env.with_member(name, replace(m, pods=max(1, m.pods), phase="Creating"))
    if m.phase == "Creating":
        return env.with_member(name, replace(m, phase="Failed" if name in env.fails else "Ready"))
    return None


def reconcile(env: Env, default: str, members: tuple[str, ...] = NAMES,
              stale: bool = False) -> Env | None:
    """One pass of LLMKube's ModelPoolReconciler over the spec's ``members`` (None: it
    changes nothing; a member removed from the spec is no longer its to touch).

    ``stale``: the pass decides from a pool read taken before its own ``pendingMember`` write
    (the race docs/design/llmkube.md records), so it sees no pending member; its status write lands.
    """
    resident, pending = env.status
    if stale or pending not in members:
        pending = ""
    requested = [n for n in members
                 if env.member(n).replicas >= 1 and n not in (resident, pending)]
    owner = requested[0] if requested else (pending or resident or default)
    out = env
    for name in members:
        m = env.member(name)
        if name != owner and m.replicas and not (m.phase == "Ready" and env.busy(name)):
            out = out.with_member(name, replace(m, replicas=0))
    others_hold = any(out.member(n).replicas or out.member(n).pods
                      for n in members if n != owner)
    mine = out.member(owner)
    if others_hold:
        out = out.with_member(owner, replace(mine, replicas=0))
        out = out.with_status(resident, owner if owner != resident else "")
    else:
        out = out.with_member(owner, replace(mine, replicas=1))
        ready = mine.phase == "Ready" and mine.pods and mine.replicas
        out = out.with_status(owner, "") if ready else \
            out.with_status(resident, owner if owner != resident else "")
    return None if out == env else out


def holds_gpu(m: Member) -> bool:
    """The member holds (or is about to hold) the GPU: scaled up, a pod left (a terminating
    one still holds memory), or a phase its controller only leaves once the workload is down.
    The checks' own definition, independent of ``MemberObservation.unloaded``."""
    return m.replicas > 0 or m.pods > 0 or m.phase in ("Creating", "Ready")


def serves(m: Member) -> bool:
    """The member serves requests: Ready, scaled up, with its pod (independent of
    ``MemberObservation.ready``; Failed is not Ready)."""
    return m.phase == "Ready" and m.replicas > 0 and m.pods > 0


def wish(env: Env, name: str, replicas: int, by: float) -> Env:
    """Our Scale reaching the scaler (runtime/scaling.py): one worker per member, latest wish
    wins. The patch on the wire (the member's first) still lands; behind it only the newest
    wish waits, and none if it equals the one on the wire (the worker then stops). ``by``:
    when a patch sent now has landed (or failed)."""
    mine = [i for i, (n, r, _) in enumerate(env.patches) if n == name and r != TRIGGER]
    rest = tuple(p for i, p in enumerate(env.patches) if i not in mine[1:])
    if mine and env.patches[mine[0]][1] == replicas:
        return replace(env, patches=rest)
    return replace(env, patches=rest + ((name, replicas, math.inf if mine else by),))


def land(env: Env, index: int, by: float) -> Env:
    """Our patch ``index`` reaches the API server (a trigger only where replicas are still 0:
    its resourceVersion precondition refuses it otherwise); the member's next wish is sent
    now, to land by ``by``."""
    name, replicas, _ = env.patches[index]
    rest = env.patches[:index] + env.patches[index + 1:]
    queued = [i for i, (n, r, _) in enumerate(rest) if n == name and r != TRIGGER]
    if replicas != TRIGGER and queued:
        n, r, _ = rest[queued[0]]
        rest = rest[:queued[0]] + ((n, r, by),) + rest[queued[0] + 1:]
    m = env.member(name)
    if replicas == TRIGGER:
        changed = env.with_member(name, replace(m, replicas=1)) if m.replicas == 0 else env
    else:
        changed = env.with_member(name, replace(m, replicas=replicas))
    return replace(changed, patches=rest)


def landable(env: Env) -> list[int]:
    """Patches that may land next: the oldest per member (the scaler applies them in order)."""
    seen: set[str] = set()
    out = []
    for i, (name, _, _) in enumerate(env.patches):
        if name not in seen:
            seen.add(name)
            out.append(i)
    return out


def announce(env: Env, target: str) -> Env:
    """The leader announces ``target`` under a new epoch (and says so in the status; a swap
    back to a resident that lost its pods names no resident meanwhile)."""
    resident = env.status[0]
    out = replace(env, epoch=env.epoch + 1, announced=target, dirty=env.dirty | {LEASE})
    if not target:
        return out.with_status(resident, "")
    return out.with_status(resident if target != resident else "", target)


def _serving(env: Env, name: str) -> bool:
    m = env.member(name)
    return name == env.status[0] and m.phase == "Ready" and bool(m.replicas and m.pods)


def lead(env: Env, held_by: dict[str, int], acked: int) -> Env | None:
    """One step of the replica leading the pool (None: nothing to do). ``held_by``: this
    replica's held requests per member; ``acked``: the epoch it acknowledged."""
    target = env.announced
    if not target or _serving(env, target):
        wanted = next((n for n in NAMES if held_by.get(n) and not _serving(env, n)), "")
        resident = env.status[0]
        if not wanted and _serving(env, resident) and target != resident and any(
                env.member(n).replicas for n in NAMES if n != resident):
            wanted = resident  # a member scaled up behind its back: converge, announced too
        return announce(env, wanted) if wanted else None
    for name in NAMES:
        m = env.member(name)
        if name != target and m.replicas:
            if acked != env.epoch or env.busy(name):
                return None  # two-phase drain: unload only after the acknowledgement
            return env.with_member(name, replace(m, replicas=0))
    if any(env.member(n).pods for n in NAMES if n != target):
        return None
    mine = env.member(target)
    if not mine.replicas:
        return env.with_member(target, replace(mine, replicas=1))
    if mine.phase == "Ready" and mine.pods:
        return env.with_status(target, "")
    return None
