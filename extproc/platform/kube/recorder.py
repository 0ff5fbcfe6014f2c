"""Record core/v1 Events on ModelPools, so ``kubectl describe mpool`` tells the swap story."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable
from datetime import datetime, timezone

from extproc.logs import get_logger
from extproc.platform.kube._calls import GROUP, VERSION, counted, describe, segment
from extproc.platform.kube.rest import KubeClient
from extproc.policy.model import PoolKey

log = get_logger(__name__)

# Event names must be valid DNS subdomains (253 characters); keep room for "." + 16 hex digits.
_MAX_PREFIX = 253 - 17


class EventRecorder:
    """Creates Events whose involvedObject is a ModelPool; best-effort, never raises."""

    def __init__(self, api_client: KubeClient, component: str = "modelpool-extproc", *,
                 uids: Callable[[PoolKey], str] | None = None) -> None:
        self._api = api_client
        self._component = component
        # kubectl describe looks Events up by involvedObject.uid too, so an Event without the
        # pool's uid would not show; ``uids`` (e.g. ClusterWatcher.pool_uid) fills it in.
        self._uids = uids
        self._host = os.environ.get("POD_NAME") or socket.gethostname()

    async def record(self, key: PoolKey, reason: str, message: str, *, warning: bool = False,
                     uid: str = "") -> None:
        """Create one Event on the pool ``key`` (type Warning when ``warning``)."""
        uid = uid or (self._uids(key) if self._uids else "")
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        involved = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelPool",
                    "name": key.name, "namespace": key.namespace}
        if uid:
            involved["uid"] = uid
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{key.name[:_MAX_PREFIX]}.{secrets.token_hex(8)}",
                         "namespace": key.namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": self._component, "host": self._host},
            "reportingComponent": self._component,
            "reportingInstance": self._host,
        }
        try:
            await counted("create", "events", self._api.call(
                "POST", f"/api/v1/namespaces/{segment(key.namespace)}/events", body=body,
                content_type="application/json"))
        except Exception as exc:
            # An Event is narration, not state: losing one must never fail or stall a swap.
            log.warning("event not recorded", namespace=key.namespace, pool=key.name, reason=reason,
                        error=describe(exc))
            return
        log.debug("event recorded", namespace=key.namespace, pool=key.name, reason=reason, event_message=message)
