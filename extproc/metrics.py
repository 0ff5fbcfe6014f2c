"""Prometheus metrics, named as LLMKube's router names them so existing dashboards keep working.

Every metric lives in ``REGISTRY`` (not the global default registry) so tests and several
in-process servers never collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

_SWAP_BUCKETS = (0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600)
_DECISION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 1)

RESIDENT = Gauge(
    "llmkube_modelpool_resident", "1 for the member that owns the pool's slot, else 0",
    ["namespace", "pool", "member"], registry=REGISTRY)
SWAPS = Counter(
    "llmkube_modelpool_swaps_total", "Swaps finished, by source, target and outcome",
    ["namespace", "pool", "from", "to", "outcome"], registry=REGISTRY)
SWAP_DURATION = Histogram(
    "llmkube_modelpool_swap_duration_seconds", "Time from swap start to target Ready",
    ["namespace", "pool"], buckets=_SWAP_BUCKETS, registry=REGISTRY)
HOLD_DURATION = Histogram(
    "llmkube_modelpool_hold_duration_seconds", "Time a request was held, by how it ended",
    ["namespace", "pool", "outcome"], buckets=_SWAP_BUCKETS, registry=REGISTRY)
COALESCED = Counter(
    "llmkube_modelpool_coalesced_total", "Held requests that joined a swap already under way",
    ["namespace", "pool"], registry=REGISTRY)
HELD = Gauge(
    "llmkube_modelpool_held_requests", "Requests currently held waiting for a swap",
    ["namespace", "pool"], registry=REGISTRY)
SWAP_DEFERRED = Counter(
    "modelpool_extproc_swap_deferred_total", "Times a swap step was deferred, by reason",
    ["namespace", "pool", "reason"], registry=REGISTRY)

CONFLICTS = Counter(
    "modelpool_extproc_conflicts_total", "Times another controller was seen scaling members "
    "against us or writing the pool's status (own mode stops actuating the pool)",
    ["namespace", "pool"], registry=REGISTRY)
REQUESTS = Counter(
    "modelpool_extproc_requests_total", "Requests decided, by pool and outcome",
    ["namespace", "pool", "outcome"], registry=REGISTRY)
ERRORS = Counter(
    "modelpool_extproc_errors_total", "Error answers sent to clients, by code and status",
    ["code", "status"], registry=REGISTRY)
STREAMS_IN_FLIGHT = Gauge(
    "modelpool_extproc_streams_in_flight", "Open ext_proc streams (parked or admitted)",
    registry=REGISTRY)
EVENT_LOOP_TASKS = Gauge(
    "modelpool_extproc_event_loop_tasks", "asyncio tasks alive in the service's event loop "
    "(flat under steady load; growth means a leak)", registry=REGISTRY)
DECISION_SECONDS = Histogram(
    "modelpool_extproc_decision_seconds", "Time from the deciding message to the answer, "
    "held time excluded", buckets=_DECISION_BUCKETS, registry=REGISTRY)
KUBE_REQUESTS = Counter(
    "modelpool_extproc_kube_requests_total", "Kubernetes API calls, by verb, resource and "
    "HTTP status", ["verb", "resource", "code"], registry=REGISTRY)
WATCH_RESTARTS = Counter(
    "modelpool_extproc_watch_restarts_total", "Watch restarts, by resource and reason",
    ["resource", "reason"], registry=REGISTRY)


class PoolGauges:
    """One pool's metric children, created once (labels lookups are not free on the hot path)
    and removed together when the pool goes."""

    def __init__(self, namespace: str, pool: str) -> None:
        self._labels = (namespace, pool)
        self._held = HELD.labels(namespace, pool)
        self._coalesced = COALESCED.labels(namespace, pool)
        self._hold: dict[str, object] = {}
        self._members: set[str] = set()

    def held(self, count: int) -> None:
        """Requests currently held in this pool."""
        self._held.set(count)

    def coalesced(self) -> None:
        """A held request joined a swap already under way."""
        self._coalesced.inc()

    def hold_seconds(self, outcome: str, seconds: float) -> None:
        """How long a held request waited, by how it ended."""
        child = self._hold.get(outcome)
        if child is None:
            child = self._hold[outcome] = HOLD_DURATION.labels(*self._labels, outcome)
        child.observe(seconds)  # type: ignore[attr-defined]

    def swap_finished(self, source: str, target: str, outcome: str, seconds: float) -> None:
        """A swap completed or failed after ``seconds``."""
        SWAPS.labels(*self._labels, source, target, outcome).inc()
        if outcome == "completed":
            SWAP_DURATION.labels(*self._labels).observe(seconds)

    def deferred(self, reason: str) -> None:
        """A swap step was deferred."""
        SWAP_DEFERRED.labels(*self._labels, reason).inc()

    def resident(self, members: list[str], resident: str) -> None:
        """1 for the resident member, 0 for the others; members gone from the spec removed."""
        current = set(members)
        for gone in self._members - current:
            RESIDENT.remove(*self._labels, gone)
        for member in current:
            RESIDENT.labels(*self._labels, member).set(1 if member == resident else 0)
        self._members = current

    def conflict(self) -> None:
        """Another controller was seen fighting over this pool."""
        CONFLICTS.labels(*self._labels).inc()

    def remove(self) -> None:
        """Drop this pool's gauges (the pool is gone)."""
        HELD.remove(*self._labels)
        for member in self._members:
            RESIDENT.remove(*self._labels, member)
        self._members.clear()
