"""The transition table of a pool's machine: every edge from one stage to the next.

Rules of this file
------------------
* ``TRANSITIONS`` is the whole graph. Each row is an edge: the stage it leaves, the guard
  that must hold, the stage it enters, the action that goes with it, and the gate saying
  what the pool must look like for the edge to be considered at all. Nothing outside this
  file changes ``Swap.stage`` or starts, completes, fails or cancels a swap (the one
  exception, a change of hands between modes, is explained in ``modes.py``). The file owns
  no state of its own: the swap under way is ``PoolMachine.swap``.
* Guards only read (``pool.PoolReader``). Actions change the swap under way (``state.Swap``,
  the table's own record) directly, and the machine only through its methods
  (``pool.PoolWriter``: ``set_resident``, ``begin_swap``, ``end_swap``, ``record_failure``,
  ``scale``, ``admit``, ``defer`` ...), never by assigning its attributes. Methods rather than
  returned values: an action makes several changes in an order that matters (end the swap,
  then name the resident, then release its requests), which reads best written as it happens.
* After every event, ``advance`` follows the first edge of the current stage whose gate and
  guard hold, again and again, until none does. A self-loop (a stage to itself) is allowed
  when its action makes its own guard false, which ``advance`` checks by counting passes.

Gates
-----
ALWAYS   the edge needs no observation: time and spec only (timeout, cancellation).
SEEN     every member has been observed; the edge makes no replica change, so it also runs
         while the pool is Degraded (a Ready target still takes the slot).
HEALTHY  every member observed and none missing: the edge may change replicas.

The graph
---------
Own mode (this service drains, unloads and loads)::

    Idle      --resident missing, a member Ready-->            Idle (adopt it)
    Idle      --held request whose member is serving-->        Idle (admit it)
    Idle      --a member is wanted-->                           Draining
    Idle      --swapPolicy reclaim, resident idle long enough-->  Draining (back to default)
    Idle      --reclaim-down, resident idle long enough-->      Draining (a release: no target)
    Draining  --a reclaim whose slot is wanted again-->         Idle (cancelled)
    Draining  --others idle and calm, idle gate on-->           Probing
    Draining  --others idle and calm, here and on live peers-->  Unloading
    Probing   --a request came in for another member-->         Draining
    Probing   --a runtime said busy or could not tell-->        Draining (deferred)
    Probing   --every runtime said idle-->                      Unloading
    Unloading --another member still scaled up (or asked up)-->  Unloading (scale it to 0)
    Unloading --a release, and a member is wanted-->            Unloading (a swap to it)
    Unloading --a release, every member gone-->                 Idle (cold: no resident)
    Unloading --every other member gone (pods too, and no write
                of ours may still bring it up: landing.py)-->   Loading (scale target to 1)
    Loading   --target Ready-->                                 Idle (held requests admitted)
    Loading   --another member scaled up by someone-->          Unloading (it goes first)
    Loading   --target still at 0 replicas after the grace-->   Loading (ask for it again)
    Loading   --target Failed / swap_timeout-->                 Idle (its held requests rejected)
    any       --target left the spec-->                         Idle (cancelled; own: our
                                                                wish for it withdrawn)

llmkube mode drains the same way, then::

    Draining  --our requests drained, nothing else coming in-->  Triggered (target 0 -> 1)
    Triggered --target Ready and named resident-->              Idle (held requests admitted)
    Triggered --target Failed / swap_timeout-->                 Idle (its held requests rejected)
    Triggered --no trace for the grace, nobody waits for it-->  Idle (dropped)
    Triggered --no trace of the trigger for the grace-->        Draining (trigger again)
    Triggered --no trace, retries used up-->                    Idle (given up, told so)
    Triggered --stalled, target without pods-->                 Triggered (resident's held pass)

A swap LLMKube started is followed from Idle straight to Triggered. Follow mode (own mode on a replica that does not
lead the pool, ``replicas.py``) has only those following edges: the leader decides, this
replica holds, and releases when the leader's status names the target resident; it goes
back to Idle when the leader gives the swap up (a newer announcement and the status no longer
name the target).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from . import carry, pacing, steps
from . import steps_llmkube as llm
from .events import Command
from .model import Actuation
from .pool import PoolReader, PoolWriter
from .state import PolicyError, Stage

Out = list[Command]


class Gate(Enum):
    """What the pool must look like for an edge to be considered (see the module header)."""

    ALWAYS = 0
    SEEN = 1
    HEALTHY = 2


@dataclass(frozen=True, slots=True)
class Edge:
    """One transition: ``source --guard--> target``, doing ``action`` on the way."""

    source: Stage
    guard: Callable[[PoolReader, float], bool]
    target: Stage
    action: Callable[[PoolWriter, float, Out], None]
    gate: Gate
    modes: frozenset[Actuation]  # the actuation modes in which the edge exists


def advance(m: PoolWriter, now: float, out: Out) -> None:
    """Follow edges from the current stage until none applies (state-triggered)."""
    seen = all(name in m.obs for name in m.spec.members)
    healthy = seen and not m.missing()
    allowed = {Gate.ALWAYS: True, Gate.SEEN: seen, Gate.HEALTHY: healthy}
    for _ in range(4 * len(m.spec.members) + 16):  # each pass follows one edge
        stage = m.stage
        edge = next((e for e in _BY_SOURCE[stage] if m.actuation in e.modes
                     and allowed[e.gate] and e.guard(m, now)), None)
        if edge is None:
            return
        edge.action(m, now, out)
        if m.stage is not edge.target:
            raise PolicyError(f"edge {stage.value} -> {edge.target.value} ended in "
                              f"{m.stage.value}")
    raise PolicyError("swap engine did not settle")  # a bug: transitions must converge


_I, _D, _P, _U, _L, _T = (Stage.IDLE, Stage.DRAIN, Stage.PROBE, Stage.UNLOAD, Stage.LOAD,
                          Stage.TRIGGERED)
_SWAPPING = (_D, _P, _U, _L, _T)
_A, _S, _H = Gate.ALWAYS, Gate.SEEN, Gate.HEALTHY
ANY = frozenset(Actuation)
OWN = frozenset({Actuation.OWN})
LLMKUBE = frozenset({Actuation.LLMKUBE})
ROUTING = frozenset({Actuation.OWN, Actuation.HANDS_OFF})  # residency is ours to decide
# residency is someone else's: LLMKube's reconciler, or (follow) the replica leading the pool
FOLLOWING = frozenset({Actuation.LLMKUBE, Actuation.FOLLOW})
FOLLOW = frozenset({Actuation.FOLLOW})


def _not_ready_after(m: PoolReader) -> str:
    return f"{steps.swap_of(m).target} not Ready after {m.limits.swap_timeout:g}s"


def _reported_failed(m: PoolReader) -> str:
    return f"{steps.swap_of(m).target} reported phase Failed"


# The whole graph, tried in this order within each source stage (first match wins).
TRANSITIONS: tuple[Edge, ...] = (
    # any stage, any mode
    *(Edge(s, steps.target_left, _I, steps.cancel, _A, ANY) for s in _SWAPPING),
    # own mode: a member scaled up behind our back that serves nothing goes back to 0 at once
    *(Edge(s, steps.intruder_up, s, steps.scale_down_intruders, _H, OWN) for s in (_D, _P, _U)),
    # prompt-cache carry-over: a save or restore not answered in time is given up
    *(Edge(s, carry.overdue, s, carry.give_up, _A, OWN | LLMKUBE) for s in (_D, _U, _L, _T)),
    # paced release: held requests pass as a paced member's requests end (Idle: the next edge)
    *(Edge(s, pacing.room_freed, s, pacing.release_freed, _S, ANY) for s in _SWAPPING),
    # Idle
    Edge(_I, steps.held_for_serving, _I, steps.release_serving, _S, ANY),
    Edge(_I, steps.adoptable, _I, steps.adopt, _H, ROUTING),
    Edge(_I, llm.someone_swaps, _T, llm.follow_swap, _H, FOLLOWING),
    Edge(_I, steps.wants_a_member, _D, steps.start, _H, OWN | LLMKUBE),
    Edge(_I, steps.reclaim_due, _D, steps.reclaim, _H, OWN),
    Edge(_I, steps.hint_left, _I, steps.drop_hint, _H, ANY),
    # a reclaim not yet unloading gives way to traffic (and to a change of hands)
    Edge(_D, steps.reclaim_unwanted, _I, steps.cancel_reclaim, _H, OWN | LLMKUBE),
    Edge(_P, steps.reclaim_unwanted, _I, steps.cancel_reclaim, _H, OWN),
    # Draining and Probing (own mode)
    Edge(_D, steps.drained_and_gated, _P, steps.probe, _H, OWN),
    Edge(_D, steps.drained_here_and_settled, _U, steps.to_unload, _H, OWN),
    Edge(_P, steps.busy_again, _D, steps.back_to_drain, _H, OWN),
    Edge(_P, steps.probe_refused, _D, steps.defer, _H, OWN),
    Edge(_P, steps.all_idle, _U, steps.to_unload, _H, OWN),
    # Unloading and Loading (own mode)
    Edge(_U, steps.release_wanted, _U, steps.retarget, _H, OWN),
    Edge(_U, carry.save_due(steps.still_up), _U, carry.ask_save, _H, OWN),
    Edge(_U, carry.unless_carrying(steps.still_up), _U, steps.scale_down_others, _H, OWN),
    Edge(_U, steps.released, _I, steps.go_cold, _H, OWN),
    Edge(_U, steps.others_gone, _L, steps.load, _H, OWN),
    Edge(_L, steps.timed_out, _I, steps.fail(_not_ready_after), _A, OWN),
    Edge(_L, carry.restore_due(steps.target_ready), _L, carry.ask_restore, _S, OWN),
    Edge(_L, carry.unless_carrying(steps.target_ready), _I, steps.complete, _S, OWN),
    Edge(_L, steps.others_back, _U, steps.to_unload, _H, OWN),
    Edge(_L, steps.target_at_zero, _L, steps.scale_up_again, _H, OWN),
    Edge(_L, steps.target_failed, _I, steps.fail(_reported_failed), _H, OWN),
    # llmkube mode: drain our own requests, trigger, then follow LLMKube's reconciler
    Edge(_D, carry.save_due(llm.drained_here), _D, carry.ask_save, _H, LLMKUBE),
    Edge(_D, carry.unless_carrying(llm.drained_here), _T, llm.trigger, _H, LLMKUBE),
    Edge(_T, steps.timed_out, _I, steps.fail(_not_ready_after), _A, FOLLOWING),
    Edge(_T, carry.restore_due(llm.target_resident), _T, carry.ask_restore, _S, LLMKUBE),
    Edge(_T, carry.unless_carrying(llm.target_resident), _I, steps.complete, _S, FOLLOWING),
    Edge(_T, steps.target_failed, _I, steps.fail(_reported_failed), _H, FOLLOWING),
    Edge(_T, llm.activation_unwanted, _I, llm.drop_lost, _A, LLMKUBE),
    Edge(_T, llm.activation_abandoned, _I, llm.abandon, _A, LLMKUBE),
    Edge(_T, llm.activation_lost, _D, llm.retrigger, _A, LLMKUBE),
    Edge(_T, steps.held_for_serving, _T, steps.release_serving, _S, LLMKUBE),
    Edge(_T, llm.leader_dropped, _I, llm.stop_following, _A, FOLLOW),
)

_BY_SOURCE: dict[Stage, tuple[Edge, ...]] = {
    stage: tuple(e for e in TRANSITIONS if e.source is stage) for stage in Stage}
