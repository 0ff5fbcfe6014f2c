"""Watch ModelPools, member InferenceServices and member pods; join them into pool specs and
member observations; tell a listener what changed.

Theory of operation. One ``watchloop.CollectionWatch`` per (kind, namespace) lists, then
watches, resuming and re-listing as that module says; each list is diffed against the cache,
so a change made while the loop was blind is still reported. ``relist()`` restarts every loop
from a fresh list (a replica that was cut off from the API must not trust its cache).

The listener hears nothing until the first list of every kind is in: reporting a pool before
its members were listed would show them as missing and degrade the pool for no reason. Then
every pool is reported, a batch at a time so the loop keeps turning (``synced`` once all
are). After that, every change is reported once, and an unchanged observation never is.

Pods: only pods labelled ``inference.llmkube.dev/service`` are watched by default
(``Settings.pod_selector``). LLMKube writes that label (and ``app``) on every pod it creates,
and a selector keeps the pod watch down to model servers even cluster-wide, where "all pods"
would stream every pod of every workload. An empty selector watches all pods in the watched
namespaces, which makes the ``app`` fallback count hand-made members with only ``app=<member>``.

Re-reads. After a write was refused (409: the object changed since we looked), ``reread``
fetches that one object (a list with a name field selector: the RBAC grants list, not get)
and applies it like a watch event, so the policy decides again on the fresh state. The watch
may still deliver older events of that object afterwards (it lags): the cache then steps back
until the watch catches up, as with any watch lag, and a write decided meanwhile is refused
and re-read once more. Skipping those events instead would need to know which versions are
older, and resourceVersions are opaque (only equality is defined).
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from extproc.logs import get_logger
from extproc.platform.contract import PoolListener
from extproc.platform.kube._calls import POOLS, SERVICES, counted, custom_path, segment
from extproc.platform.kube.autoscalers import (ABSENT_RETRY, KINDS, OPTIONAL, Autoscalers,
                                               collection_path)
from extproc.platform.kube.claims import NameClaims, claimed
from extproc.platform.kube.idle import IdleProbe
from extproc.platform.kube.endpoints import PodEndpoints, ready_ip
from extproc.platform.kube.idle.probes import SLOTS
from extproc.platform.kube.slotcounts import SlotCounts
from extproc.platform.kube.objects import (REPLICAS_FIELD, SLOT_FIELDS, field_owner,
                                            object_key, pod_member, pool_spec, pool_status,
                                            service_capacity, service_carry, service_probe,
                                            service_state)
from extproc.platform.kube.rest import KubeClient
from extproc.platform.kube.watchloop import CollectionWatch
from extproc.policy.model import MemberObservation, PoolKey, PoolSpec, PoolStatus, StartHints
from extproc.settings import Settings

log = get_logger(__name__)

PODS = "pods"
ANNOUNCE_BATCH = 50  # pools reported at the first sync between two turns of the event loop
WATCHED = (POOLS, SERVICES, PODS, *KINDS)  # the kinds listed before the first report


@dataclass(slots=True)
class _Pool:
    """What the cache keeps of one ModelPool object: its spec and problems as reported (the
    declared ones, less the model names an older pool holds: claims.py)."""

    spec: PoolSpec
    problems: tuple[str, ...]
    status: dict
    uid: str
    resource_version: str
    declared: PoolSpec
    declared_problems: tuple[str, ...]
    written_by: str = ""  # the field manager that last set the status's slot fields


class ClusterWatcher:
    """Lists and watches pools, members and pods forever, keeping a joined in-memory cache."""

    def __init__(self, api_client: KubeClient, settings: Settings, *,
                 ours: Callable[[PoolKey, dict], bool] = lambda key, status: False) -> None:
        self._api = api_client
        # Tells our own status writes from others' (StatusWriter.matches): a status change
        # that is not ours means another controller writes this pool's status.
        self._ours = ours
        self._statuses: dict[PoolKey, PoolStatus] = {}  # last reported per pool
        self._scopes = list(settings.namespaces) or [""]  # "" = all namespaces
        self._listener: PoolListener | None = None
        self._settings = settings
        self._pod_selector = settings.pod_selector or None
        self.synced = asyncio.Event()  # every pool of the first lists reported
        self._reporting = False  # the first list of every kind is in: changes are reported
        self._unreported: set[PoolKey] = set()  # pools of the first lists not reported yet
        self._group: asyncio.TaskGroup | None = None
        self._loops: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._relisting: set[tuple[str, str]] = set()
        self._fresh = asyncio.Event()
        self._listed: set[tuple[str, str]] = set()
        self._pools: dict[PoolKey, _Pool] = {}
        self._claims = NameClaims()  # which pool holds each model name
        self._services: dict[tuple[str, str], tuple[str, int]] = {}
        self._capacities: dict[tuple[str, str], int] = {}  # pacing.py's annotation
        self._carried: dict[tuple[str, str], str] = {}  # carry.py's annotation: the model
        self._replicas_by: dict[tuple[str, str], str] = {}  # spec.replicas' field manager
        self._autoscalers = Autoscalers()  # HPAs and ScaledObjects aimed at members
        # llama.cpp members' slot counts, read from /slots once per load (paced release)
        self._slot_counts = SlotCounts(self._slot_url, settings,
                                       lambda ns, member: self._refresh(ns, member))
        self._service_versions: dict[tuple[str, str], str] = {}  # for trigger preconditions
        self._probes: dict[tuple[str, str], IdleProbe | None] = {}  # (namespace, member)
        self._pods: dict[tuple[str, str], str] = {}  # (namespace, pod) -> member ("" = none)
        self._pod_counts: Counter[tuple[str, str]] = Counter()  # (namespace, member) -> pods
        self._pools_of: dict[tuple[str, str], set[PoolKey]] = {}  # (namespace, member) -> pools
        self._indexed: dict[PoolKey, set[str]] = {}  # the same index, pool -> members
        self._delivered: dict[PoolKey, dict[str, MemberObservation]] = {}
        self._endpoints = PodEndpoints(settings.endpoint_port)

    # --- read accessors -----------------------------------------------------------------------

    def pools(self) -> list[PoolSpec]:
        """Every known pool's spec."""
        return [p.spec for p in self._pools.values()]

    def has_pool(self, key: PoolKey) -> bool:
        """Whether the pool currently exists (as far as the cache knows)."""
        return key in self._pools

    def observation(self, key: PoolKey, member: str) -> MemberObservation:
        """The current observation of ``member``, resolved in the pool's namespace."""
        return self._observe(key.namespace, member)

    def idle_probe(self, key: PoolKey, member: str) -> IdleProbe | None:
        """How to ask ``member`` whether it is idle (None: no probe applies, or unknown)."""
        return self._probes.get((key.namespace, member))

    def carried_model(self, key: PoolKey, member: str) -> str:
        """The model whose prompt cache ``member`` carries over swaps ("" : none)."""
        return self._carried.get((key.namespace, member), "")

    def member_replicas(self, key: PoolKey, member: str) -> tuple[int, str]:
        """(spec.replicas, resourceVersion) of ``member`` as last seen ((0, "") if unknown)."""
        where = (key.namespace, member)
        state = self._services.get(where)
        return (state[1] if state else 0), self._service_versions.get(where, "")

    def members_of(self, key: PoolKey) -> list[str]:
        """The pool's members: its spec's, then those removed from it that are still indexed
        (one may hold the GPU until the pool has drained and unloaded it)."""
        pool = self._pools.get(key)
        named = list(pool.spec.members) if pool else []
        return named + sorted(self._indexed.get(key, set()).difference(named))

    def pool_status(self, key: PoolKey) -> dict:
        """The pool's ``.status`` as last seen ({} when unknown)."""
        pool = self._pools.get(key)
        return pool.status if pool else {}

    def pool_uid(self, key: PoolKey) -> str:
        """The pool's metadata.uid ("" when unknown)."""
        pool = self._pools.get(key)
        return pool.uid if pool else ""

    def pool_resource_version(self, key: PoolKey) -> str:
        """The pool object's resourceVersion as last seen ("" when unknown)."""
        pool = self._pools.get(key)
        return pool.resource_version if pool else ""

    def spec_problems(self, key: PoolKey) -> tuple[str, ...]:
        """Problems found in the pool's spec and annotations (values replaced by defaults)."""
        pool = self._pools.get(key)
        return pool.problems if pool else ()

    # --- the watch loops ----------------------------------------------------------------------

    async def run(self, listener: PoolListener) -> None:
        """List and watch every kind in every scope until cancelled, reporting to ``listener``."""
        self._listener = listener
        async with asyncio.TaskGroup() as group:
            self._group = group
            self._start_loops()

    def relist(self) -> asyncio.Event:
        """Drop every watch and list everything again (after this replica was cut off, its
        cache may be stale); the returned event is set once every kind is listed anew."""
        fresh = self._fresh = asyncio.Event()
        self._relisting = set(self._loops)
        for task in self._loops.values():
            task.cancel()
        self._start_loops()
        return fresh

    def _start_loops(self) -> None:
        assert self._group is not None
        for scope in self._scopes:
            for kind in WATCHED:
                watch = CollectionWatch(
                    self._api, kind, self._path(kind, scope), self._settings, scope=scope,
                    params={"labelSelector": self._pod_selector} if kind == PODS else None,
                    absent_retry=ABSENT_RETRY if kind in OPTIONAL else 0.0,
                    on_list=functools.partial(self._listed_all, kind, scope),
                    on_event=functools.partial(self._apply, kind))
                self._loops[(kind, scope)] = self._group.create_task(watch.run())

    async def reread(self, kind: str, namespace: str, name: str) -> None:
        """Read one pool or member again now and apply it (after a 409 on a write to it)."""
        path = self._path(kind, namespace)
        body = await counted("list", kind, self._api.call(
            "GET", path, params={"fieldSelector": f"metadata.name={name}"}, timeout=10.0))
        items = [o for o in body.get("items") or [] if object_key(o) == (namespace, name)]
        obj = items[0] if items else {"metadata": {"namespace": namespace, "name": name}}
        self._apply(kind, "MODIFIED" if items else "DELETED", obj)
        log.info("object re-read after a conflict", kind=kind, namespace=namespace, name=name,
                 resource_version=(obj.get("metadata") or {}).get("resourceVersion") or "")

    def _listed_all(self, kind: str, scope: str, items: list[dict]) -> None:
        self._replace(kind, scope, items)
        self._mark_listed(kind, scope)
        self._relisting.discard((kind, scope))
        if not self._relisting:
            self._fresh.set()

    def _path(self, kind: str, scope: str) -> str:
        """The collection URL of ``kind`` in ``scope`` ("" = every namespace)."""
        if kind == PODS:
            return f"/api/v1/namespaces/{segment(scope)}/pods" if scope else "/api/v1/pods"
        return collection_path(kind, scope) if kind in KINDS else custom_path(scope, kind)

    # --- applying lists and events to the cache -----------------------------------------------

    def _mark_listed(self, kind: str, scope: str) -> None:
        """Note a first list; once every kind in every scope is in, report the whole cache."""
        if self._reporting:
            return
        self._listed.add((kind, scope))
        if len(self._listed) < len(WATCHED) * len(self._scopes):
            return
        self._reporting = True
        self._unreported = set(self._pools)
        assert self._group is not None  # (lists come from the loops run() started)
        self._group.create_task(self._announce_all(list(self._pools)))

    async def _announce_all(self, keys: list[PoolKey]) -> None:
        """Report the pools of the first lists in batches, the loop turning in between: a
        thousand pools' machines started in one go would hold the Lease renews back.
        Changes that come meanwhile are reported at once (a pool then only once)."""
        for i, key in enumerate(keys):
            if i % ANNOUNCE_BATCH == ANNOUNCE_BATCH - 1:
                await asyncio.sleep(0)
            pool = self._pools.get(key)
            if pool is not None and key in self._unreported:
                self._announce(pool)
        self.synced.set()
        log.info("cache synced", pools=len(self._pools), services=len(self._services),
                 pods=len(self._pods))

    def _replace(self, kind: str, scope: str, items: list[dict]) -> None:
        """Make the cache hold exactly ``items`` for ``kind`` in ``scope``, reporting the diff."""
        fresh = {object_key(obj): obj for obj in items}
        if kind == POOLS:
            known = [(k.namespace, k.name) for k in self._pools]
        elif kind in KINDS:
            known = self._autoscalers.keys(kind, scope)
        else:
            known = list(self._services if kind == SERVICES else self._pods)
        for key in known:
            if key not in fresh and (not scope or key[0] == scope):
                self._apply(kind, "DELETED", {"metadata": {"namespace": key[0], "name": key[1]}})
        for obj in items:
            self._apply(kind, "MODIFIED", obj)

    def _apply(self, kind: str, event: str, obj: dict) -> None:
        """Apply one ADDED / MODIFIED / DELETED object of ``kind`` to the cache."""
        key = object_key(obj)
        deleted = event == "DELETED"
        if kind == POOLS:
            self._apply_pool(PoolKey(*key), None if deleted else obj)
        elif kind in KINDS:
            for member in self._autoscalers.apply(kind, *key, None if deleted else obj):
                self._refresh(key[0], member)
        elif kind == SERVICES:
            if deleted:
                self._services.pop(key, None)
                self._capacities.pop(key, None)
                self._carried.pop(key, None)
                self._replicas_by.pop(key, None)
                self._service_versions.pop(key, None)
                self._probes.pop(key, None)
            else:
                self._services[key] = service_state(obj)
                capacity, problem = service_capacity(obj)
                if problem and self._capacities.get(key, -1) != 0:
                    log.warning("member annotation ignored", namespace=key[0], member=key[1],
                                problem=problem)
                self._capacities[key] = capacity
                self._carried[key] = service_carry(obj)
                self._replicas_by[key] = field_owner(obj, REPLICAS_FIELD)
                self._service_versions[key] = (obj.get("metadata") or {}).get(
                    "resourceVersion") or ""
                self._probes[key] = service_probe(obj)
            self._refresh(key[0], key[1])
        else:
            old = self._pods.pop(key, "")
            new = "" if deleted else pod_member(obj)
            for member in self._endpoints.apply(*key, new, "" if deleted else ready_ip(obj)):
                self._report_endpoints(key[0], member)
            if not deleted:
                self._pods[key] = new
            if old != new:
                if old:
                    self._pod_counts[(key[0], old)] -= 1
                    self._refresh(key[0], old)
                if new:
                    self._pod_counts[(key[0], new)] += 1
                    self._refresh(key[0], new)

    def _apply_pool(self, key: PoolKey, obj: dict | None) -> None:
        """Store, replace or drop a pool; report it when its spec changed."""
        old = self._pools.get(key)
        if obj is None:
            if old is None:
                return
            del self._pools[key]
            for member in self._indexed.pop(key, ()):  # every member it ever had, see below
                self._pools_of[(key.namespace, member)].discard(key)
            self._delivered.pop(key, None)
            if self._reporting:
                self._call("pool_removed", key)
            self._reclaim(self._claims.drop(key))  # a name it held goes to the next claimant
            return
        meta = obj.get("metadata") or {}
        declared, declared_problems = pool_spec(obj, self._settings)
        uid = meta.get("uid") or ""
        if old is not None and old.uid != uid:
            # Deleted and re-created while we were not watching: a new pool, with an empty
            # status, that the runtime must treat as new rather than as an unchanged spec.
            self._apply_pool(key, None)
            old = None
        touched = self._claims.claim(key, meta.get("creationTimestamp") or "",
                                     (*declared.members, *declared.aliases))
        spec, problems = claimed(self._claims, declared, declared_problems)
        pool = _Pool(spec, problems, obj.get("status") or {}, uid,
                     meta.get("resourceVersion") or "", declared, declared_problems,
                     field_owner(obj, *SLOT_FIELDS))
        self._pools[key] = pool
        self._reclaim(touched)
        # A status-only update (our own write, mostly) is reported as a status change only.
        if old is not None and old.spec == spec:
            if old.status != pool.status:
                self._report_status(pool, changed=True)
            return
        # Members removed from the spec stay indexed: one that still holds the GPU must keep
        # being reported until the pool has drained and unloaded it (the runtime ignores
        # reports about members it no longer tracks).
        self._index(spec)
        if problems:
            log.warning("pool spec has problems", namespace=key.namespace, pool=key.name,
                        problems=list(problems))
        self._announce(pool)

    def _reclaim(self, keys: set[PoolKey]) -> None:
        """Re-derive the pools whose claims another pool's change touched; report changes."""
        for pool in [self._pools[key] for key in sorted(keys, key=str) if key in self._pools]:
            spec, pool.problems = claimed(self._claims, pool.declared, pool.declared_problems)
            if spec != pool.spec:
                pool.spec = spec
                log.warning("pool's refused model names changed", namespace=spec.key.namespace,
                            pool=spec.key.name, unrouted=list(spec.unrouted))
                self._announce(pool)

    def _index(self, spec: PoolSpec) -> None:
        """File the pool under each of its members in the member -> pools index."""
        self._indexed.setdefault(spec.key, set()).update(spec.members)
        for member in spec.members:
            self._pools_of.setdefault((spec.key.namespace, member), set()).add(spec.key)

    def _announce(self, pool: _Pool) -> None:
        """Report a pool and then every member's current observation (after sync only)."""
        if not self._reporting:
            return
        key = pool.spec.key
        self._unreported.discard(key)
        status = pool.status
        self._call("pool_changed", pool.spec,
                   StartHints(resident=str(status.get("residentMember") or ""),
                              pending=str(status.get("pendingMember") or "")))
        self._statuses.pop(key, None)
        self._report_status(pool, changed=False)
        delivered = self._delivered[key] = {}
        for member in pool.spec.members:
            obs = delivered[member] = self._observe(key.namespace, member)
            self._call("member_changed", key, obs)
            self._call("endpoints_changed", key, member, self._endpoints.of(key.namespace, member))

    def _report_endpoints(self, namespace: str, member: str) -> None:
        """Report the member's Ready pods to every pool it belongs to (after sync only)."""
        if not self._reporting:
            return
        endpoints = self._endpoints.of(namespace, member)
        for key in sorted(self._pools_of.get((namespace, member), ()), key=str):
            self._call("endpoints_changed", key, member, endpoints)

    def _report_status(self, pool: _Pool, *, changed: bool) -> None:
        """Report the pool's status if what routing reads of it changed (after sync only).

        Foreign: a change whose slot-owning fields do not show what we last wrote.
        """
        if not self._reporting:
            return
        key = pool.spec.key
        status = pool_status(pool.status, changed and not self._ours(key, pool.status),
                             pool.written_by)
        if self._statuses.get(key) != status:
            self._statuses[key] = status
            self._call("status_changed", key, status)

    def _refresh(self, namespace: str, member: str) -> None:
        """Report the member's observation to every pool it belongs to, if it changed."""
        if not member or not self._reporting:
            return
        obs = self._observe(namespace, member)
        for key in sorted(self._pools_of.get((namespace, member), ()), key=str):
            delivered = self._delivered.setdefault(key, {})
            if delivered.get(member) != obs:
                delivered[member] = obs
                self._call("member_changed", key, obs)

    def _observe(self, namespace: str, member: str) -> MemberObservation:
        """Join the member's InferenceService and pods into an observation."""
        pods = self._pod_counts[(namespace, member)]
        state = self._services.get((namespace, member))
        if state is None:
            return MemberObservation(member, exists=False, phase="", replicas=0, pods=pods)
        phase, replicas = state
        return self._with_slot_count(MemberObservation(
            member, exists=True, phase=phase, replicas=replicas, pods=pods,
            capacity=self._capacities.get((namespace, member), 0),
            carry=bool(self._carried.get((namespace, member))),
            replicas_by=self._replicas_by.get((namespace, member), ""),
            autoscaled_by=self._autoscalers.of(namespace, member)), namespace)

    def _with_slot_count(self, obs: MemberObservation, namespace: str) -> MemberObservation:
        """``obs`` with a llama.cpp member's slot count as its capacity (slotcounts.py)."""
        probe = self._probes.get((namespace, obs.name))
        return self._slot_counts.observed(namespace, obs, probe is not None and probe.kind == SLOTS,
                                          self._group.create_task if self._group else None)

    def _slot_url(self, namespace: str, member: str) -> str:
        """The member's /slots URL (the idle probe's template; its first pool's name)."""
        pools = sorted(self._pools_of.get((namespace, member), ()), key=str)
        return self._settings.idle_probe_url.format(
            member=member, namespace=namespace, pool=pools[0].name if pools else "")

    def _call(self, method: str, *args: Any) -> None:
        """Call the listener; a listener bug is logged, never allowed to stop the watch."""
        try:
            getattr(self._listener, method)(*args)
        except Exception:
            log.error("pool listener failed", exc_info=True, callback=method)
