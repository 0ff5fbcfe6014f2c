"""An opt-in fault of the LLMKube stand-in: the lost activation LLMKube's reconciler shows.

Measured beside LLMKube's real reconciler (docs/design/llmkube.md): a pass woken by the
watch events of its own replica patches decided from a cached pool that did not yet hold its
own ``pendingMember`` write. With nothing scaled up (it had just held the target at 0) and
nothing pending in that stale copy, the owner fell back to the resident: the resident was
scaled back up, and since the resident had already left Ready, the pass wrote it as the
pending member over the target (merge patches carry no resourceVersion, so the stale write
lands). The pool then ended Ready on the old resident, the target at 0, nothing pending.

This module reproduces exactly that, on demand and deterministically: after a pass that
records a new ``pendingMember`` in a warm pool (an activation), the first pass that runs once
the resident has left Ready, while the target is still pending, decides from the pool as read
before that write. Everything else in that pass is the reconciler's ordinary logic.

Opt in per pool with the annotation ``sim.llmkube.dev/lose-activations: "N"`` (the next N
activations of that pool are lost; a changed value re-arms, removing it disarms), or for every
pool with ``ModelPoolReconciler(lose_activations=N)`` / ``--lose-activations N``.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from devstack.reconciler_plan import is_ready

log = logging.getLogger("devstack.reconciler")

ANNOTATION = "sim.llmkube.dev/lose-activations"
PoolKey = tuple[str, str]


def _count(text: str | None, default: int) -> int:
    if text is None:
        return default
    try:
        return max(0, int(text))
    except ValueError:
        log.warning("ignoring %s=%r: not a count", ANNOTATION, text)
        return 0


class LostActivations:
    """Which pass decides from a stale pool read, per pool; counts what it did in `fired`."""

    def __init__(self, default: int = 0) -> None:
        self.default = default
        self.fired = 0  # stale passes run, all pools (tests read it)
        self._seen: dict[PoolKey, str | None] = {}  # the annotation value armed from
        self._left: dict[PoolKey, int] = {}
        # the read before an activation's pendingMember write, and that member
        self._stale: dict[PoolKey, tuple[dict[str, Any], str]] = {}

    def decide_from(self, key: PoolKey, pool: dict[str, Any],
                    members: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
        """The pool object this pass decides from: `pool`, or the stale read when it fires."""
        self._arm(key, pool)
        if key not in self._stale:
            return pool
        stale, target = self._stale[key]
        if ((pool.get("status") or {}).get("pendingMember") or "") != target:
            del self._stale[key]  # the swap moved on (done, superseded): nothing left to lose
            return pool
        resident = (stale.get("status") or {}).get("residentMember") or ""
        if is_ready(members.get(resident)):
            return pool  # the stale pass that loses it sees the resident already unloading
        del self._stale[key]
        self.fired += 1
        log.warning("pool %s/%s: fault: deciding from the pool as read before pendingMember %s "
                    "was written", *key, target)
        return stale

    def after_pass(self, key: PoolKey, read: dict[str, Any], wanted: dict[str, Any]) -> None:
        """Note a pass that decided from `read` and wanted `wanted`; arm on an activation."""
        if self._left.get(key, 0) <= 0 or key in self._stale:
            return
        before = read.get("status") or {}
        resident = before.get("residentMember") or ""
        pending = wanted.get("pendingMember") or ""
        if resident and pending and pending != resident and \
                pending != (before.get("pendingMember") or ""):
            self._stale[key] = (copy.deepcopy(read), pending)
            self._left[key] -= 1

    def _arm(self, key: PoolKey, pool: dict[str, Any]) -> None:
        value = ((pool.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
        if key in self._seen and self._seen[key] == value:
            return
        first = key not in self._seen
        self._seen[key] = value
        # The constructor's count applies once per pool; the annotation re-arms when edited.
        self._left[key] = _count(value, self.default if first else 0)
