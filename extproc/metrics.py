"""Prometheus metrics: LLMKube's router series, exactly, plus our richer ``modelpool_extproc_*``.

``llmkube_modelpool_*`` carry LLMKube's names, label sets and buckets (its
``internal/metrics/metrics.go``), so dashboards built for its router keep working; ``router``
is this process's name (setting ``router_name``). Our own series carry what LLMKube's lack
(namespace, outcome) under ``modelpool_extproc_*``. The runtime reports through the functions
at the bottom, which feed both families at once, so the two can never disagree. Gauges of
request counts are set from the policy's own counts (``held_counts``), never moved by hand.

Every metric lives in ``REGISTRY`` (not the global default registry) so tests and several
in-process servers never collide. ``_created`` series are off: LLMKube's Go client emits none,
they double the series count, and Prometheus ignores them in the text format we serve.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector,
                               ProcessCollector, disable_created_metrics)
from prometheus_client.core import GaugeMetricFamily

disable_created_metrics()
REGISTRY = CollectorRegistry(auto_describe=True)
# process_* (memory, CPU, open fds: what an OOM kill investigation needs) and python_info
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

#: Pool phases of the ModelPool status, one 0/1 series each.
PHASES = ("Pending", "Ready", "Swapping", "Degraded")

_SWAP_BUCKETS = (0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600)
_DECISION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 1)
# LLMKube's own buckets, so its dashboards' quantiles mean the same thing
_LLMKUBE_SWAP_BUCKETS = tuple(float(2**i) for i in range(10))  # 1, 2, 4 ... 512 s
_LLMKUBE_HOLD_BUCKETS = tuple(round(0.1 * 2**i, 1) for i in range(12))  # 0.1 ... 204.8 s


def _twins(kind: Any, name: str, help_text: str, llmkube_labels: list[str],
           our_labels: list[str], buckets: tuple[tuple[float, ...], ...] = ()) -> tuple[Any, Any]:
    """One fact as two series: ``llmkube_modelpool_<name>`` with LLMKube's labels (and
    buckets), ``modelpool_extproc_<name>`` with ours."""
    extra = [{"buckets": b} for b in buckets] or [{}, {}]
    return (kind(f"llmkube_modelpool_{name}", help_text, llmkube_labels, registry=REGISTRY,
                 **extra[0]),
            kind(f"modelpool_extproc_{name}", help_text, our_labels, registry=REGISTRY,
                 **extra[1]))


# LLMKube's names, label sets and buckets first; ours (namespace, outcome) second.
RESIDENT = Gauge(
    "llmkube_modelpool_resident", "1 for the member that owns the pool's slot, else 0",
    ["namespace", "pool", "member"], registry=REGISTRY)
LLMKUBE_SWAPS, SWAPS = _twins(
    Counter, "swaps_total", "Swaps finished (LLMKube's: completed only), by source and target",
    ["router", "pool", "from", "to"], ["namespace", "pool", "from", "to", "outcome"])
LLMKUBE_SWAP_DURATION, SWAP_DURATION = _twins(
    Histogram, "swap_duration_seconds", "Time from swap start to target Ready",
    ["router", "pool"], ["namespace", "pool"], (_LLMKUBE_SWAP_BUCKETS, _SWAP_BUCKETS))
LLMKUBE_HOLD_DURATION, HOLD_DURATION = _twins(
    Histogram, "hold_duration_seconds", "Time a request was held for its member",
    ["router", "pool", "member"], ["namespace", "pool", "member", "outcome"],
    (_LLMKUBE_HOLD_BUCKETS, _SWAP_BUCKETS))
LLMKUBE_COALESCED, COALESCED = _twins(
    Counter, "coalesced_total", "Held requests that joined a swap already under way",
    ["router", "pool", "member"], ["namespace", "pool", "member"])
LLMKUBE_HELD, HELD = _twins(
    Gauge, "held_requests", "Requests currently held waiting for their member",
    ["router", "pool", "member"], ["namespace", "pool", "member"])
LLMKUBE_BUSY_SKIPS = Counter(
    "llmkube_modelpool_busy_skips_total", "Swap attempts put off because the incumbent was busy",
    ["router", "pool", "member"], registry=REGISTRY)
RECLAIMS = Counter(
    "llmkube_modelpool_reclaims_total", "Slots given back to spec.default by swapPolicy "
    "reclaim after the resident idled for reclaimAfter", ["namespace", "pool", "from", "to"],
    registry=REGISTRY)
HELD_LIMIT = Gauge(
    "modelpool_extproc_held_limit", "Held requests a pool takes at most (0 = no bound); "
    "beyond it requests get 503 at once (outcome too_many_held), or 429 for a negative "
    "priority (outcome request_shed)", ["namespace", "pool"],
    registry=REGISTRY)
SWAP_STALLED = Gauge(
    "modelpool_extproc_swap_stalled", "1 while the pool's swap has made no progress for "
    "--stall-after (condition SwapStalled), else 0", ["namespace", "pool"], registry=REGISTRY)
SWAP_DEFERRED = Counter(
    "modelpool_extproc_swap_deferred_total", "Times a swap step was deferred, by reason",
    ["namespace", "pool", "reason"], registry=REGISTRY)
PROMPT_CACHE_CARRY = Counter(
    "modelpool_extproc_prompt_cache_carry_total", "Prompt-cache saves and restores of members' "
    "llama.cpp slots, by step (save, restore) and outcome (ok, failed); a step the swap gave "
    "up waiting for counts as a PromptCacheCarryFailed notice", ["namespace", "pool", "member",
                                                                 "step", "outcome"],
    registry=REGISTRY)
PROMPT_CACHE_TOKENS = Counter(
    "modelpool_extproc_prompt_cache_tokens_total", "Prompt tokens saved or restored (llama.cpp's "
    "n_saved, n_restored), by step", ["namespace", "pool", "member", "step"], registry=REGISTRY)
REQUESTS_CUT = Counter(
    "modelpool_extproc_requests_cut_total", "Requests in flight on this replica when the idle "
    "probe was contradicted: reason StreamsCut (LLMKube unloaded the member under them) or "
    "IdleProbeMisread (the probe answered idle under them)",
    ["namespace", "pool", "member", "reason"], registry=REGISTRY)
NOTICES = Counter(
    "modelpool_extproc_notices_total", "Operator notices (the pool's Events), by kind",
    ["namespace", "pool", "kind"], registry=REGISTRY)
POOL_PHASE = Gauge(
    "modelpool_extproc_pool_phase", "1 for the pool's current status phase, 0 for the others",
    ["namespace", "pool", "phase"], registry=REGISTRY)
SWAP_IN_PROGRESS = Gauge(
    "modelpool_extproc_swap_in_progress", "1 while a swap is under way", ["namespace", "pool"],
    registry=REGISTRY)
SWAP_TARGET = Gauge(
    "modelpool_extproc_swap_target", "1 for the member a swap under way brings up (no series "
    "when none)", ["namespace", "pool", "member"], registry=REGISTRY)
SWAP_BUDGET = Gauge(
    "modelpool_extproc_swap_budget_seconds", "The pool's swapBudget: how long one request may "
    "be held", ["namespace", "pool"], registry=REGISTRY)
CONFLICTS = Counter(
    "modelpool_extproc_conflicts_total", "Times another controller was seen scaling members "
    "against us or writing the pool's status (own mode stops actuating the pool), or (llmkube "
    "mode) a member's replicas set by neither LLMKube nor us, by the kind "
    "of field manager that wrote (a fixed set: kubectl, argocd, flux, helm, autoscaler, "
    "unrecorded, other, unknown)", ["namespace", "pool", "manager"], registry=REGISTRY)
SERVING = Gauge(
    "modelpool_extproc_serving", "1 once every pool is synced and the service takes traffic",
    registry=REGISTRY)

REQUESTS = Counter(
    "modelpool_extproc_requests_total", "Requests decided, by pool and outcome",
    ["namespace", "pool", "outcome"], registry=REGISTRY)
SERVED_ELSEWHERE = Counter(
    "modelpool_extproc_picker_served_elsewhere_total", "Endpoint picker: responses whose "
    "gateway reported (envoy.lb x-gateway-destination-endpoint-served) an endpoint other than "
    "the one picked: its retry or fallback moved the request", ["namespace", "pool"],
    registry=REGISTRY)
MALFORMED = Counter(
    "modelpool_extproc_malformed_messages_total", "ext_proc messages that did not decode "
    "(their streams end INVALID_ARGUMENT; the log says so at most once per 10 s)",
    registry=REGISTRY)
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

# Deferral reasons that mean "the incumbent is still serving" (LLMKube's busy skip).
_BUSY_REASONS = frozenset({"PodsBusy"})
_router = "default"


def configure(router_name: str) -> None:
    """Set the ``router`` label of the LLMKube series (LLMKube: env ROUTER_NAME)."""
    global _router
    _router = router_name


def held_counts(namespace: str, pool: str, counts: dict[str, int],
                members: Iterable[str]) -> None:
    """Requests held per member, as the pool's request book counts them (0 for the rest)."""
    for member in members:
        held = counts.get(member, 0)
        HELD.labels(namespace, pool, member).set(held)
        LLMKUBE_HELD.labels(_router, pool, member).set(held)


