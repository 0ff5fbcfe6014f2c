"""Turn a PoolView into the ModelPool's ``.status`` and write it, only when it changed.

``desired_status`` is pure (time is an argument) so every field can be tested without a
cluster. ``StatusWriter`` does one compare-and-patch; ``StatusPublisher`` coalesces a stream of
views into as few writes as possible, one background task per pool, never writing a stale view.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from collections import deque
from datetime import datetime, timezone
from typing import Any, Protocol

from extproc.backoff import Backoff
from extproc.logs import get_logger
from extproc.platform.kube.turns import WriteTurns
from extproc.platform.kube._calls import (POOLS, counted, custom_path, describe,
                                          resource_version_of, retryable)
from extproc.platform.kube.fencing import HeldVersions
from extproc.platform.kube.objects import OWN_CONDITIONS
from extproc.platform.kube.rest import ApiError, KubeClient
from extproc.policy.model import MemberObservation, PoolKey, PoolPhase, PoolView

log = get_logger(__name__)

# The CRD caps a condition's message at 32,768 characters (metav1.Condition's limit). One
# longer message (a member's load error, echoed) would make the API server refuse every status
# write with 422 and freeze the whole status, so longer messages are cut, with a marker.
MESSAGE_LIMIT = 32768
TRUNCATED = "... [truncated]"


def bounded_message(message: str) -> str:
    """``message``, cut to MESSAGE_LIMIT characters with a marker at its end when longer."""
    if len(message) <= MESSAGE_LIMIT:
        return message
    return message[:MESSAGE_LIMIT - len(TRUNCATED)] + TRUNCATED


def desired_status(view: PoolView, current_status: dict, now: datetime, *,
                   spec_problems: tuple[str, ...] = ()) -> dict:
    """The complete ``.status`` for ``view``; conditions keep their old lastTransitionTime
    unless their status flips. ``spec_problems`` feeds the SpecValid condition."""
    old = {c.get("type"): c for c in current_status.get("conditions") or []
           if isinstance(c, dict)}
    stamp = now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    gen = view.generation
    conditions = [_condition(kind, status, reason, message, gen, old.get(kind), stamp)
                  for kind, status, reason, message in (
                      _slot_allocated(view), _members_valid(view), _swap_deferred(view),
                      _spec_valid(view, spec_problems), _swap_stalled(view),
                      _actuating(view))]
    # Conditions of other writers (LLMKube's MetalSupported, ...) are theirs: kept as they are.
    conditions += [c for kind, c in old.items() if kind not in OWN_CONDITIONS]
    status: dict[str, Any] = {
        "phase": PoolPhase(view.phase).value,
        "residentMember": view.resident,
        "pendingMember": view.pending,
        "members": [{"name": m.name, "phase": m.phase, "resident": m.name == view.resident}
                    for m in view.members],
        "observedGeneration": gen,
        "conditions": conditions,
    }
    # Unix time, set by the runtime; None (a merge patch's delete) once the resident is busy
    # again or the policy is not reclaim, so a stale time never outlives its idle spell.
    idle = view.resident_idle_since
    status["residentIdleSince"] = None if idle is None else datetime.fromtimestamp(
        idle, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return status


def owned_part(status: dict, desired: dict) -> dict:
    """The fields of ``status`` that ``desired`` writes (for comparing without others' fields)."""
    return {k: status.get(k) for k in desired}


def _condition(kind: str, status: str, reason: str, message: str, generation: int,
               old: dict | None, stamp: str) -> dict:
    """One condition; the transition time moves only when ``status`` differs from before."""
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    return {"type": kind, "status": status, "reason": reason,
            "message": bounded_message(message),
            "lastTransitionTime": since or stamp, "observedGeneration": generation}


def _member(view: PoolView, name: str) -> MemberObservation | None:
    """The view's observation of ``name``, if any."""
    return next((m for m in view.members if m.name == name), None)


def _slot_allocated(view: PoolView) -> tuple[str, str, str, str]:
    """SlotAllocated: True only while a member is resident and Ready."""
    resident = _member(view, view.resident) if view.resident else None
    if resident is not None and resident.ready:
        return ("SlotAllocated", "True", "MemberResident",
                f"member {view.resident} owns the slot and is Ready")
    if view.pending:
        source = f" from {view.resident}" if view.resident else ""
        return ("SlotAllocated", "False", "Swapping",
                f"swapping{source} to {view.pending}")
    if view.failed_member:
        return ("SlotAllocated", "False", "MemberFailed",
                view.failed_message or f"member {view.failed_member} failed to load")
    if view.resident:
        phase = resident.phase if resident is not None and resident.phase else "unknown"
        return ("SlotAllocated", "False", "MemberNotReady",
                f"member {view.resident} owns the slot but is not Ready (phase {phase})")
    return "SlotAllocated", "False", "NoResident", "no member owns the slot"


def _members_valid(view: PoolView) -> tuple[str, str, str, str]:
    """MembersValid: False, naming them, when member InferenceServices are missing or an
    autoscaler targets them (such a member is refused; the rest of the pool serves on)."""
    missing = list(view.missing_members)
    missing += [m.name for m in view.members if not m.exists and m.name not in missing]
    if missing:
        return ("MembersValid", "False", "MemberNotFound",
                f"InferenceService not found in namespace {view.key.namespace}: "
                + ", ".join(missing))
    scaled = [f"{m.name} (by {m.autoscaled_by})" for m in view.members if m.autoscaled_by]
    if scaled:
        return ("MembersValid", "False", "MemberAutoscaled",
                "members refused, an autoscaler scales them (delete it to serve them again): "
                + ", ".join(scaled))
    return "MembersValid", "True", "MembersFound", "every member InferenceService exists"


def _swap_deferred(view: PoolView) -> tuple[str, str, str, str]:
    """SwapDeferred: True with the policy's reason while a swap step waits."""
    if view.deferred_reason:
        return "SwapDeferred", "True", view.deferred_reason, view.deferred_message
    return "SwapDeferred", "False", "NotDeferred", ""


def _spec_valid(view: PoolView, problems: tuple[str, ...]) -> tuple[str, str, str, str]:
    """SpecValid: False when spec values were invalid and replaced by defaults, or when the
    swapPolicy is one this version runs as sticky."""
    if view.unsupported_policy:
        text = f"swapPolicy {view.unsupported_policy} is not supported; the pool runs as sticky"
        return "SpecValid", "False", "UnsupportedSwapPolicy", "; ".join((text, *problems))
    if problems:
        return "SpecValid", "False", "InvalidSpec", "; ".join(problems)
    return "SpecValid", "True", "SpecAccepted", ""


def _swap_stalled(view: PoolView) -> tuple[str, str, str, str]:
    """SwapStalled: True, saying what is missing, while a swap makes no progress."""
    if view.stalled:
        return "SwapStalled", "True", "NoProgress", view.stalled
    return "SwapStalled", "False", "Progressing", ""


def spec_invalid_news(before: dict, after: dict) -> str | None:
    """SpecValid's message when a write turned it False or changed why (None otherwise)."""
    def spec_valid(status: dict) -> dict:
        return next((c for c in status.get("conditions") or [] if isinstance(c, dict)
                     and c.get("type") == "SpecValid"), {})
    old, new = spec_valid(before), spec_valid(after)
    if new.get("status") != "False":
        return None
    if old.get("status") == "False" and old.get("message") == new.get("message"):
        return None
    return str(new.get("message") or "")


def _actuating(view: PoolView) -> tuple[str, str, str, str]:
    """Actuating: False, naming the other writer and the remedy, while own mode stands back."""
    if view.hands_off:
        return "Actuating", "False", "HandsOff", view.hands_off
    return "Actuating", "True", "Actuating", ""


_WHO_FIELDS = ("phase", "residentMember", "pendingMember")


class StatusWriter:
    """Writes a pool's ``.status`` through the /status subresource when it changed."""

    def __init__(self, api_client: KubeClient) -> None:
        self._api = api_client
        self._written: dict[PoolKey, dict] = {}
        self._recent: dict[PoolKey, deque[dict]] = {}

    def written(self, key: PoolKey) -> dict | None:
        """The status this writer last wrote for ``key`` (None if it wrote none)."""
        return self._written.get(key)

    async def publish(self, view: PoolView, current_status: dict, *, resource_version: str = "",
                      spec_problems: tuple[str, ...] = ()) -> str | None:
        """Patch the status computed from ``view`` unless it equals ``current_status``, only
        if the pool is still at ``resource_version`` (else 409); the new version, or None
        when nothing was written."""
        desired = desired_status(view, current_status, datetime.now(timezone.utc),
                                 spec_problems=spec_problems)
        if desired == owned_part(current_status, desired):
            return None
        # A merge patch leaves the keys it does not mention, so fields other writers own
        # survive; the conditions list is replaced whole, so desired carries the others'
        # conditions along (desired_status). What we write is remembered before the call (the
        # watch may show it before the call returns, and ``matches`` must call it ours then),
        # as the server stores it (a null in a merge patch removes the field), and a few
        # writes back (the watch may show an earlier one of ours after a later one was sent).
        stored = {k: v for k, v in desired.items() if v is not None}
        before, self._written[view.key] = self._written.get(view.key), stored
        self._recent.setdefault(view.key, deque(maxlen=8)).append(desired)
        body: dict = {"status": desired}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}  # the fence (fencing.py)
        try:
            answered = await counted("patch", f"{POOLS}/status", self._api.call(
                "PATCH", custom_path(view.key.namespace, POOLS, view.key.name, "status"),
                body=body))
        except BaseException:
            if before is None:
                self._written.pop(view.key, None)
            else:
                self._written[view.key] = before
            raise
        log.info("pool status written", namespace=view.key.namespace, pool=view.key.name,
                 phase=desired["phase"], resident=view.resident, pending=view.pending,
                 resource_version=resource_version)
        return resource_version_of(answered)

    def matches(self, key: PoolKey, status: dict) -> bool:
        """Whether ``status`` shows one of our recent writes: it is ours.

        Compared on the fields that say who owns the slot, not on every byte: a server may
        normalise a condition, and a foreign writer that changes only conditions shows
        itself by a condition type of its own (``objects.llmkube_manages``).
        """
        return any(all(status.get(k) == written.get(k) for k in _WHO_FIELDS)
                   for written in self._recent.get(key, ()))

    def forget(self, key: PoolKey) -> None:
        """Drop what was written for a deleted pool."""
        self._written.pop(key, None)
        self._recent.pop(key, None)


