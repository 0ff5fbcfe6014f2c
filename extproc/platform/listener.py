"""What every pools source (Kubernetes watch, static file) reports to: the runtime's Hub."""

from __future__ import annotations

from typing import Protocol

from ..policy.model import MemberObservation, PoolKey, PoolSpec


class PoolListener(Protocol):
    """Receives pools and member observations; calls are synchronous, so they must be quick."""

    def pool_changed(self, spec: PoolSpec, status: dict) -> None:
        """A pool appeared or its spec changed; ``status`` is its current ``.status``."""

    def pool_removed(self, key: PoolKey) -> None:
        """A pool was deleted."""

    def member_changed(self, key: PoolKey, obs: MemberObservation) -> None:
        """A member's observation changed (also sent once per member after pool_changed)."""
