"""Which resourceVersion a write carries as its precondition (fencing by preconditions).

Every own-mode scale patch and status patch names the object's resourceVersion as this
replica last observed it, so the API server refuses (409 Conflict) a patch decided on a view
that someone else has changed since: a deposed leader's patch that arrives late cannot land
over a newer leader's write. A 409 is never retried as it was: the caller re-reads the object
(``ClusterWatcher.reread``), which feeds the fresh observation to the policy, and decides again.

Which version "last observed" is, across our own writes: a successful patch answers with the
object's new version, and the watch shows that same version a little later. Until it does,
the cache still holds the version the patch replaced (or one of our earlier writes), and a
second write with the cache's version would be refused by our own first write, again and
again while the watch lags. So each object keeps the chain of versions our writes went
through: ``[sent, answered, answered, ...]``. Given the cache's version:

- the last of the chain: the watch caught up; the chain is dropped, the cache is current;
- another one in the chain: the watch still shows the state before our last write; the
  last answered version is the freshest one we know;
- none of the chain: someone else wrote after our last write (a precondition guarantees
  nobody wrote between the version we sent and the one we were answered, and the watch is
  ordered), or a re-list brought a newer state; the cache's version is the freshest.

No ordering of resourceVersions is assumed (the API says they are opaque): only equality.

A precondition only refuses a patch if the object changed after its writer read it; so a new
leader also moves the pool's and every member's version once when it takes the lead
(``TakeoverFences``).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Hashable
from typing import Protocol

from extproc.logs import get_logger
from extproc.platform.kube.turns import WriteTurns
from extproc.platform.kube.actuator import MemberMissing
from extproc.policy.model import PoolKey
from extproc.names import LEADER_ANNOTATION

log = get_logger(__name__)

MAX_CHAIN = 32  # writes the watch may lag behind; past it the oldest are forgotten (a 409 then)


class HeldVersions:
    """Per object, the resourceVersion this replica holds as the freshest it knows."""

    def __init__(self) -> None:
        self._chains: dict[Hashable, list[str]] = {}

    def precondition(self, key: Hashable, cached: str) -> str:
        """The version to send with the next write, given the version the watch cache shows."""
        chain = self._chains.get(key)
        if not chain:
            return cached
        if cached in chain[:-1]:
            return chain[-1]  # the watch has not shown our last write yet
        del self._chains[key]  # caught up (the last one), or someone wrote after us
        return cached

    def wrote(self, key: Hashable, sent: str, answered: str) -> None:
        """A write carrying ``sent`` succeeded; the server answered version ``answered``."""
        if not answered:
            self._chains.pop(key, None)  # nothing to hold: the cache's version is all we know
            return
        chain = self._chains.get(key)
        if not chain or chain[-1] != sent:
            chain = self._chains[key] = [sent]
        chain.append(answered)
        del chain[:-MAX_CHAIN]

    def forget(self, key: Hashable) -> None:
        """Drop what is held for an object that is gone."""
        self._chains.pop(key, None)




class FenceLost(RuntimeError):
    """The lead was lost before this term's stamps landed (the write is not sent)."""


class _Stamper(Protocol):
    async def stamp(self, namespace: str, member: str, annotation: str, value: str) -> str:
        """Set an annotation on a member; its new resourceVersion."""

    async def stamp_pool(self, namespace: str, pool: str, annotation: str, value: str) -> str:
        """Set an annotation on a pool; its new resourceVersion."""


class _Members(Protocol):
    def member_replicas(self, key: PoolKey, member: str) -> tuple[int, str]:
        """(replicas, resourceVersion) of a member as last seen."""

    def members_of(self, key: PoolKey) -> list[str]:
        """The pool's members, with those removed from its spec that are still tracked."""


