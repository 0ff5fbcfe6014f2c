"""Small plausible bugs in extproc/policy, each a source patch (``make mutants`` runs them).

A mutant is what a tired contributor could write: one guard dropped, one loop forgotten, one
definition loosened. The runner (``mutants_run.py``) applies each to a copy of the tree and
asks which check notices it: the exhaustive search (``test_exhaustive.py``), a named unit or
property test of tests/policy, or nothing. A mutant nothing catches is a hole in the checks,
not in the code; docs/guarantees.md keeps the table. Each patch must match its file exactly
once (the runner refuses a mutant whose text has drifted, so the list cannot rot silently).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mutant:
    """One bug: replace ``old`` (found exactly once) by ``new`` in extproc/policy/``file``."""

    name: str
    file: str
    old: str
    new: str
    why: str  # what it breaks, in words


MUTANTS: tuple[Mutant, ...] = (
    # ---- the 12 of issue 36 ------------------------------------------------------------
    Mutant("never-heal", "machine.py",
           'if self.actuation is not Actuation.LLMKUBE:\n                self.resident = ""',
           'if False:\n                self.resident = ""',
           "a resident that left Ready stays resident: never healed"),
    Mutant("no-paced-midswap-release", "swap.py",
           "    *(Edge(s, pacing.room_freed, s, pacing.release_freed, _S, ANY) for s in _SWAPPING),\n",
           "",
           "the paced release edge mid-swap removed: held requests wait for a room that freed"),
    Mutant("stall-not-a-deadline", "deadlines.py",
           "(idle_deadline(m), watchdog.deadline(m),", "(idle_deadline(m),",
           "the stall mark is no deadline: SwapStalled waits for an unrelated event"),
    Mutant("abandon-keeps-held", "steps_llmkube.py",
           "    for rid, held in m.requests.held_for(swap.target):\n        m.requests.unhold(rid)\n"
           "        out.append(Reject(rid, 503, \"activation_lost\"",
           "    for rid, held in ():\n        m.requests.unhold(rid)\n"
           "        out.append(Reject(rid, 503, \"activation_lost\"",
           "abandon() does not answer the held requests of the swap it gives up"),
    Mutant("fairness-never-due", "fairness.py",
           "return window > 0 and now - swap.started >= window", "return False",
           "the fairness window never comes due: a busy incumbent keeps the slot"),
    Mutant("failed-counts-ready", "model.py",
           "return self.exists and self.phase == PHASE_READY and self.replicas > 0",
           "return self.exists and self.phase in (PHASE_READY, PHASE_FAILED) "
           "and self.replicas > 0",
           "a Failed member counts as Ready"),
    Mutant("carry-no-timeout", "carry.py",
           "return any(until <= now for until in m.carry.waiting_in(_started(m)).values())",
           "return False",
           "a slot save or restore never answered is waited for without a timeout"),
    Mutant("stalled-trigger-holds", "steps_llmkube.py",
           "return swap is not None and swap.stage is Stage.TRIGGERED and bool(swap.stalled) \\",
           "return False and swap is not None and swap.stage is Stage.TRIGGERED and bool(swap.stalled) \\",
           "a stalled trigger keeps the resident's requests held"),
    Mutant("fail-keeps-held", "steps.py",
           "    for rid, held in m.requests.held_for(swap.target):\n        m.requests.unhold(rid)\n"
           "        out.append(Reject(rid, 503, \"member_failed\"",
           "    for rid, held in ():\n        m.requests.unhold(rid)\n"
           "        out.append(Reject(rid, 503, \"member_failed\"",
           "fail_swap does not answer the held requests of the failed swap"),
    Mutant("stall-never-said", "watchdog.py",
           "        out.append(Notice(\"SwapStalled\"", "        (lambda *_: None)(Notice(\"SwapStalled\"",
           "the swap is marked stalled but SwapStalled is never said"),
    Mutant("refused-probe-never-retried", "steps.py",
           "swap.probe_retry_at = now + m.limits.probe_retry",
           "swap.probe_retry_at = math.inf",
           "a refused idle probe is never asked again"),
    Mutant("unloaded-ignores-pods", "model.py",
           "return self.replicas == 0 and self.pods == 0 and self.phase not in ACTIVE_PHASES",
           "return self.replicas == 0",
           "unloaded ignores pods and phase: the target loads beside a terminating pod"),
    # ---- our own ----------------------------------------------------------------------
    Mutant("unload-under-streams", "steps.py",
           "return not paused and not others_busy(m) and now >= fairness.calm_at(m) \\",
           "return not paused and now >= fairness.calm_at(m) \\",
           "drain before unload dropped: the incumbent is scaled down with a stream on it"),
    Mutant("no-reask-at-zero", "steps.py",
           "    return swap.asked_up_at + m.limits.activation_grace\n",
           "    return math.inf\n",
           "a loading target someone scaled back to 0 is never asked for again"),
    Mutant("intruder-left-up", "steps.py",
           "    return bool(_intruders(m))\n", "    return False\n",
           "a member scaled up behind our back mid-swap is not scaled down at once"),
    Mutant("trigger-never-lost", "steps_llmkube.py",
           "    return swap.lost_since + m.limits.activation_grace * 2.0 ** swap.lost\n",
           "    return math.inf\n",
           "a trigger LLMKube dropped is never noticed (never re-sent, never given up)"),
    Mutant("budget-never-expires", "requests.py",
           "while heap and heap[0][0] <= now:", "while heap and heap[0][0] < now - 1e9:",
           "a held request is never answered at its budget"),
    Mutant("follower-admits-anything", "replicas.py",
           "return m.status.pending in (\"\", member) and m.drain[1] in (\"\", member) and \\",
           "return True or m.status.pending in (\"\", member) and m.drain[1] in (\"\", member) and \\",
           "a follower admits to the resident after its leader announced another member"),
    Mutant("continues-while-stalled", "admission.py",
           "    if swap.stalled:\n        return f\"the swap to {swap.target} is stalled: {swap.stalled}\"\n",
           "",
           "a budget 503 for a stalled swap says the swap continues"),
    Mutant("linger-ignored", "fairness.py",
           "    lingered = max((book.idle_since(name) + linger(m, name, cap) for name in m.others()),",
           "    lingered = max((book.idle_since(name) + 0.0 for name in m.others()),",
           "the drain linger is not waited for: a returning client costs two swaps"),
    Mutant("failed-target-never-fails", "steps.py",
           "return m.obs[swap.target].phase == PHASE_FAILED and swap.saw_progress",
           "return False",
           "a target reported Failed is waited for until swap_timeout"),
    Mutant("probe-answer-ignored", "machine.py",
           "        if idle:\n            swap.probing.discard(member)",
           "        if idle and False:\n            swap.probing.discard(member)",
           "an idle probe's 'idle' is not taken: Probing waits for ever"),
    # ---- our writes the runtime dropped (landing.dropped) ---------------------------------
    Mutant("drop-settles-the-wire", "landing.py",
           "if reached.get(member, 0) < self.opened.get(member, 0):",
           "if True:",
           "a scale-up that may be on the wire is settled when the runtime drops its wishes"),
    Mutant("drop-keeps-standing", "landing.py",
           "            elif until == math.inf:\n                self.until[member] = now + bound",
           "            elif False:\n                self.until[member] = now + bound",
           "a dropped wish that may be on the wire still counts as standing (never withdrawn)"),
    Mutant("drop-ignored", "machine.py",
           "                self.landing.dropped(dict(reached), now, self.limits.write_landing)",
           "                pass",
           "the runtime's dropped wishes are not heard: the first swap after a hands-off "
           "spell waits the write-landing bound for a write never sent"),
)
