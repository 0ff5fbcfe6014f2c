"""A stand-in for LLMKube's ModelPoolReconciler, so the local stack can play a real LLMKube cluster.

In a real cluster LLMKube's operator always runs a ModelPool reconciler that owns the members'
replicas and writes the whole pool status. This process behaves the same way (from the facts in
docs/design/llmkube.md, never from LLMKube's code; the decisions are in
``devstack.reconciler_plan``), so the ext_proc's ``--actuation llmkube`` mode, and its conflict
detection in own mode, can be exercised on loopback.

How it talks to the API, as LLMKube does:

- it watches ModelPools and InferenceServices, and caches the namespace's Models (the metal
  check reads them; the Model CRD must be installed); it does NOT watch Pods for passes: it
  lists a member's pods (labels ``app`` and ``inference.llmkube.dev/service``, both) when it
  needs them and, mid-swap, looks again every ``requeue`` seconds (3 s);
- its first pass runs only once every cache has listed (controller-runtime waits for its
  caches to sync), so start-up shows no transient MissingMembers;
- it patches member ``spec.replicas`` and, with merge patches and no resourceVersion (the last
  writer silently wins), only the pool ``status`` fields that changed against its cached copy;
- it asks every Ready non-owner's llama.cpp ``/slots`` whether a slot is processing before it
  unloads it, at ``http://<isvc>.<ns>.svc.cluster.local:<port>`` (``spec.endpoint.port``, else
  ``spec.containerPort``, else 8080); a timeout (5 s), an error or an answer it does not
  understand counts as "cannot tell" and defers the swap. On loopback no such name resolves:
  ``probe_proxy`` (``--probe-proxy``) sends those requests through an HTTP proxy that plays
  the cluster's DNS (``devstack.proberouter``);
- it records one kind of Event (LLMKube 0.10.16, #2356): a Warning ``MemberScaledOutside`` on
  every pool of a member whose ``spec.replicas`` went up by a field manager outside LLMKube
  (``managedFields``; ``reconciler_plan.scaled_up_outside``), naming the manager. The swap
  such a scale-up asks for happens as for any trigger;
- under ``swapPolicy: reclaim-down`` it probes the resident on every pass while nothing else
  is asked for (a pass every ``requeue`` seconds meanwhile) and releases it once every probe
  for ``spec.reclaimAfter`` said idle (``reconciler_plan``: the pool goes cold);
- it holds a swap away from a resident that became resident less than ``spec.swapDelay`` ago
  (``reconciler_plan``, step 3), looking again every ``requeue`` seconds meanwhile.

Opt-in fault: LLMKube's lost activation (``devstack.reconciler_fault``), per pool with the
annotation ``sim.llmkube.dev/lose-activations: "N"`` or for every pool with
``--lose-activations N``.

It runs as its own API user (``llmkube-controller``, token ``llmkube-controller-token``), so the
emulator's request record tells its calls apart from the ext_proc's.

CLI: ``python -m devstack.reconciler --kubeconfig K --namespace demo [--requeue 3s]
[--idle-timeout 5s] [--probe-proxy URL] [--lose-activations N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import logging
import math
import secrets
import time
from typing import Any, Iterable

import aiohttp
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from devstack.reconciler_fault import LostActivations
from devstack.reconciler_plan import PoolView, member_names, needs_idle_check, plan, \
    reclaims_down, resolve_owner, scaled_up_message, scaled_up_outside, status_patch
from devstack.simulator_kube import GROUP, MERGE_PATCH, PLURAL, SERVICE_LABEL, TRANSIENT, VERSION, \
    ApiSource, Backoff, Kube, await_first_lists, connect, controller_parser, disconnect, \
    duration_arg, parse_controller_args, run_controller, wait_event, watch_forever
from extproc.settings import parse_duration
from devstack.simulator_member import desired_replicas
# The same llama.cpp /slots reading the service uses: one fail-closed reading, not two twins.
from extproc.platform.kube.autoscalers import HPAS
from extproc.platform.kube.autoscalers import target as autoscaled_target
from extproc.platform.kube.idle import probe_idle

# a kubebuilder operator's binary is "manager": the API server records LLMKube's writes so
LLMKUBE_AGENT = "manager/v0.11.0 (linux/amd64) llmkube-devstack"

log = logging.getLogger("devstack.reconciler")

POOLS = "modelpools"
MODELS = "models"
HPA_GROUP, HPA_VERSION = "autoscaling", "v2"  # LLMKube refuses a member an HPA targets
USER = "llmkube-controller"
REQUEUE = 3.0  # LLMKube's requeue while a swap waits for pods it does not watch
IDLE_TIMEOUT = 5.0
START_TIMEOUT = 30.0
SCALED_OUTSIDE = "MemberScaledOutside"  # the Warning Event's reason (#2356)
PROBE_PORT = 8080  # LLMKube's member Service port when the spec names none
RECLAIM_AFTER = 300.0  # spec.reclaimAfter's CRD default
PoolKey = tuple[str, str]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _version(obj: dict[str, Any]) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except ValueError:
        return 0


def _remember(cache: dict[PoolKey, dict[str, Any]], key: PoolKey, obj: dict[str, Any]) -> bool:
    """Cache the object unless the cache already holds a newer version; True when cached.

    A pass caches what its own writes returned: the next pass, woken by a member's event before
    the pool's watch caught up, must not decide from a status without its own pendingMember
    (it would take the resident for the owner again and undo the swap). LLMKube's informer
    cache does lag its own writes, which is how it sometimes loses an activation; here that
    happens only when asked for (devstack.reconciler_fault), so ordinary runs are repeatable.
    """
    held = cache.get(key)
    if held is not None and _version(held) > _version(obj):
        return False  # an event older than our own write's answer
    cache[key] = obj
    return True


class ModelPoolReconciler:
    """Owns the member replicas and status of every ModelPool in its namespaces, as LLMKube does."""

    def __init__(self, api: ApiSource,
                 namespaces: Iterable[str] | str, *, requeue: float = REQUEUE,
                 idle_timeout: float = IDLE_TIMEOUT, probe_proxy: str | None = None,
                 lose_activations: int = 0) -> None:
        self._api_arg = api
        self.namespaces = [namespaces] if isinstance(namespaces, str) else list(namespaces)
        self.requeue, self.idle_timeout = requeue, idle_timeout
        self.probe_proxy = probe_proxy
        self.faults = LostActivations(lose_activations)
        self.pools: dict[PoolKey, dict[str, Any]] = {}
        self.isvcs: dict[PoolKey, dict[str, Any]] = {}
        self.models: dict[PoolKey, dict[str, Any]] = {}
        self.hpas: dict[PoolKey, dict[str, Any]] = {}  # HorizontalPodAutoscalers
        self.passes = 0  # reconcile passes run, all pools (tests wait on it)
        # reclaim-down: per pool, the resident and since when every probe of it said idle
        self._idle_since: dict[PoolKey, tuple[str, float]] = {}
        self._synced = False  # no pass before every cache has listed once
        self._wake: dict[PoolKey, asyncio.Event] = {}
        self._workers: dict[PoolKey, asyncio.Task] = {}
        self._watchers: list[asyncio.Task] = []
        self._reports: set[asyncio.Task] = set()  # Events being recorded
        self._api: client.ApiClient | None = None
        self._kube: Kube | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Connect, list pools, members and Models in every namespace, then reconcile on changes."""
        self._api = await connect(self._api_arg, user_agent=LLMKUBE_AGENT)
        self._kube = kube = Kube(self._api)
        self._session = aiohttp.ClientSession(proxy=self.probe_proxy)
        listed: list[asyncio.Event] = []
        for ns in self.namespaces:
            for group, plural, cache in ((GROUP, POOLS, self.pools), (GROUP, PLURAL, self.isvcs),
                                         (GROUP, MODELS, self.models),
                                         (HPA_GROUP, HPAS, self.hpas)):
                done = asyncio.Event()
                listed.append(done)
                self._watchers.append(asyncio.create_task(watch_forever(
                    kube, kube.custom.list_namespaced_custom_object,
                    (group, HPA_VERSION if group == HPA_GROUP else VERSION, ns, plural),
                    f"{ns}/{plural}",
                    lambda items, ns=ns, cache=cache, done=done:
                        self._on_list(ns, cache, items, done),
                    lambda kind, obj, ns=ns, cache=cache: self._on_event(ns, cache, kind, obj))))
        await await_first_lists(listed, START_TIMEOUT, self.stop)
        self._synced = True
        for ns in self.namespaces:
            self._wake_namespace(ns)

    async def stop(self) -> None:
        """Stop watching and reconciling; the API state is left as it is."""
        tasks = [*self._watchers, *self._workers.values(), *self._reports]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watchers.clear()
        self._workers.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
        await disconnect(self._api, self._api_arg)
        self._api = None

    # -- watch callbacks: update the caches and wake the pools concerned --------------------

    def _on_list(self, ns: str, cache: dict[PoolKey, dict[str, Any]],
                 items: list[dict[str, Any]], done: asyncio.Event) -> None:
        for key in [k for k in cache if k[0] == ns]:
            del cache[key]
        for item in items:
            cache[(ns, item["metadata"]["name"])] = item
        if cache is not self.models:  # Models are read from the cache, not watched for passes
            self._wake_namespace(ns)
        done.set()

    def _on_event(self, ns: str, cache: dict[PoolKey, dict[str, Any]], kind: str,
                  obj: dict[str, Any]) -> None:
        key = (ns, obj["metadata"]["name"])
        before = cache.get(key)
        if kind == "DELETED":
            cache.pop(key, None)
        elif not _remember(cache, key, obj):
            return
        if cache is self.models:
            return
        if cache is self.pools:
            self._wake_pool(key)
        elif cache is self.hpas:
            self._wake_namespace(ns)  # (its target may be any pool's member)
        else:
            outsider = scaled_up_outside(before, obj) if kind == "MODIFIED" else ""
            for pool_key, pool in self.pools.items():
                if pool_key[0] == ns and key[1] in member_names(pool):
                    if outsider:
                        self._report(pool, scaled_up_message(
                            key[1], desired_replicas(obj), outsider))
                    self._wake_pool(pool_key)

    def _report(self, pool: dict[str, Any], message: str) -> None:
        """Record a MemberScaledOutside Warning Event on ``pool`` in the background."""
        task = asyncio.get_running_loop().create_task(self._record(pool, message))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _record(self, pool: dict[str, Any], message: str) -> None:
        assert self._kube is not None
        meta, now = pool["metadata"], _now()
        log.warning("pool %s/%s: %s", meta["namespace"], meta["name"], message)
        body = {"metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}",
                             "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelPool",
                                   "name": meta["name"], "namespace": meta["namespace"],
                                   "uid": meta.get("uid", "")},
                "reason": SCALED_OUTSIDE, "message": message, "type": "Warning",
                "firstTimestamp": now, "lastTimestamp": now, "count": 1,
                "source": {"component": "modelpool-controller"}}
        try:
            await self._kube.core.create_namespaced_event(meta["namespace"], body)
        except (ApiException, *TRANSIENT) as exc:
            log.warning("pool %s/%s: event not recorded: %r", meta["namespace"], meta["name"],
                        exc)

    def _wake_namespace(self, ns: str) -> None:
        for key in [k for k in self.pools if k[0] == ns]:
            self._wake_pool(key)

    def _wake_pool(self, key: PoolKey) -> None:
        if not self._synced:
            return  # start() wakes every pool once all caches have listed
        if key not in self._workers:
            self._wake[key] = asyncio.Event()
            self._workers[key] = asyncio.create_task(self._run(key),
                                                     name=f"mpool-{key[0]}-{key[1]}")
        self._wake[key].set()

    # -- one worker per pool: passes never overlap, as controller-runtime runs one per key ---

    async def _run(self, key: PoolKey) -> None:
        wake, backoff = self._wake[key], Backoff()
        timeout: float | None = None
        while True:
            await wait_event(wake, timeout)  # a timeout is the requeue: pods are not watched
            wake.clear()
            if key not in self.pools:
                timeout = None
                continue
            try:
                again = await self.reconcile(key)
                backoff.reset()
                timeout = self.requeue if again else None
            except (ApiException, *TRANSIENT) as exc:
                log.warning("pool %s/%s: pass failed: %r", *key, exc)
                await backoff.sleep()
                wake.set()

    async def reconcile(self, key: PoolKey) -> bool:
        """One pass over one pool; True when it should be looked at again after `requeue`."""
        assert self._kube is not None
        ns, name = key
        autoscaled = {m: a for m in member_names(self.pools[key])
                      if (a := self._autoscaler(ns, m))}
        members = {m: self.isvcs.get((ns, m)) for m in member_names(self.pools[key])
                   if m not in autoscaled}
        read = self.faults.decide_from(key, self.pools[key], members)
        models = {n: obj for (model_ns, n), obj in self.models.items() if model_ns == ns}
        view = PoolView(read, members, await self._pod_counts(ns), models, autoscaled)
        timing = await self._time_idle(key, view)
        view = dataclasses.replace(view, released=timing == math.inf)
        owner, now = resolve_owner(view), _now()
        scaled: dict[str, int] = {}
        owner_isvc = members.get(owner) if owner else None
        if owner is not None and owner != view.status.get("residentMember") \
                and desired_replicas(owner_isvc) >= 1 \
                and plan(view, {}, now).replicas.get(owner) == 0:
            # An early trigger is held at 0 before anything slow (the idle probe), so the
            # member's controller gets no time to start a pod beside the incumbent's. LLMKube
            # itself probes first and holds after: behind an incumbent whose /slots hangs, the
            # target sits at 1 for up to the probe's 5 s. Not reproduced here (no test needs it).
            scaled[owner] = await self._scale(ns, name, owner, 0)
        idle = {m: await self._probe(ns, members[m]) for m in needs_idle_check(view, owner, now)}
        decided = plan(view, idle, now)
        for member, replicas in decided.replicas.items():
            if scaled.get(member) != replicas:
                await self._scale(ns, name, member, replicas)
        patch = status_patch(view.status, decided.status)
        if patch:
            if decided.deferred:
                log.info("pool %s/%s: swap to %s deferred (%s)", ns, name, decided.owner,
                         decided.deferred)
            written = await self._kube.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, ns, POOLS, name, {"status": patch}, _content_type=MERGE_PATCH)
            _remember(self.pools, key, written)
        self.faults.after_pass(key, read, decided.status)
        self.passes += 1
        return decided.requeue or timing > 0

    async def _time_idle(self, key: PoolKey, view: PoolView) -> float:
        """reclaim-down: probe the resident; how long it has been idle (0: not timed, inf:
        for spec.reclaimAfter, so it is released). Busy or unknown restarts the clock."""
        resident = reclaims_down(view)
        if not resident:
            self._idle_since.pop(key, None)
            return 0.0
        now, since = time.monotonic(), self._idle_since.get(key)
        if await self._probe(key[0], view.members[resident]) is not True:
            self._idle_since[key] = (resident, math.inf)
            return 1.0  # timed, not idle: look again after requeue
        if since is None or since[0] != resident or since[1] == math.inf:
            self._idle_since[key] = since = (resident, now)
        try:
            after = parse_duration(str((view.pool.get("spec") or {}).get("reclaimAfter")
                                       or "300s"))
        except ValueError:
            after = RECLAIM_AFTER
        idle = now - since[1]
        if idle < after:
            return max(idle, 1e-9)
        log.info("pool %s/%s: reclaim-down releases %s, idle for %.0fs", *key, resident, idle)
        self._idle_since.pop(key, None)
        return math.inf

    def _autoscaler(self, ns: str, member: str) -> str:
        """The HPA aimed at ``member`` ("HorizontalPodAutoscaler/name"; "" : none)."""
        found = sorted(name for (hpa_ns, name), hpa in self.hpas.items()
                       if hpa_ns == ns and autoscaled_target(hpa) == member)
        return f"HorizontalPodAutoscaler/{found[0]}" if found else ""

    async def _probe(self, ns: str, isvc: dict[str, Any] | None) -> bool | None:
        """The member's /slots, where LLMKube dials it: its Service's cluster DNS name."""
        assert self._session is not None
        return await probe_idle(self._session, probe_url(ns, isvc), self.idle_timeout)

    async def _pod_counts(self, ns: str) -> dict[str, int]:
        """Pods per member in the namespace, terminating ones included (one list call).

        A pod counts for a member only when both its labels name it, as LLMKube selects them.
        """
        assert self._kube is not None
        listing = await self._kube.core.list_namespaced_pod(ns, label_selector=SERVICE_LABEL)
        counts: dict[str, int] = {}
        for pod in listing.items:
            labels = pod.metadata.labels or {}
            member = labels.get(SERVICE_LABEL)
            if member and labels.get("app") == member:
                counts[member] = counts.get(member, 0) + 1
        return counts

    async def _scale(self, ns: str, pool: str, member: str, replicas: int) -> int:
        """Merge-patch a member's spec.replicas, without a resourceVersion, as LLMKube does."""
        assert self._kube is not None
        log.info("pool %s/%s: scale %s to %d", ns, pool, member, replicas)
        scaled = await self._kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, member, {"spec": {"replicas": replicas}},
            _content_type=MERGE_PATCH)
        _remember(self.isvcs, (ns, member), scaled)
        return replicas