def request_coalesced(namespace: str, pool: str, member: str) -> None:
    """A request for ``member`` was held on a swap already under way for it."""
    COALESCED.labels(namespace, pool, member).inc()
    LLMKUBE_COALESCED.labels(_router, pool, member).inc()


def hold_ended(namespace: str, pool: str, member: str, outcome: str, seconds: float) -> None:
    """A held request stopped waiting: admitted, rejected (its error code) or disconnected."""
    HOLD_DURATION.labels(namespace, pool, member, outcome).observe(seconds)
    LLMKUBE_HOLD_DURATION.labels(_router, pool, member).observe(seconds)


def swap_finished(namespace: str, pool: str, source: str, target: str, completed: bool,
                  seconds: float) -> None:
    """A swap ended; LLMKube counts and times only the ones that completed."""
    SWAPS.labels(namespace, pool, source, target, "completed" if completed else "failed").inc()
    if completed:
        SWAP_DURATION.labels(namespace, pool).observe(seconds)
        LLMKUBE_SWAPS.labels(_router, pool, source, target).inc()
        LLMKUBE_SWAP_DURATION.labels(_router, pool).observe(seconds)


def swap_deferred(namespace: str, pool: str, reason: str, incumbent: str) -> None:
    """A swap step was put off (``reason`` as in the SwapDeferred condition)."""
    SWAP_DEFERRED.labels(namespace, pool, reason).inc()
    if reason in _BUSY_REASONS and incumbent:
        LLMKUBE_BUSY_SKIPS.labels(_router, pool, incumbent).inc()


