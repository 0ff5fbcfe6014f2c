"""Each member's Ready pods as ``podIP:port`` (an IPv6 pod's as ``[podIP]:port``, see
``platform.hostport``): the endpoints an endpoint picker chooses from.

Fed from the same pod watch as the member observations (``watcher.py``); only used by
``--endpoint-picker``, where the InferencePool's gateway connects to the pod the picker names.
A pod counts while it is Ready and not terminating, as an EndpointSlice's ``ready`` endpoint
would: a pod on its way out must get no new request, though it still holds the GPU.
"""

from __future__ import annotations

from typing import Any

from extproc.platform.hostport import join


def ready_ip(pod: dict[str, Any]) -> str:
    """The pod's (primary) IP while it is Ready and not being deleted, else ""."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    # podIP is podIPs[0], the cluster's primary family (IPv4 or IPv6): a dual-stack pod is
    # named by it alone, one endpoint per pod; PodEndpoints.of brackets an IPv6 one
    if meta.get("deletionTimestamp") or not status.get("podIP"):
        return ""
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or [])
    return str(status["podIP"]) if ready else ""


class PodEndpoints:
    """Index (namespace, member) -> {pod: ip} of Ready pods, with the port they serve on."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._pods: dict[tuple[str, str], tuple[str, str]] = {}  # (ns, pod) -> (member, ip)
        self._members: dict[tuple[str, str], dict[str, str]] = {}  # (ns, member) -> pod -> ip

    def apply(self, namespace: str, pod: str, member: str, ip: str) -> list[str]:
        """Record one pod's member and Ready IP ("" for none); the members whose set changed."""
        old = self._pods.pop((namespace, pod), ("", ""))
        new = (member, ip) if member and ip else ("", "")
        if new[0]:
            self._pods[(namespace, pod)] = new
        if old == new:
            return []
        if old[0]:
            self._members.get((namespace, old[0]), {}).pop(pod, None)
        if new[0]:
            self._members.setdefault((namespace, new[0]), {})[pod] = ip
        return sorted({m for m, _ in (old, new) if m})

    def of(self, namespace: str, member: str) -> tuple[str, ...]:
        """The member's Ready pods as ``ip:port`` (``[ip]:port`` for IPv6), sorted."""
        ips = self._members.get((namespace, member), {}).values()
        return tuple(sorted({join(ip, self._port) for ip in ips}))
