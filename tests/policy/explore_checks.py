"""The exhaustive search's judgements, written in the environment's words, not the machine's.

Every check here reads the cluster as the watch last delivered it (``Env.seen``) or as it is
(``Env.members``), with its own definitions (``explore_env.holds_gpu``, ``serves``), so a bug
in ``MemberObservation.ready`` or ``unloaded`` cannot hide itself: the machine is only asked
what it decided (its commands) and what it says (its notices). Three kinds of check:

* ``carry_out``: each command as the runtime would carry it out, refused when unsafe;
* ``check_state``: after every step, what must hold of any state (no hold past its budget, the
  book agrees with the clients, a stalled swap has said SwapStalled, fairness, no new request
  passing one held for the same member);
* ``blocked``: after the quiet horizon, whether something outside the service keeps a member
  from serving, exactly (the excuse for a refusal, which must then say the truth).

It also counts which rows of ``swap.TRANSITIONS`` fired (``FIRED``): a row no scenario fires
is a row the search does not check.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import TYPE_CHECKING

from explore_env import NAMES, TRIGGER, Env, holds_gpu, serves, wish
from extproc.policy import swap as swap_table
from extproc.policy.events import (Admit, CarrySlots, Hold, Notice, ProbeIdle, Reject,
                                   RequestArrived, Scale, Trigger)
from extproc.policy.model import Actuation

if TYPE_CHECKING:
    from explore import Node
    from extproc.policy.machine import PoolMachine

FIRED: set[int] = set()  # indexes into swap.TRANSITIONS of the rows some scenario fired


def _recording(index: int, edge: swap_table.Edge) -> swap_table.Edge:
    action = edge.action

    def recorded(m, now, out) -> None:  # type: ignore[no-untyped-def]
        FIRED.add(index)
        action(m, now, out)
    return replace(edge, action=recorded)


def record_rows() -> None:
    """Make every row of the table note when it fires (the search's coverage report)."""
    if getattr(swap_table, "_recorded", False):
        return
    rows = {id(e): _recording(i, e) for i, e in enumerate(swap_table.TRANSITIONS)}
    swap_table._BY_SOURCE = {stage: tuple(rows[id(e)] for e in edges)  # type: ignore[attr-defined]
                             for stage, edges in swap_table._BY_SOURCE.items()}
    swap_table._recorded = True  # type: ignore[attr-defined]


def row_name(index: int) -> str:
    """A row of the table in words: source --guard--> target (modes)."""
    e = swap_table.TRANSITIONS[index]
    guard = getattr(e.guard, "__qualname__", repr(e.guard)).split(".<locals>")[0]
    return f"{e.source.value} --{guard}--> {e.target.value}"


class Unsafe(AssertionError):
    """A command or a state the checks refuse (explore.Violation adds the trace)."""


def carry_out(node: Node, command: object) -> None:
    """Carry ``command`` out in ``node``'s environment, or raise ``Unsafe``."""
    m, env = node.machine, node.env
    match command:
        case Admit(rid, member):
            if not serves(env.seen_member(member)):
                raise Unsafe(f"request {rid} admitted to {member}, which the watch last showed "
                             f"as {env.seen_member(member)}")
            capacity = env.capacity if m.limits.paced_release else 0
            if capacity and sum(on == member for _, on in env.admitted) >= capacity:
                raise Unsafe(f"request {rid} admitted to {member}, already at its capacity "
                             f"of {capacity} (paced release)")
            if m.actuation is Actuation.FOLLOW and m.drain[1] not in ("", member):
                raise Unsafe(f"request {rid} admitted to {member} after the leader's "
                             f"announcement for {m.drain[1]}")
            node.env = replace(env, held=tuple(h for h in env.held if h[0] != rid),
                               admitted=env.admitted + ((rid, member),))
            node.answers[rid] = "admitted"
        case Hold(rid, member):
            node.env = replace(env, held=env.held + ((rid, member),))
        case Reject(rid, _, code, message):
            member = next((n for r, n in env.held if r == rid), "")
            swap = m.swap
            if "continues" in message and (swap is None or swap.stalled
                                           or swap.target != member):
                raise Unsafe(f"request {rid} was told the swap continues; it does not: "
                             f"{message}")
            node.env = replace(env, held=tuple(h for h in env.held if h[0] != rid))
            node.answers[rid] = f"{code}: {message}"
        case Scale(member, replicas):
            if replicas:
                holding = [o for o in NAMES if o != member and holds_gpu(env.seen_member(o))]
                if holding:
                    raise Unsafe(f"{member} scaled up while {holding[0]} holds the GPU as the "
                                 f"watch last showed it ({env.seen_member(holding[0])})")
                if any(n != member and r > 0 for n, r, _ in env.patches):
                    raise Unsafe(f"{member} scaled up while a scale-up of another is in flight")
            if not replicas and env.busy(member):
                raise Unsafe(f"{member} scaled down with a stream on it")
            node.env = wish(env, member, replicas, m.now + m.limits.write_landing)
        case Trigger(member):
            if env.seen_member(member).replicas:
                raise Unsafe(f"{member} triggered though the watch last showed it at "
                             f"{env.seen_member(member).replicas} replicas")
            node.env = replace(env, patches=env.patches + (
                (member, TRIGGER, m.now + m.limits.write_landing),))
        case ProbeIdle(member):
            node.env = replace(env, probes=env.probes + (member,))
        case CarrySlots(member, step):
            if not serves(env.seen_member(member)):  # (the cluster may have moved since)
                raise Unsafe(f"slot {step} of {member}, which the watch did not show Ready")
            if step == "save" and env.busy(member):
                raise Unsafe(f"slot save of {member} with a stream on it")
            node.env = replace(env, carries=env.carries + ((member, step),))
        case Notice("SwapStalled", _, _, target):
            node.said = (target, m.swap.started if m.swap else -1.0)
        case Notice("SwapResumed"):
            node.said = None


def check_state(node: Node, now: float, arrival: RequestArrived | None) -> None:
    """What must hold of every state the search reaches."""
    m, env = node.machine, node.env
    late = [rid for rid, held in m.requests.held.items() if held.deadline <= now]
    if late:
        raise Unsafe(f"requests {late} held past their budget")
    if set(m.requests.held) != {r for r, _ in env.held} or \
            dict(m.requests.in_flight) != dict(env.admitted):
        raise Unsafe("the machine's request book and the clients disagree")
    swap = m.swap
    if swap is not None and swap.stalled and node.said != (swap.target, swap.started):
        raise Unsafe(f"the swap to {swap.target} is stalled ({swap.stalled}) and SwapStalled "
                     "was never said")
    window = m.spec.fairness_window
    if arrival is not None and node.answers.get(arrival.rid) == "admitted" and swap is not None \
            and swap.target != arrival.member and window and now - swap.started >= window \
            and not swap.stalled:  # (a stalled trigger lets its resident serve: by design)
        raise Unsafe(f"request {arrival.rid} for the incumbent {arrival.member} admitted "
                     f"{now - swap.started:g}s into a swap to {swap.target}, past the fairness "
                     f"window of {window:g}s")


def overtakes(node: Node) -> str:
    """A member with held requests to which a new request would pass at once ("" if none):
    held requests go first (paced release: oldest first, as the room frees)."""
    m = node.machine
    for member in sorted({name for _, name in node.env.held}):
        probe = copy.deepcopy(m)
        probe.quick_path = False
        rid = node.env.rid + 1000
        out = probe.handle(RequestArrived(rid, member), m.now)
        if any(isinstance(c, Admit) and c.rid == rid for c in out):
            return member
    return ""


def blocked(env: Env, m: PoolMachine, name: str) -> str:
    """What outside the service keeps ``name`` from serving, exactly ("" : nothing does): it
    fails to load; another member's pod is stuck terminating (it holds the GPU); LLMKube keeps a
    failed member pending (its reconciler loads nothing else); another member's clients never
    end (it never drains); or the swap under way, to another member, is blocked so."""
    why = _blocked(env, name)
    target = m.swap.target if m.swap is not None else ""
    if not why and target not in ("", name) and _blocked(env, target):
        why = f"behind the swap to {target}: {_blocked(env, target)}"
    return why


def _blocked(env: Env, name: str) -> str:
    if name in env.fails:
        return f"{name} fails to load"
    stuck = [n for n in NAMES if n != name and env.member(n).stuck and env.member(n).pods]
    if stuck:
        return f"{stuck[0]}'s pod is stuck terminating"
    if env.llmkube and env.status[1] in env.fails and env.member(env.status[1]).phase == "Failed":
        return f"LLMKube keeps the failed {env.status[1]} pending"  # (its reconciler's rule)
    busy = [n for n in NAMES if n != name and env.endless and env.busy(n)]
    if busy:
        return f"{busy[0]}'s clients stream for ever"
    return ""