def reclaimed(namespace: str, pool: str, source: str, target: str) -> None:
    """swapPolicy reclaim gave the slot from ``source`` back to ``target`` (spec.default)."""
    RECLAIMS.labels(namespace, pool, source, target).inc()


def notice(namespace: str, pool: str, kind: str) -> None:
    """An operator notice (SwapStarted, SwapFailed, MemberLost ...) was raised."""
    NOTICES.labels(namespace, pool, kind).inc()


def prompt_cache_carried(namespace: str, pool: str, member: str, step: str, ok: bool,
                         tokens: int) -> None:
    """A save or restore of ``member``'s slots ended (ok: it took effect)."""
    PROMPT_CACHE_CARRY.labels(namespace, pool, member, step, "ok" if ok else "failed").inc()
    PROMPT_CACHE_TOKENS.labels(namespace, pool, member, step).inc(tokens)


def requests_cut(namespace: str, pool: str, member: str, reason: str, count: int) -> None:
    """The idle probe of ``member`` read idle under ``count`` of our requests (probecheck)."""
    REQUESTS_CUT.labels(namespace, pool, member, reason).inc(count)


def conflict(namespace: str, pool: str, manager: str) -> None:
    """Another controller fights over this pool (own mode stopped actuating it, llmkube mode
    saw a member's replicas written beside LLMKube); ``manager``
    is the bounded kind of its field manager (``policy.writers.label``), never a raw name."""
    CONFLICTS.labels(namespace, pool, manager).inc()