def probe_url(ns: str, isvc: dict[str, Any] | None) -> str:
    """``http://<isvc>.<ns>.svc.cluster.local:<port>/slots``, the port as LLMKube picks it."""
    spec = (isvc or {}).get("spec") or {}
    port = ((spec.get("endpoint") or {}).get("port") or 0) or spec.get("containerPort") \
        or PROBE_PORT
    host = str(((isvc or {}).get("metadata") or {}).get("name", "")).replace(".", "-")
    return f"http://{host}.{ns}.svc.cluster.local:{port}/slots"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of ``python -m devstack.reconciler``."""
    parser = controller_parser("python -m devstack.reconciler",
                               "Play LLMKube's ModelPool reconciler.")
    parser.add_argument("--requeue", type=duration_arg, default=REQUEUE,
                        help="look again this often mid-swap (default 3s)")
    parser.add_argument("--idle-timeout", type=duration_arg, default=IDLE_TIMEOUT,
                        help="the /slots probe's timeout (default 5s)")
    parser.add_argument("--probe-proxy", default=None, metavar="URL",
                        help="send idle probes through this HTTP proxy (on loopback: "
                             "devstack.proberouter, standing in for cluster DNS)")
    parser.add_argument("--lose-activations", type=int, default=0, metavar="N",
                        help="fault: lose the first N activations of every pool, as LLMKube's "
                             "reconciler sometimes does (see devstack.reconciler_fault)")
    return parse_controller_args(parser, argv)


def main(argv: list[str] | None = None) -> None:
    """Run the reconciler until SIGINT or SIGTERM."""
    args = parse_args(argv)
    reconciler = ModelPoolReconciler(args.kubeconfig, args.namespaces, requeue=args.requeue,
                                     idle_timeout=args.idle_timeout,
                                     probe_proxy=args.probe_proxy,
                                     lose_activations=args.lose_activations)
    run_controller(reconciler, lambda: f"reconciler running: namespaces={reconciler.namespaces} "
                   f"requeue={reconciler.requeue}s")


if __name__ == "__main__":
    main()
