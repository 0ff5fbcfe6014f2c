"""The invariant checker for the fault suite and the soak.

Sources, all outside the ext_proc under test:

- the API server's own history: an `ApiRecorder` watches InferenceServices and Pods on the
  emulator for the whole test (resuming by resourceVersion across outages, re-listing after
  410), so it holds every committed write in the emulator's single global version order;
- Envoy's access log (which cluster each request went to, and how it ended);
- what each client saw (`Outcome`), and the ext_proc's own gauges and /proc counters.

The invariants, one function each, each returning a list of human-readable violations (empty
means kept), so a test can assert ``== []`` and print every breach at once:

- `exclusive_slot`: a member is never scaled up while another member of its pool still has a
  pod (a terminating pod holds the GPU) or still asks for replicas (its controller may start
  a new pod at any moment), and two members of a pool never have pods at once;
- `upstream_failures`: no request was sent to a member that could not serve it (Envoy's
  connection-failure/reset flags on a member cluster), outside windows a test caused on purpose;
- `misroutes`: every client got its own member's answer or an explicit JSON error;
- `resource_growth`: the ext_proc's memory, descriptors and threads did not grow across a run.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

import aiohttp

SERVICE_LABEL = "inference.llmkube.dev/service"
ISVC_PATH = "/apis/inference.llmkube.dev/v1alpha1/inferenceservices"
POD_PATH = "/api/v1/pods"
# Envoy response flags meaning the member could not take or finish the request.
UPSTREAM_FAILURE_FLAGS = {"UF", "UH", "URX", "UC", "UR", "UO", "NR", "UMSDR"}


@dataclass(frozen=True)
class ApiEvent:
    """One committed change as the recorder saw it."""

    rv: int
    kind: str  # "isvc" or "pod"
    type: str  # ADDED, MODIFIED, DELETED
    namespace: str
    name: str
    member: str  # the isvc itself, or the pod's member label
    replicas: int | None = None  # isvc spec.replicas (absent counts as 1, as LLMKube does)


def _event(kind: str, etype: str, obj: dict[str, Any]) -> ApiEvent:
    meta = obj.get("metadata") or {}
    if kind == "isvc":
        replicas = (obj.get("spec") or {}).get("replicas", 1)
        member = meta["name"]
    else:
        replicas, member = None, (meta.get("labels") or {}).get(SERVICE_LABEL, "")
    return ApiEvent(int(meta.get("resourceVersion") or 0), kind, etype,
                    meta.get("namespace", ""), meta["name"], member, replicas)


class ApiRecorder:
    """Watches InferenceServices and Pods on the emulator until stopped; keeps every event."""

    def __init__(self, kubeapi_url: str, user: str = "invariants") -> None:
        self.url = kubeapi_url
        # Its own bearer token keeps its calls apart from the ext_proc's in the request record.
        self._headers = {"Authorization": f"Bearer {user}-token"}
        self.events: list[ApiEvent] = []
        self.relists = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._ready: list[asyncio.Event] = []
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> ApiRecorder:
        """List both resources and start watching; returns once both lists are in."""
        self._session = aiohttp.ClientSession(headers=self._headers)
        for kind, path in (("isvc", ISVC_PATH), ("pod", POD_PATH)):
            ready = asyncio.Event()
            self._ready.append(ready)
            self._tasks.append(asyncio.create_task(self._follow(kind, path, ready)))
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in self._ready)), 30)
        return self

    async def stop(self) -> list[ApiEvent]:
        """Stop watching; returns every event in resourceVersion order."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        return self.ordered()

    def ordered(self) -> list[ApiEvent]:
        """Events so far, in the API server's global version order."""
        return sorted(self.events, key=lambda e: e.rv)

    async def _follow(self, kind: str, path: str, ready: asyncio.Event) -> None:
        known: dict[tuple[str, str], dict[str, Any]] = {}
        rv: int | None = None
        delay = 0.1
        while True:
            try:
                if rv is None:
                    rv = await self._relist(kind, path, known)
                    ready.set()
                rv = await self._watch(kind, path, rv, known)
                delay = 0.1
            except _Gone:
                rv = None
                self.relists += 1
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                # The emulator is down or unavailable (an injected outage): retry, bounded pace.
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _relist(self, kind: str, path: str, known: dict) -> int:
        assert self._session is not None
        async with self._session.get(self.url + path) as resp:
            if resp.status != 200:
                raise ValueError(f"list {path}: {resp.status}")
            listing = await resp.json()
        rv = int(listing["metadata"]["resourceVersion"])
        seen = {}
        for obj in listing["items"]:
            key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            seen[key] = obj
            if known.get(key, {}).get("metadata", {}).get("resourceVersion") != \
                    obj["metadata"]["resourceVersion"]:
                self.events.append(_event(kind, "MODIFIED" if key in known else "ADDED", obj))
        for key in set(known) - set(seen):
            # Deleted while we could not watch: place the deletion at the list's version.
            gone = known[key]
            gone = {**gone, "metadata": {**gone["metadata"], "resourceVersion": str(rv)}}
            self.events.append(_event(kind, "DELETED", gone))
        known.clear()
        known.update(seen)
        return rv

    async def _watch(self, kind: str, path: str, rv: int, known: dict) -> int:
        assert self._session is not None
        params = {"watch": "true", "resourceVersion": str(rv), "allowWatchBookmarks": "true",
                  "timeoutSeconds": "30"}
        async with self._session.get(self.url + path, params=params,
                                     timeout=aiohttp.ClientTimeout(total=None,
                                                                   sock_read=40)) as resp:
            if resp.status == 410:
                raise _Gone()
            if resp.status != 200:
                raise ValueError(f"watch {path}: {resp.status}")
            async for line in resp.content:
                if not line.strip():
                    continue
                entry = json.loads(line)
                obj = entry["object"]
                if entry["type"] == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise ValueError(f"watch {path}: {obj}")
                rv = int(obj["metadata"]["resourceVersion"])
                if entry["type"] == "BOOKMARK":
                    continue
                key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
                if entry["type"] == "DELETED":
                    known.pop(key, None)
                else:
                    known[key] = obj
                self.events.append(_event(kind, entry["type"], obj))
        return rv


