"""Which pool a model name belongs to: the first claim keeps it, in every namespace at once.

A pool claims the names of its members and of its aliases. When pools claim the same name,
the oldest pool (``metadata.creationTimestamp``, then namespace, then name) holds it and every
later claimant is refused that name: its requests for it are never routed to the later pool,
and its status says which pool holds the name. So a pool created in another namespace can
never take a name away from a pool that already serves it, and the answer is the same on
every replica (it depends only on the objects, not on the order they were seen in).

Pure: no I/O, no clock. ``NameClaims`` is updated on every pool change (not per request) and
tells which pools' refusals may have changed, so only those are re-derived.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from extproc.policy.model import PoolKey, PoolSpec

# Sorts after every RFC 3339 time: a pool whose creation time is unknown claims last.
_UNKNOWN_TIME = "~"


def seniority(key: PoolKey, created: str) -> tuple[str, str, str]:
    """The order in which claims are honoured: older first, then namespace, then name.

    creationTimestamp is RFC 3339 in UTC with whole seconds as the API server writes it, so
    text order is time order; two pools created in the same second fall back to their names.
    """
    return created or _UNKNOWN_TIME, key.namespace, key.name


def holder(claimants: Mapping[PoolKey, str]) -> PoolKey:
    """The pool that holds a name, given every claimant's creationTimestamp (not empty)."""
    return min(claimants, key=lambda key: seniority(key, claimants[key]))


def refusal(name: str, held_by: PoolKey) -> str:
    """The problem a refused claimant reports on its status (SpecValid)."""
    return (f"model name {name} is already served by ModelPool {held_by} (the older claim); "
            "requests for it are not routed to this pool")


class NameClaims:
    """Every pool's claimed names and creation time; who holds each name, kept on change."""

    def __init__(self) -> None:
        self._claimants: dict[str, dict[PoolKey, str]] = {}  # name -> pool -> created
        self._names: dict[PoolKey, frozenset[str]] = {}

    def claim(self, key: PoolKey, created: str, names: Iterable[str]) -> set[PoolKey]:
        """Record the pool's claims (replacing its earlier ones); the other pools whose
        refusals may have changed by it."""
        touched = self.drop(key)
        fresh = frozenset(names)
        self._names[key] = fresh
        for name in fresh:
            claimants = self._claimants.setdefault(name, {})
            touched.update(claimants)
            claimants[key] = created
        touched.discard(key)
        return touched

    def drop(self, key: PoolKey) -> set[PoolKey]:
        """Forget the pool (it was deleted); the other pools whose refusals may have changed."""
        touched: set[PoolKey] = set()
        for name in self._names.pop(key, frozenset()):
            claimants = self._claimants[name]
            del claimants[key]
            touched.update(claimants)
            if not claimants:
                del self._claimants[name]
        return touched

    def refused(self, key: PoolKey) -> dict[str, PoolKey]:
        """The names the pool claims but another pool holds: name -> the holder."""
        out = {}
        for name in sorted(self._names.get(key, ())):
            held_by = holder(self._claimants[name])
            if held_by != key:
                out[name] = held_by
        return out


def claimed(claims: NameClaims, declared: PoolSpec,
            problems: tuple[str, ...]) -> tuple[PoolSpec, tuple[str, ...]]:
    """A pool's spec and problems as reported: the names an older pool holds are unrouted,
    and each is a problem naming its holder."""
    refused = claims.refused(declared.key)
    if not refused:
        return declared, problems
    return (replace(declared, unrouted=tuple(refused)),
            problems + tuple(refusal(name, held_by) for name, held_by in refused.items()))
