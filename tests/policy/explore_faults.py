"""The exhaustive search's moves that are not progress: clients arriving, and faults.

A fault is what the environment may do at most ``Env.faults`` times per trace (one, in every
scenario): foreign writes, a stuck pod, LLMKube's stale pass, a refused trigger, a slot step that
fails or is never answered, a probe that cannot tell, a client leaving while held, a re-list,
(where the scenario allows edits) an operator removing a member from the pool,
and as a follower the leader giving a swap up or dying. An operator's resume of a hands-off
pool is offered too, once, and is no fault. ``explore.Search.moves`` offers them
after the progress moves, never to a quiet cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from explore_env import NAMES, STATUS, TRIGGER, announce, reconcile
from extproc.policy.model import Actuation
from extproc.policy.events import (CarryAnswered, DrainAnnounced, Event, IdleProbed,
                                   LeadershipChanged, MemberObserved, RequestArrived,
                                   RequestEnded, SpecChanged, StatusObserved)

if TYPE_CHECKING:
    from explore import Node


def clients_and_faults(node: Node, add: Callable[..., None]) -> None:
    """Add the moves of clients (arrivals) and of faults (one per trace) enabled in ``node``."""
    env, m = node.env, node.machine
    if env.arrivals:
        for name in m.spec.members:
            add(f"request {env.rid} for {name} arrives",
                replace(env, rid=env.rid + 1, arrivals=env.arrivals - 1),
                RequestArrived(env.rid, name))
    if m.actuation is Actuation.HANDS_OFF and not m.spec.resume:
        # not a fault: an operator ends the spell at once (names.RESUME_ANNOTATION), maybe
        # while a scale-up of ours sent before it is still on the wire
        add("an operator resumes the pool (annotation)", env,
            SpecChanged(replace(m.spec, resume="1")))
    if not env.faults:
        return
    fault = replace(env, faults=env.faults - 1)
    for name in NAMES:
        member = env.member(name)
        if member.replicas == 0:
            add(f"FAULT someone scales {name} up", fault.with_member(
                name, replace(member, replicas=1)))
        else:
            add(f"FAULT someone scales {name} down", fault.with_member(
                name, replace(member, replicas=0)))
        if member.replicas == 0 and member.pods and not member.stuck:
            add(f"FAULT {name}'s terminating pod gets stuck",
                fault.with_member(name, replace(member, stuck=True)))
    if env.llmkube and env.status[1]:
        stale = reconcile(fault, m.spec.default, m.spec.members, stale=True)
        if stale is not None:
            add(f"FAULT LLMKube's stale pass: status {stale.status}, "
                f"replicas {[x.replicas for x in stale.members]}", stale)
    if env.follow:
        if env.announced and env.announced != env.status[0]:
            add(f"FAULT the leader gives the swap to {env.announced} up",
                announce(fault, ""))
        add("FAULT the leader dies: this replica takes the lead",
            replace(fault, follow=False), LeadershipChanged(True))
    if not env.llmkube and not env.follow and not env.foreign:
        add("FAULT another writer rewrites the status", replace(
            fault, foreign=True, status=(m.resident, ""), dirty=env.dirty | {STATUS}))
    if env.edits:
        for name in m.spec.members:
            if name != m.spec.default:
                add(f"FAULT an operator removes {name} from the pool", fault, SpecChanged(
                    replace(m.spec, members=tuple(n for n in m.spec.members if n != name),
                            generation=m.spec.generation + 1)))
    for i, (name, replicas, _) in enumerate(env.patches):
        if replicas == TRIGGER:
            add(f"FAULT our trigger of {name} is refused (resourceVersion)", replace(
                fault, patches=env.patches[:i] + env.patches[i + 1:]))
    if env.carries:
        name, step = env.carries[0]
        add(f"FAULT the slot {step} of {name} fails", replace(
            fault, carries=env.carries[1:]), CarryAnswered(name, step, False, "fault"))
        add(f"FAULT the slot {step} of {name} is never answered", replace(
            fault, carries=env.carries[1:]))
    if env.probes:
        add(f"FAULT the idle probe of {env.probes[0]} cannot tell",
            replace(fault, probes=env.probes[1:]), IdleProbed(env.probes[0], None))
    for rid, name in env.held:
        add(f"FAULT the client of held request {rid} leaves", replace(
            fault, held=tuple(h for h in env.held if h[0] != rid)), RequestEnded(rid))
    relisted: list[Event] = [MemberObserved(env.observe(n)) for n in NAMES
                             if n in m.spec.members or n in m.departing]
    if env.llmkube or env.follow or env.foreign:
        relisted.append(StatusObserved(env.pool_status()))
    if env.follow:
        relisted.append(DrainAnnounced(env.epoch, env.announced))
    add("FAULT the watches restart and re-list", replace(
        fault, dirty=frozenset(), seen=env.members), *relisted)

