"""All pools served by this process: the model registry and one driver per pool.

The Hub is the runtime's ``PoolListener`` (``platform/contract.py``): the platform (Kubernetes
watch or a static file) reports pools and members to it; the protocol layer asks
``resolve(model)`` on every request, which is a dictionary lookup.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..logs import get_logger
from ..platform.contract import IDLE_LOAD, Peer, Platform, PoolLoad
from ..policy.machine import Limits
from ..policy.model import (
    Actuation,
    MemberObservation,
    PeerState,
    PoolKey,
    PoolSpec,
    PoolStatus,
    StartHints,
)
from ..settings import Settings
from .driver import PoolDriver
from .scaling import Retry

log = get_logger(__name__)


def _shape(peers: Sequence[Peer]) -> tuple[object, ...]:
    """What every pool reads of the peers besides their counts (a live one's silence aside)."""
    return tuple((p.identity, p.lease_name, p.lost, p.silent_since if p.lost else None,
                  p.pools is None, p.scopes) for p in peers)


@dataclass(frozen=True, slots=True)
class Route:
    """Where a model name leads: a pool's driver and the member in it."""

    driver: PoolDriver
    member: str


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One row of GET /v1/models."""

    id: str
    namespace: str
    pool: str
    member: str


def limits_from(settings: Settings) -> Limits:
    """The policy knobs that come from process settings."""
    return Limits(swap_timeout=settings.swap_timeout, failure_backoff=settings.failure_backoff,
                  retry_after_default=settings.retry_after_default,
                  retry_after_max=settings.retry_after_max, idle_gate=settings.idle_gate,
                  drain_linger=settings.drain_linger, probe_retry=settings.probe_retry,
                  max_held=settings.max_held, stall_after=settings.stall_after,
                  idle_report=settings.idle_report, lost_replica_wait=settings.lost_replica_wait,
                  activation_grace=settings.activation_grace,
                  activation_retries=settings.activation_retries,
                  hands_off_quiet=settings.hands_off_quiet,
                  paced_release=settings.paced_release, carry_timeout=settings.carry_timeout,
                  write_landing=settings.api_request_timeout)


class Hub:
    """Keeps a PoolDriver per ModelPool and the model-name index over them."""

    def __init__(self, settings: Settings, platform: Platform) -> None:
        self._limits = limits_from(settings)
        self._retry = Retry(settings.api_retry_initial, settings.api_retry_max)
        # auto starts each pool in own mode and hands it to LLMKube once its status shows
        # another writer (policy/modes.py); a static pools file has no LLMKube to hand to.
        self._auto = settings.actuation == "auto" and not settings.pools_file
        self._actuation = Actuation.LLMKUBE if settings.actuation == "llmkube" else Actuation.OWN
        self._platform = platform
        # Several replicas: what the platform reported, kept for pools created later.
        self.admit_until = math.inf
        self._leaving = False
        self._leading: dict[PoolKey, bool] = {}
        self._announced: dict[PoolKey, tuple[int, str]] = {}
        self._peers: Sequence[Peer] = ()
        self._drivers: dict[PoolKey, PoolDriver] = {}
        self._names: dict[PoolKey, dict[str, str]] = {}  # each pool's routed names -> member
        self._claims: dict[str, set[PoolKey]] = {}  # model name -> the pools naming it
        self._routes: dict[str, Route] = {}
        self._ambiguous: dict[str, list[str]] = {}
        self._endpoints: dict[tuple[PoolKey, str], tuple[str, ...]] = {}
        self._endpoint_waits: dict[tuple[PoolKey, str], asyncio.Event] = {}

    def resolve(self, model: str) -> Route | None:
        """The route for a model name, or None when no pool serves it."""
        return self._routes.get(model)

    async def resolve_synced(self, model: str, timeout: float) -> Route | None:
        """The route for a model name once the platform's first full picture is in.

        A replica that has just started knows no pools yet: "no such model" would be a lie
        (and Envoy may send it requests before its health check says NOT_SERVING), so an
        unknown name waits up to ``timeout`` for the sync. Raises TimeoutError if it is
        still not in by then.
        """
        route = self._routes.get(model)
        if route is None and not self._platform.synced.is_set():
            await asyncio.wait_for(self._platform.synced.wait(), timeout)
            route = self._routes.get(model)
        return route

    def ambiguity(self, model: str) -> list[str]:
        """Pools that all claim ``model`` (so none is chosen), or an empty list."""
        return self._ambiguous.get(model, [])

    def drivers(self) -> list[PoolDriver]:
        """Every pool's driver."""
        return list(self._drivers.values())

    @property
    def models(self) -> list[ModelEntry]:
        """Every routed model name, pool by pool (GET /v1/models)."""
        return [ModelEntry(name, key.namespace, key.name, member)
                for key in sorted(self._names, key=str)
                for name, member in self._names[key].items()]

    # ---- PoolListener: what the platform reports --------------------------------------------

    def pool_changed(self, spec: PoolSpec, hints: StartHints) -> None:
        """A pool appeared or its spec changed; ``hints`` seed a new pool's start-up."""
        driver = self._drivers.get(spec.key)
        if driver is None:
            # with leader Leases a pool follows until its election answers (policy/replicas.py)
            actuation = Actuation.FOLLOW if self._actuation is Actuation.OWN and \
                self._platform.elects else self._actuation
            driver = self._drivers[spec.key] = PoolDriver(
                spec, self._limits, self._platform, self._retry, hints=hints,
                actuation=actuation, auto=self._auto)
            if self.admit_until != math.inf:
                driver.admission(self.admit_until)
            if spec.key in self._leading:
                driver.lead(self._leading[spec.key])
            if spec.key in self._announced:
                driver.announced(*self._announced[spec.key])
            driver.observe_peers(self._peer_states(spec.key))
            log.info("pool added", namespace=spec.key.namespace, pool=spec.key.name,
                     members=list(spec.members), default=spec.default,
                     actuation="auto" if self._auto else self._actuation.value,
                     swap_delay=spec.swap_delay, scheduler=spec.scheduler_name)
        elif driver.spec != spec:
            driver.respec(spec)
        self._reindex(spec.key)

    def pool_removed(self, key: PoolKey) -> None:
        """A pool was deleted: its waiters are rejected and its models unrouted."""
        driver = self._drivers.pop(key, None)
        self._leading.pop(key, None)
        self._announced.pop(key, None)
        if driver is not None:
            driver.close()
            log.info("pool removed", namespace=key.namespace, pool=key.name)
        self._reindex(key)

    def member_changed(self, key: PoolKey, obs: MemberObservation) -> None:
        """The cluster's view of a member changed."""
        driver = self._drivers.get(key)
        if driver is not None and driver.tracks(obs.name):
            driver.observe(obs)

    def endpoints_changed(self, key: PoolKey, member: str, endpoints: tuple[str, ...]) -> None:
        """A member's Ready pods changed: the endpoint picker chooses among these."""
        self._endpoints[(key, member)] = endpoints
        wait = self._endpoint_waits.pop((key, member), None)
        if wait is not None:
            wait.set()

    def endpoints(self, key: PoolKey, member: str) -> tuple[str, ...]:
        """A member's Ready pods as ``ip:port`` (empty when none is known)."""
        return self._endpoints.get((key, member), ())

    async def endpoints_change(self, key: PoolKey, member: str, timeout: float) -> None:
        """Return once the member's endpoints change, or after ``timeout`` seconds."""
        wait = self._endpoint_waits.setdefault((key, member), asyncio.Event())
        try:
            await asyncio.wait_for(wait.wait(), timeout)
        except TimeoutError:
            pass

    def status_changed(self, key: PoolKey, status: PoolStatus) -> None:
        """The pool's status changed (followed in llmkube mode, a conflict sign in own)."""
        driver = self._drivers.get(key)
        if driver is not None:
            driver.observe_status(status)

    def admission_changed(self, until: float) -> None:
        """This replica's membership Lease moved: every pool admits until ``until``."""
        if self._leaving:
            return
        self.admit_until = until
        for driver in self._drivers.values():
            driver.admission(until)

    def stop_admitting(self) -> None:
        """Shutting down: nothing is admitted any more, whatever the Lease says."""
        self.admission_changed(-math.inf)
        self._leaving = True

    def leadership_changed(self, key: PoolKey, leading: bool) -> None:
        """This replica gained or lost a pool's leader Lease."""
        self._leading[key] = leading
        driver = self._drivers.get(key)
        if driver is not None:
            driver.lead(leading)

    def peers_changed(self, peers: Sequence[Peer]) -> None:
        """The other replicas' counts: each pool hears its own part, when that part changed.

        A peer's renew moves its ``silent_since`` but, while it is live, no pool reads that
        (policy/replicas.py waits on lost peers only): unless a peer joined, left, was lost or
        came back, only the pools whose counts moved hear of it, not every pool at each renew.
        """
        before, self._peers = self._peers, peers
        if _shape(before) != _shape(peers):
            keys: list[PoolKey] = list(self._drivers)
        else:
            moved: set[str] = set()
            for old, new in zip(before, peers, strict=True):  # same shape: same peers
                if old.pools is not None and new.pools is not None:
                    moved.update(k for k in old.pools.keys() | new.pools.keys()
                                 if old.pools.get(k, IDLE_LOAD) != new.pools.get(k, IDLE_LOAD))
            keys = [PoolKey(*k.split("/", 1)) for k in moved]
        for key in keys:
            driver = self._drivers.get(key)
            if driver is not None:
                driver.observe_peers(self._peer_states(key))

    def drain_announced(self, key: PoolKey, epoch: int, target: str) -> None:
        """A pool's drain announcement in force."""
        self._announced[key] = (epoch, target)
        driver = self._drivers.get(key)
        if driver is not None:
            driver.announced(epoch, target)

    def replica_load(self) -> Mapping[str, PoolLoad]:
        """This replica's counts per pool, for its membership Lease."""
        return {str(key): driver.load() for key, driver in self._drivers.items()}

    def _peer_states(self, key: PoolKey) -> tuple[PeerState, ...]:
        states = []
        for peer in self._peers:
            if peer.scopes and key.namespace not in peer.scopes:
                continue  # it does not serve this pool: nothing of it to wait for
            load = None if peer.pools is None else peer.pools.get(str(key), IDLE_LOAD)
            if load is None:
                states.append(PeerState(peer.identity, peer.silent_since, lost=True))
            else:
                states.append(PeerState(peer.identity, peer.silent_since, peer.lost, load.acked,
                                        load.in_flight, load.held))
        return tuple(states)

    def reject_held(self, code: str, message: str) -> None:
        """Answer every held request in every pool with 503 now (before a shutdown)."""
        for driver in self._drivers.values():
            driver.reject_held(code, message)

    def close(self) -> None:
        """Stop every driver (shutdown)."""
        for driver in self._drivers.values():
            driver.close()

    def _reindex(self, key: PoolKey) -> None:
        """Re-file one pool's model names; only the names it gained or lost are routed anew
        (a start reports every pool in turn: re-filing all of them each time is quadratic)."""
        old = self._names.pop(key, {})
        driver = self._drivers.get(key)
        names: dict[str, str] = {}
        if driver is not None:
            names = {m: m for m in driver.spec.members}
            names.update(driver.spec.aliases)
            for name in driver.spec.unrouted:  # an older pool holds it (kube/claims.py)
                names.pop(name, None)
            self._names[key] = names
        for name in old.keys() - names.keys():
            self._claims[name].discard(key)
        for name in names.keys() - old.keys():
            self._claims.setdefault(name, set()).add(key)
        for name in old.keys() | names.keys():
            self._route(name)

    def _route(self, name: str) -> None:
        """Route ``name`` to the one pool naming it; refuse it when several do."""
        pools = self._claims.get(name, set())
        self._routes.pop(name, None)
        ambiguous = self._ambiguous.pop(name, None)
        if len(pools) == 1:
            (key,) = pools
            self._routes[name] = Route(self._drivers[key], self._names[key][name])
        elif pools:
            self._ambiguous[name] = sorted(map(str, pools))
            if ambiguous != self._ambiguous[name]:
                log.warning("model name claimed by several pools; requests for it are refused",
                            model=name, pools=self._ambiguous[name])
        else:
            del self._claims[name]