class StatusSource(Protocol):
    """Where the publisher reads current pool status (ClusterWatcher implements it)."""

    def has_pool(self, key: PoolKey) -> bool:
        """Whether the pool exists."""

    def pool_status(self, key: PoolKey) -> dict:
        """The pool's ``.status`` as last seen."""

    def pool_resource_version(self, key: PoolKey) -> str:
        """The pool's resourceVersion as last seen."""

    def spec_problems(self, key: PoolKey) -> tuple[str, ...]:
        """Problems found in the pool's spec."""


class StatusPublisher:
    """Coalesces views into status writes: ``submit`` never blocks, only the latest view counts."""

    def __init__(self, writer: StatusWriter, source: StatusSource, *,
                 backoff_initial: float = 0.2, backoff_max: float = 30.0,
                 may_write: Callable[[PoolKey], bool] = lambda key: True,
                 reread: Callable[[PoolKey], Awaitable[None]] | None = None,
                 spec_invalid: Callable[[PoolKey, str], None] = lambda key, message: None,
                 turns: WriteTurns | None = None) -> None:
        self._writer = writer
        self._source = source
        # Two fences: only the pool's leader (by its own clock) writes its status, and every
        # write names the version it was decided on, so a late one cannot land (fencing.py).
        self._may_write = may_write
        self._reread = reread  # after a 409: fetch the pool again, so the next try is fresh
        # told once per change when our write turned SpecValid False (the pool's Event): only
        # the writer of the status, so one replica, and not again after a restart
        self._spec_invalid = spec_invalid
        self._backoff = (backoff_initial, backoff_max)
        self._latest: dict[PoolKey, PoolView] = {}
        self._tasks: dict[PoolKey, asyncio.Task[None]] = {}
        self._versions = HeldVersions()
        self._turns = turns or WriteTurns()  # shared with the fences (turns.py)

    def submit(self, view: PoolView) -> None:
        """Schedule ``view`` for writing, replacing any view of the same pool not yet written."""
        self._latest[view.key] = view
        task = self._tasks.get(view.key)
        if task is None or task.done():
            self._tasks[view.key] = asyncio.create_task(self._drain(view.key),
                                                        name=f"status {view.key}")

    async def close(self) -> None:
        """Stop all background writes (pending views are dropped)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._latest.clear()

    async def idle(self) -> None:
        """Wait until every submitted view has been written or dropped (for tests, shutdown)."""
        while tasks := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.wait(tasks)

    def _current(self, key: PoolKey) -> tuple[dict, str]:
        """The freshest status we know and its version: the cache's, unless it has not
        shown our last write yet (then what we wrote, and the version it was answered)."""
        cached = self._source.pool_resource_version(key)
        held = self._versions.precondition(key, cached)
        if held != cached and (written := self._writer.written(key)) is not None:
            # Comparing with the cache would redo the write (or skip one if the view flipped
            # back meanwhile), and its version would be refused by our own last write.
            return written, held
        return self._source.pool_status(key), cached

    async def _drain(self, key: PoolKey) -> None:
        """Write the latest view of one pool until none is left, backing off on failures."""
        backoff = Backoff(*self._backoff)
        while (view := self._latest.pop(key, None)) is not None:
            async with self._turns.turn():  # decided and sent as of the write, not the wait
                view = self._latest.pop(key, view)  # a newer view came while this one waited
                if not self._source.has_pool(key):
                    log.debug("status not written: pool is gone", namespace=key.namespace,
                              pool=key.name)
                    self._forget(key)
                    continue
                if not self._may_write(key):
                    log.info("status not written: this replica no longer leads the pool",
                             namespace=key.namespace, pool=key.name)
                    continue
                current, version = self._current(key)
                failure: Exception | None = None
                answered: str | None = None
                try:
                    answered = await self._writer.publish(
                        view, current, resource_version=version,
                        spec_problems=self._source.spec_problems(key))
                except Exception as exc:
                    failure = exc  # handled outside: a backoff must not hold a writing turn
            if failure is not None:
                if isinstance(failure, ApiError) and failure.status == 404:
                    self._forget(key)
                    continue
                if not retryable(failure):
                    log.error("status write rejected", namespace=key.namespace, pool=key.name, error=describe(failure))
                    continue
                conflict = isinstance(failure, ApiError) and failure.status == 409
                if conflict:
                    # The pool changed since the version we sent (another writer, a leader
                    # after us): never send the same write again; read the pool afresh (the
                    # policy hears it through the watcher) and decide on the fresh status.
                    self._versions.forget(key)
                    await self._reread_quietly(key)
                delay = backoff.next_delay()
                log.warning("status write failed, retrying", namespace=key.namespace, pool=key.name,
                            error=describe(failure), retry_in=round(delay, 3), conflict=conflict)
                # Retry this view unless a newer one arrived while we were writing.
                self._latest.setdefault(key, view)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            if answered is not None:
                self._versions.wrote(key, version, answered)
                news = spec_invalid_news(current, self._writer.written(key) or {})
                if news is not None:
                    self._spec_invalid(key, news)

    async def _reread_quietly(self, key: PoolKey) -> None:
        """Re-read the pool after a conflict; a failed re-read leaves the watch to catch up."""
        if self._reread is None:
            return
        try:
            await self._reread(key)
        except Exception as exc:  # the retry's precondition is then the watch's, maybe a 409
            log.warning("pool not re-read after a conflict", namespace=key.namespace,
                        pool=key.name, error=describe(exc))

    def _forget(self, key: PoolKey) -> None:
        """Drop state kept for a pool that no longer exists."""
        self._versions.forget(key)
        self._writer.forget(key)
