"""Kubernetes side of the platform layer: watch pools and members, scale, publish status, events.

Layering: this package may import ``extproc.policy.model``, ``extproc.settings``,
``extproc.metrics`` and ``extproc.logs`` only; the runtime drives it, never the other way round.
Every API call goes through ``_calls.counted`` so ``KUBE_REQUESTS`` sees all of them.
"""

from extproc.platform.kube.actuator import Actuator, MemberMissing
from extproc.platform.kube.cache import ClusterWatcher
from extproc.platform.kube.client import make_api_client
from extproc.platform.kube.events import EventRecorder
from extproc.platform.kube.idle import probe_idle
from extproc.platform.kube.status import StatusPublisher, StatusWriter, desired_status
from extproc.platform.listener import PoolListener

__all__ = [
    "Actuator",
    "ClusterWatcher",
    "EventRecorder",
    "MemberMissing",
    "PoolListener",
    "StatusPublisher",
    "StatusWriter",
    "desired_status",
    "make_api_client",
    "probe_idle",
]
