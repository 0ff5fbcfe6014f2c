"""The only place the kube_real tests import the service's Kubernetes platform from.

The platform package is being reshaped; when a name moves, fix it here and nowhere else
(the watcher itself is run by tests/platform/kube_helpers.py's ``running``). Besides the
imports: a listener that keeps the latest report per pool and member, and polling.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from kube_helpers import IgnoresReplicas, eventually, running

from extproc.metrics import WATCH_RESTARTS
from extproc.platform.kube.actuator import Actuator
from extproc.platform.kube.client import make_api_client
from extproc.platform.kube.credentials import from_kubeconfig
from extproc.platform.kube.recorder import EventRecorder
from extproc.names import LEADER_ANNOTATION
from extproc.platform.kube.platform import KubePlatform
from extproc.platform.kube.rest import ApiError, KubeClient
from extproc.platform.kube.status import StatusWriter
from extproc.policy.model import (
    MemberObservation,
    PoolKey,
    PoolPhase,
    PoolSpec,
    PoolStatus,
    PoolView,
    StartHints,
)
from extproc.settings import Settings


__all__ = ["Actuator", "ApiError", "EventRecorder", "KubeClient", "KubePlatform",
           "LEADER_ANNOTATION", "LatestReports", "MemberObservation", "PoolKey", "PoolPhase",
           "PoolView", "Settings", "StatusWriter", "api_client", "from_kubeconfig", "restarts",
           "until", "watching"]


class LatestReports(IgnoresReplicas):
    """A PoolListener keeping the last spec per pool and the last observation per member."""

    def __init__(self) -> None:
        self.specs: dict[PoolKey, PoolSpec] = {}
        self.observed: dict[str, MemberObservation] = {}
        self.removed: list[PoolKey] = []
        self.statuses: dict[PoolKey, PoolStatus] = {}

    def pool_changed(self, spec: PoolSpec, hints: StartHints) -> None:
        """Keep the spec."""
        self.specs[spec.key] = spec

    def status_changed(self, key: PoolKey, status: PoolStatus) -> None:
        """Keep the status."""
        self.statuses[key] = status

    def pool_removed(self, key: PoolKey) -> None:
        """Note the removal."""
        self.specs.pop(key, None)
        self.removed.append(key)

    def member_changed(self, key: PoolKey, obs: MemberObservation) -> None:
        """Keep the observation."""
        self.observed[obs.name] = obs


@contextlib.asynccontextmanager
async def api_client(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    """The service's own API client, configured from ``kubeconfig``."""
    client = await make_api_client(Settings(kubeconfig=str(kubeconfig)))
    try:
        yield client
    finally:
        await client.close()


def watching(client: KubeClient, namespace: str, listener: LatestReports,
             **kwargs: Any) -> contextlib.AbstractAsyncContextManager[Any]:
    """Run a ClusterWatcher on ``namespace`` until the block ends; waits for its first sync
    (tests/platform's helper, given the real server's namespace and more time to sync)."""
    return running(client, listener, namespaces=(namespace,), sync_timeout=30.0, **kwargs)


def restarts(resource: str, reason: str) -> float:
    """How often the watchers restarted a watch of ``resource`` for ``reason`` (process-wide)."""
    return WATCH_RESTARTS.labels(resource, reason)._value.get()


async def until(check: Callable[[], Any], what: str = "") -> Any:
    """tests/platform's ``eventually`` with the real server's longer deadline (20 s)."""
    return await eventually(check, 20.0, what)


# Lease names, status and watch limits (test_real_limits.py)
from extproc.platform.kube.leases import LeaseClient, lease_name  # noqa: E402
from extproc.platform.kube.membership import Load, Membership  # noqa: E402
from extproc.platform.kube.status import MESSAGE_LIMIT, TRUNCATED  # noqa: E402

# Credentials renewed on a 401 (test_real_credentials.py)
from extproc.platform.kube import credentials as credentials_module  # noqa: E402
from extproc.platform.kube.credentials import Credentials  # noqa: E402

__all__ += ["Credentials", "LeaseClient", "Load", "Membership", "MESSAGE_LIMIT", "TRUNCATED",
            "credentials_module", "lease_name"]