class TakeoverFences:
    """On each gain of a pool's lead, stamp the pool and every member before this replica
    scales any.

    A precondition refuses a deposed leader's late patch only if the object changed after
    that leader read it. A new leader that keeps the incumbent (it cancels the swap its
    predecessor was draining for) writes nothing to it, so the old leader's scale-down, sent
    before its renew deadline and delayed, would land under the new leader's admissions; and
    a new leader whose status is already right writes no status, so the old leader's late
    status patch would land and read as another controller's (own mode would stand down).
    Stamping the pool and each member with a fresh annotation value moves each one's
    resourceVersion once per lead term (a pool's status shares the object's version): from
    then on every patch decided before the stamp is refused. The stamps start at the gain;
    every scale of the term waits for them (``ready``). A status write need not wait: it moves
    the pool's version itself, and a late patch that lands in the round trip before the stamp
    falls in the new leader's grace (``Replicas.judges``), so it is not read as a fight.
    A few pools are stamped at a time (a lead is taken over every pool at once); a pool whose
    scale waits goes first.
    """

    def __init__(self, stamper: _Stamper, members: _Members, versions: HeldVersions,
                 identity: str, turns: WriteTurns | None = None) -> None:
        self._stamper, self._members, self._versions = stamper, members, versions
        self._identity = identity
        self._terms: dict[PoolKey, asyncio.Task[None]] = {}
        # A lead over a thousand pools is thousands of stamps: they take turns (turns.py),
        # after the status writes; a pool whose scale waits for its stamps skips the queue.
        self._turns = turns or WriteTurns()
        self._queued: set[PoolKey] = set()  # pools whose stamps wait for their turn

    def lead_changed(self, key: PoolKey, leading: bool) -> None:
        """Start stamping the pool's members when the lead is gained; stop when it is lost."""
        task = self._terms.pop(key, None)
        if task is not None:
            task.cancel()
        if leading:
            self._start(key)

    async def ready(self, key: PoolKey) -> None:
        """Wait until this term's stamps landed; raises (the scaler retries) if they failed."""
        task = self._terms.get(key)
        if task is None:
            return  # not leading: the caller's own leadership check refuses the write
        if task.done() and (task.cancelled() or task.exception() is not None):
            task = self._start(key, urgent=True)  # a failed stamp is tried again now
        elif key in self._queued:  # a scale waits for it: its turn is now
            task.cancel()
            task = self._start(key, urgent=True)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # our caller is being cancelled
            # the stamps were cancelled: the lead was lost meanwhile (the caller must not
            # end as cancelled for that; its own leadership check tells it the rest)
            raise FenceLost(f"the lead of pool {key} was lost while fencing") from None

    def close(self) -> None:
        """Cancel every stamp under way."""
        for task in self._terms.values():
            task.cancel()
        self._terms.clear()

    def _start(self, key: PoolKey, urgent: bool = False) -> asyncio.Task[None]:
        # A fresh value per term, so the stamp always changes the object (a merge patch
        # that changes nothing keeps the resourceVersion, and would fence nothing).
        value = f"{self._identity} {secrets.token_hex(6)}"
        if urgent:
            self._queued.discard(key)
        else:
            self._queued.add(key)
        task = self._terms[key] = asyncio.get_running_loop().create_task(
            self._stamp_pool(key, value) if urgent else self._stamp_in_turn(key, value),
            name=f"fence {key}")
        task.add_done_callback(_retrieve)
        return task

    async def _stamp_in_turn(self, key: PoolKey, value: str) -> None:
        try:
            async with self._turns.turn(first=False):
                self._queued.discard(key)
                await self._stamp_pool(key, value)
        finally:
            if self._terms.get(key) is asyncio.current_task():
                self._queued.discard(key)

    async def _stamp_pool(self, key: PoolKey, value: str) -> None:
        # The pool's version is not held here: the status publisher holds its own (what it
        # wrote); should its first write after the stamp name the version before it, that
        # costs one 409 and a re-read, once per lead.
        await self._stamper.stamp_pool(key.namespace, key.name, LEADER_ANNOTATION, value)
        # members removed from the spec too: one may still hold the GPU and be scaled down
        members = self._members.members_of(key)
        for member in members:
            _, cached = self._members.member_replicas(key, member)
            try:
                answered = await self._stamper.stamp(key.namespace, member, LEADER_ANNOTATION,
                                                     value)
            except MemberMissing:
                continue  # nothing to fence: a patch to it is refused (404) too
            # The stamp is our write: hold its version until the watch shows it.
            self._versions.wrote((key.namespace, member), cached, answered)
        log.info("pool and members fenced for this lead", namespace=key.namespace, pool=key.name,
                 members=members, stamp=value)


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a stamp's failure as seen (``ready`` reports it); log it once."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("pool not fenced; the next scale tries again", error=repr(exc))