class _Gone(Exception):
    """The watch's resourceVersion was compacted away (410): re-list."""


# ---- invariants ---------------------------------------------------------------------------


def exclusive_slot(events: Iterable[ApiEvent],
                   pools: dict[tuple[str, str], list[str]]) -> list[str]:
    """Replay the API history: no scale-up of a member while another member of its pool has
    pods or replicas, and never pods of two members of one pool at once. ``pools`` maps
    (namespace, pool) to member names."""
    pool_of = {(ns, m): (ns, p) for (ns, p), members in pools.items() for m in members}
    pods: dict[tuple[str, str], set[str]] = {}
    replicas: dict[tuple[str, str], int] = {}
    violations: list[str] = []

    def others_with_pods(ns: str, member: str) -> list[str]:
        key = pool_of[(ns, member)]
        return sorted(f"{m} ({', '.join(sorted(pods[(ns, m)]))})"
                      for m in pools[key] if m != member and pods.get((ns, m)))

    for e in events:
        key = (e.namespace, e.member)
        if key not in pool_of:
            continue
        if e.kind == "isvc":
            before = replicas.get(key, 0)
            now = 0 if e.type == "DELETED" else (e.replicas or 0)
            replicas[key] = now
            busy = others_with_pods(*key)
            # Unload before load: another member still asking for replicas can get a new pod
            # at any moment (its controller replaces a lost one), so it counts as up too.
            wanted = sorted(m for m in pools[pool_of[key]]
                            if m != e.member and replicas.get((e.namespace, m), 0) > 0)
            if before == 0 and now > 0 and (busy or wanted):
                violations.append(f"rv {e.rv}: {e.namespace}/{e.member} scaled up while "
                                  f"{'; '.join(busy + wanted)} still had pods or replicas")
        elif e.type == "DELETED":
            pods.get(key, set()).discard(e.name)
        else:
            busy = others_with_pods(*key)
            if e.type == "ADDED" and busy:
                violations.append(f"rv {e.rv}: pod {e.name} of {e.namespace}/{e.member} "
                                  f"created while {'; '.join(busy)} still had pods")
            pods.setdefault(key, set()).add(e.name)
    return violations