def set_serving(serving: bool) -> None:
    """The service started (True) or stopped (False) taking traffic."""
    SERVING.set(1 if serving else 0)


class _SwapClock:
    """Exports ``modelpool_extproc_swap_age_seconds``, computed when scraped."""

    def __init__(self) -> None:
        self.started: dict[tuple[str, str], float] = {}

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("modelpool_extproc_swap_age_seconds", "How long the swap "
                                   "under way has been running (0 when none)",
                                   labels=["namespace", "pool"])
        now = time.monotonic()
        for (namespace, pool), started in list(self.started.items()):
            family.add_metric([namespace, pool], now - started if started else 0.0)
        yield family

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return self.collect()


_SWAP_CLOCK = _SwapClock()
REGISTRY.register(_SWAP_CLOCK)


def pool_published(view: Any, swap_budget: float, members: Iterable[str]) -> None:
    """A pool's snapshot changed: resident, phase, swap under way, target, budget.

    ``view`` is a ``PoolView``; ``members`` are the names whose series this call replaces
    (the members gauged before, so a member removed from the spec loses its series).
    """
    namespace, pool = view.key.namespace, view.key.name
    current = {m.name for m in view.members}
    for gone in set(members) - current:
        _remove(RESIDENT, namespace, pool, gone)
        _remove(SWAP_TARGET, namespace, pool, gone)
    for member in current:
        RESIDENT.labels(namespace, pool, member).set(1 if member == view.resident else 0)
        if member != view.pending:
            _remove(SWAP_TARGET, namespace, pool, member)
    if view.pending:
        SWAP_TARGET.labels(namespace, pool, view.pending).set(1)
    phase = getattr(view.phase, "value", view.phase)
    for name in PHASES:
        POOL_PHASE.labels(namespace, pool, name).set(1 if name == phase else 0)
    swapping = bool(view.pending)
    SWAP_IN_PROGRESS.labels(namespace, pool).set(1 if swapping else 0)
    clock = _SWAP_CLOCK.started
    if not swapping:
        clock[(namespace, pool)] = 0.0
    elif not clock.get((namespace, pool)):
        clock[(namespace, pool)] = time.monotonic()
    SWAP_BUDGET.labels(namespace, pool).set(swap_budget)
    HELD_LIMIT.labels(namespace, pool).set(view.max_held)
    SWAP_STALLED.labels(namespace, pool).set(1 if view.stalled else 0)


def pool_closed(namespace: str, pool: str, members: Iterable[str]) -> None:
    """The pool is no longer served: drop every per-pool series that has no history."""
    for member in members:
        for gauge in (RESIDENT, SWAP_TARGET, HELD):
            _remove(gauge, namespace, pool, member)
        _remove(LLMKUBE_HELD, _router, pool, member)
    for name in PHASES:
        _remove(POOL_PHASE, namespace, pool, name)
    for gauge in (SWAP_IN_PROGRESS, SWAP_BUDGET, HELD_LIMIT, SWAP_STALLED):
        _remove(gauge, namespace, pool)
    _SWAP_CLOCK.started.pop((namespace, pool), None)


def _remove(metric: Any, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass  # never set: nothing to drop
