"""Make a pool member without a route visible: a Warning Event on its ModelPool.

Off by default (setting ``route_check_interval``). When on, every interval the service lists
the HTTPRoutes in each pool's namespace (RBAC: ``gateway.networking.k8s.io`` ``httproutes``
``list`` there) and warns once per member whose routing-header value no rule matches, so a
member added to a ModelPool without its route shows in ``kubectl describe mpool``. It says
so again only after the member was routed and then lost its route. With
``--endpoint-picker`` there are no member routes: the check is of the pool's InferencePool
instead (``poolcheck.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from extproc.logs import get_logger
from extproc.platform.kube._calls import counted, describe, segment
from extproc.platform.kube import poolcheck
from extproc.platform.kube.recorder import EventRecorder
from extproc.platform.kube.rest import KubeClient
from extproc.policy.model import PoolKey, PoolSpec
from extproc.settings import Settings

log = get_logger(__name__)

ROUTE_GROUP, ROUTE_VERSION, ROUTE_PLURAL = "gateway.networking.k8s.io", "v1", "httproutes"
REASON = "MemberUnroutable"


def header_values(httproutes: Iterable[dict[str, Any]]) -> set[str]:
    """Every header value the HTTPRoutes' rules match on (the routing-header values)."""
    values: set[str] = set()
    for route in httproutes:
        for rule in (route.get("spec") or {}).get("rules") or []:
            for match in rule.get("matches") or []:
                values |= {h.get("value", "") for h in match.get("headers") or []}
    return values


class RouteChecker:
    """Periodically compares the pools' members with the HTTPRoutes of their namespaces."""

    def __init__(self, api_client: KubeClient, settings: Settings, events: EventRecorder,
                 pools: Callable[[], Iterable[PoolSpec]]) -> None:
        self._api = api_client
        self._settings = settings
        self._events = events
        self._pools = pools
        self._warned: set[tuple[PoolKey, str]] = set()
        self._findings: set[tuple[PoolKey, str, str]] = set()  # InferencePool ones in force

    async def run(self) -> None:
        """Check every ``route_check_interval`` until cancelled."""
        while True:
            await self.check()
            await asyncio.sleep(self._settings.route_check_interval)

    async def check(self) -> None:
        """One pass: warn about each member newly without a route."""
        if self._settings.endpoint_picker:
            return await self.check_inference_pools()
        specs = list(self._pools())
        routed: dict[str, set[str]] = {}
        for namespace in sorted({s.key.namespace for s in specs}):
            try:
                listing = await counted("list", ROUTE_PLURAL, self._api.call(
                    "GET", f"/apis/{ROUTE_GROUP}/{ROUTE_VERSION}/namespaces/{segment(namespace)}/"
                    f"{ROUTE_PLURAL}"))
            except Exception as exc:
                # No RBAC or no Gateway API: nothing to compare with; say why, once per pass.
                log.warning("cannot list HTTPRoutes", namespace=namespace, error=describe(exc))
                continue
            routed[namespace] = header_values(listing.get("items") or [])
        template, header = self._settings.route_template, self._settings.route_header
        for spec in specs:
            if spec.key.namespace not in routed:
                continue
            for member in spec.members:
                value = template.format(member=member, pool=spec.key.name,
                                        namespace=spec.key.namespace)
                key = (spec.key, member)
                if value in routed[spec.key.namespace]:
                    self._warned.discard(key)
                elif key not in self._warned:
                    self._warned.add(key)
                    await self._events.record(
                        spec.key, REASON, f"member {member} has no HTTPRoute rule matching "
                        f"{header}: {value} in namespace {spec.key.namespace}; requests for "
                        "it cannot reach it (render one: modelpool-extproc render-routes)",
                        warning=True)

    async def check_inference_pools(self) -> None:
        """One pass behind an InferencePool gateway: warn about each new finding once."""
        found: set[tuple[PoolKey, str, str]] = set()
        specs = list(self._pools())
        for namespace in sorted({s.key.namespace for s in specs}):
            try:
                listed = await poolcheck.list_inference_pools(self._api, namespace)
                for spec in (s for s in specs if s.key.namespace == namespace):
                    found |= {(spec.key, *f) for f in
                              await poolcheck.findings(self._api, spec, listed)}
            except Exception as exc:
                log.warning("cannot check InferencePools", namespace=namespace,
                            error=describe(exc))
        for key, reason, message in sorted(found - self._findings, key=str):
            await self._events.record(key, reason, message, warning=True)
        self._findings = found