def upstream_failures(entries: Iterable[dict[str, Any]],
                      excused: dict[str, list[float]] | None = None,
                      margin: float = 2.0) -> list[str]:
    """Access-log entries where Envoy sent a request to a member that could not serve it.

    ``excused`` maps a member cluster to wall-clock times when a test broke it on purpose
    (a pod killed under in-flight requests); entries in flight within ``margin`` s of such a
    time are not counted.
    """
    violations = []
    for e in entries:
        cluster = e.get("upstream_cluster")
        flags = set((e.get("flags") or "-").split(","))
        if not cluster or not flags & UPSTREAM_FAILURE_FLAGS:
            continue
        began = datetime.fromisoformat(e["start_time"].replace("Z", "+00:00")).timestamp()
        ended = began + int(e.get("duration_ms") or 0) / 1000
        if any(began - margin <= t <= ended + margin for t in (excused or {}).get(cluster, ())):
            continue
        violations.append(f"{e.get('start_time')} {e.get('path')} -> {cluster}: "
                          f"{e.get('status')} {e.get('flags')} {e.get('details')}")
    return violations


@dataclass
class Outcome:
    """What one client saw."""

    model: str
    status: int = 0  # 0: no HTTP answer (the client hung up, or the connection broke)
    served_by: str = ""
    code: str = ""  # error.code of a JSON error answer
    body_member: str = ""  # the member the answer's text names ("[member] ..."), if any
    gave_up: bool = False  # the client itself disconnected on purpose
    error: str = ""  # client-side exception, if any


def misroutes(outcomes: Iterable[Outcome], allow_broken: bool = False) -> list[str]:
    """Answers that are neither the requested member's nor an explicit JSON error.

    ``allow_broken`` accepts a connection cut without an answer (Envoy restarted under it).
    """
    violations = []
    for o in outcomes:
        if o.gave_up:
            continue
        if o.status == 200:
            if o.served_by != o.model or (o.body_member and o.body_member != o.model):
                violations.append(f"{o.model}: served by {o.served_by or '?'} "
                                  f"(text names {o.body_member or '?'})")
        elif o.status == 0:
            if not allow_broken:
                violations.append(f"{o.model}: no answer ({o.error})")
        elif not o.code:
            violations.append(f"{o.model}: {o.status} without an OpenAI-style error body")
    return violations


@dataclass(frozen=True)
class ProcessSample:
    """Resource counters of one process from /proc."""

    rss_kib: int
    fds: int
    threads: int


def sample_process(pid: int) -> ProcessSample:
    """Read RSS, open descriptors and threads of ``pid``."""
    status = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return ProcessSample(int(status["VmRSS"].split()[0]), len(os.listdir(f"/proc/{pid}/fd")),
                         int(status["Threads"]))


def resource_growth(before: ProcessSample, after: ProcessSample, *, rss_mib: float = 64,
                    fds: int = 16, threads: int = 4) -> list[str]:
    """Growth beyond the allowances (first-use caches and pools are expected to settle)."""
    violations = []
    if after.rss_kib - before.rss_kib > rss_mib * 1024:
        violations.append(f"RSS grew {before.rss_kib} -> {after.rss_kib} KiB")
    if after.fds - before.fds > fds:
        violations.append(f"open descriptors grew {before.fds} -> {after.fds}")
    if after.threads - before.threads > threads:
        violations.append(f"threads grew {before.threads} -> {after.threads}")
    return violations


def find_pid(listen: str) -> int:
    """The process whose command line has ``--listen <listen>`` (the stack's ext_proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"extproc" in args and listen.encode() in args:
            return int(entry.name)
    raise LookupError(f"no ext_proc listening on {listen}")

