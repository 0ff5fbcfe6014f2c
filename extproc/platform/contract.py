"""The one contract between the runtime and a platform (Kubernetes, or a static pools file).

Two directions, two Protocols:

* ``PoolListener`` is what a platform reports to: the runtime's ``Hub`` implements it. Its
  calls are synchronous and quick (a dictionary update and a policy step), so a watch can
  call them inline.
* ``Platform`` is what the runtime asks of a platform: watch and report (``run``), say when
  the first full picture is in (``synced``), carry out the policy's commands (``scale``,
  ``trigger``, ``probe_idle``), keep the pool's status (``publish``) and tell operators (``notify``).

Both implementations (``static.StaticPlatform``, ``kube.platform.KubePlatform``) implement
``Platform`` exactly; nothing in the runtime or ``app.py`` asks which one it has.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from ..policy.events import Notice
from ..policy.model import MemberObservation, PoolKey, PoolSpec, PoolStatus, PoolView, StartHints


class PoolListener(Protocol):
    """Receives pools and member observations from a platform."""

    def pool_changed(self, spec: PoolSpec, hints: StartHints) -> None:
        """A pool appeared or its spec changed; ``hints`` seed a new pool's machine."""

    def pool_removed(self, key: PoolKey) -> None:
        """A pool was deleted."""

    def member_changed(self, key: PoolKey, obs: MemberObservation) -> None:
        """A member's observation changed (also sent once per member after pool_changed)."""

    def status_changed(self, key: PoolKey, status: PoolStatus) -> None:
        """The pool's ``.status`` changed (also sent once right after pool_changed)."""


class Platform(Protocol):
    """What the runtime needs from the platform layer."""

    @property
    def synced(self) -> asyncio.Event:
        """Set once the first full picture of every pool and member has been reported."""

    async def run(self, listener: PoolListener) -> None:
        """Report pools and members to ``listener`` until cancelled."""

    async def stop(self) -> None:
        """Finish or drop background work and close connections (after ``run`` ends)."""

    async def scale(self, key: PoolKey, member: str, replicas: int) -> None:
        """Set a member's replicas: one attempt, raising on failure (the runtime retries)."""

    async def trigger(self, key: PoolKey, member: str) -> None:
        """llmkube mode: ``spec.replicas`` 0 -> 1 of ``member`` and nothing else, guarded by the
        resourceVersion last seen; done (no call) if the member already has replicas. One
        attempt, raising on failure or conflict (the runtime retries on a fresher view)."""

    async def probe_idle(self, key: PoolKey, member: str) -> bool | None:
        """Ask a member's runtime whether it is idle: True, False (busy), None (cannot tell)."""

    def publish(self, view: PoolView) -> None:
        """Make the pool's status reflect ``view`` (non-blocking, latest wins)."""

    def notify(self, key: PoolKey, notice: Notice) -> None:
        """Tell operators about a swap event (non-blocking, best effort)."""
