"""One simulated member: a level-based reconcile loop that plays LLMKube's controller for it.

Rules of this file: all work for one member runs in that member's single task, so a quick
1→0→1 flip is handled strictly in order (the unload finishes, the pod is gone, then a new pod
is created). Every pass re-reads the member's pods from the API and acts on what it finds, so
a restarted simulator converges from whatever state it is handed. Timed waits (load delay,
stuck) wake on every change and re-check, so run-time annotation edits take effect at once;
a change to the status alone (the echo of its own writes, mostly) wakes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from devstack.simulator_kube import (
    TRANSIENT, Backoff, Kube, is_terminating, parse_duration, wait_event)
from devstack.procs import LOCALHOST, ManagedProcess
from devstack.llamacpp import LlamaRuntime
from devstack.simulator_server import (
    STOP_GRACE, InProcessServer, Loading, MemberServer, UpstreamServer, start_standby)
from devstack.simulator_isvc import (
    ANN_FAIL, ANN_KILL, ANN_LOAD_DELAY, ANN_STUCK, ANN_UNLOAD_DELAY, annotations, desired_replicas,
    flag, kill_requested, needs_pass, uid)
from devstack.simulator_timeline import Timeline
from kubernetes.aio.client.exceptions import ApiException

log = logging.getLogger("devstack.simulator")

CRASH_POLL = 0.5  # seconds between checks that a serving upstream process is still alive


@dataclass
class SimContext:
    """What every member actor shares: API access, the record, defaults, port assignment."""

    kube: Kube
    timeline: Timeline
    default_load_delay: float
    default_unload_delay: float
    port_for: Callable[[str], int]
    log_dir: Path
    # The Deployment and ReplicaSet controllers' hops between spec.replicas 1 and a Pod object:
    # the window in which LLMKube's ModelPool reconciler holds an early trigger at 0.
    rollout_delay: float = 0.0
    # A member's pod address (its podIP): 127.0.0.1, or its own loopback address when the
    # stack runs behind an endpoint picker (pods of one port on distinct addresses).
    host_for: Callable[[str], str] = lambda member: LOCALHOST
    # Real llama.cpp members (devstack/llamacpp.py) instead of the fake upstream; their own
    # load is the load, so the simulated load delay defaults to 0 with them.
    llama: LlamaRuntime | None = None
    # The fake members served from the simulator's own process (no process per pod, no
    # standby): for fleets of members on a few cores (devstack/simulator_server.py)
    in_process: bool = False


class MemberActor:
    """Reconciles one InferenceService: its pod, its status and its fake upstream process."""

    def __init__(self, ctx: SimContext, namespace: str, name: str) -> None:
        self.ctx, self.kube = ctx, ctx.kube
        self.namespace, self.name = namespace, name
        self.isvc: dict[str, Any] | None = None
        self.wake = asyncio.Event()
        self.server: MemberServer | None = None
        self.server_pod: str | None = None  # the pod the running server belongs to
        self.reported: str | None = None  # the last phase this actor wrote
        self.failed_start: str | None = None  # pod whose server would not start: no retry on it
        self.task: asyncio.Task | None = None
        self.standby: ManagedProcess | None = None  # the next server, started ahead
        self.loading: Loading | None = None  # the load under way: its pod, clock and server

    def observe(self, isvc: dict[str, Any] | None) -> None:
        """Take the latest InferenceService (None: deleted) and schedule a pass."""
        if uid(isvc) != uid(self.isvc):
            self.reported = None  # deleted or re-created: what we wrote belonged to the old one
        before, self.isvc = self.isvc, isvc
        if needs_pass(before, isvc):
            self.wake.set()

    def poke(self) -> None:
        """Schedule a pass (a pod of this member changed)."""
        self.wake.set()

    def start(self) -> None:
        """Start the member's task and its standby server process."""
        self._refill()
        self.task = asyncio.create_task(self._run(), name=f"sim-{self.namespace}-{self.name}")

    async def stop(self) -> None:
        """Cancel the task and stop the upstream process; the API state is left as it is."""
        if self.task:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self._stop_server()
        await self._drop_loading()
        standby, self.standby = self.standby, None
        if standby is not None:
            await asyncio.to_thread(standby.stop, STOP_GRACE)

    def _refill(self) -> None:
        """Start the member's next server process now, so a load need not wait for it."""
        if self.ctx.llama is not None or self.ctx.in_process:
            return  # llama-server reads its model at start, a server in here starts at once
        if self.standby is None or not self.standby.running:
            self.standby = start_standby(self.name, self.ctx.port_for(self.name),
                                         self.ctx.log_dir, self.ctx.host_for(self.name))

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = Backoff()
        while True:
            # while serving, also look at the process now and then: a crashed server must
            # not stay reported Ready (no API traffic unless it really died)
            woke = await wait_event(self.wake, CRASH_POLL if self.server else None)
            if not woke and self.server and self.server.running:
                continue
            self.wake.clear()
            try:
                await self.reconcile()
                backoff.reset()
            except (ApiException, *TRANSIENT) as exc:
                # level-based: the next pass redoes whatever this one did not finish
                log.warning("member %s/%s: pass failed: %r", self.namespace, self.name, exc)
                self.wake.set()
                await backoff.sleep()

    def _phase(self) -> str | None:
        if self.reported:
            return self.reported
        return ((self.isvc or {}).get("status") or {}).get("phase")

    async def reconcile(self) -> None:
        """One pass: make pods, process and status agree with spec.replicas and annotations."""
        isvc = self.isvc
        if self.server and not self.server.running:
            await self._server_crashed()
        pods = await self.kube.list_pods(self.namespace, self.name)
        live = [p for p in pods if not is_terminating(p)]
        for pod in pods:
            if not is_terminating(pod):
                continue
            if isvc is not None and desired_replicas(isvc) < 1:
                await self._finish_unload(pod)  # our unload, cut short by an API error or restart
            else:
                await self._kill(pod)  # kubectl delete pod: it dies now, as a kubelet would end it
        for pod in live[1:]:  # one pod per member; extras only appear if someone made them
            await self._kill(pod)
        pod = live[0] if live else None
        if self.loading and (pod is None or pod["metadata"]["name"] != self.loading.pod):
            await self._drop_loading()  # its pod went while a pass failed mid-load
        if self.server and (pod is None or pod["metadata"]["name"] != self.server_pod):
            await self._lost_pod()  # the pod vanished out of band with the server still up
        if pod and isvc is not None and kill_requested(isvc, pod):
            await self._kill(pod)
            pod = None
        if isvc is None:
            if pod:
                await self._kill(pod)
            return
        if desired_replicas(isvc) < 1:
            if pod:
                await self._unload(pod)
            await self._report_stopped()
            return
        if pod is None:
            if not await self._sit_out_rollout():
                return
            pod = await self._create_pod()
        await self._ensure_loaded(pod)

    # -- steps -----------------------------------------------------------------------------

    async def _report(self, phase: str, replicas: int, ready: int, **extra: Any) -> None:
        await self.kube.patch_status(self.namespace, self.name,
                                     {"phase": phase, "replicas": replicas,
                                      "readyReplicas": ready, **extra})
        self.reported = phase

    def _record(self, event: str, pod: str | None = None, **extra: Any) -> None:
        self.ctx.timeline.record(self.namespace, self.name, event, pod, **extra)

    def _delay(self, key: str, default: float) -> float:
        text = annotations(self.isvc).get(key)
        if not text:
            return default
        try:
            return parse_duration(text)
        except ValueError:
            log.warning("member %s: bad %s=%r, using %ss", self.name, key, text, default)
            return default

    async def _sit_out_rollout(self) -> bool:
        """Wait the rollout delay; False when the member was scaled down meanwhile (no pod)."""
        deadline = time.monotonic() + self.ctx.rollout_delay
        while (left := deadline - time.monotonic()) > 0:
            if await wait_event(self.wake, left):
                self.wake.clear()
                if desired_replicas(self.isvc) < 1:
                    self.wake.set()  # the next pass handles the scale-down
                    return False
        return True

    async def _create_pod(self) -> dict[str, Any]:
        pod = await self.kube.create_pod(self.namespace, self.name,
                                         annotations(self.isvc).get(ANN_KILL, ""))
        self._record("pod_created", pod["metadata"]["name"])
        # the container starts with the pod: the load runs from here, and the controller's
        # status write below happens while it runs, not before it
        self._begin_load(pod["metadata"]["name"])
        await self._report("Creating", 1, 0)
        return pod

    def _begin_load(self, pod_name: str) -> None:
        """Start the load's clock (and the fake's server, answering 503) for this pod."""
        if self.loading and self.loading.pod == pod_name:
            return  # a pass that failed after the load began: it goes on, its clock kept
        server: MemberServer | None = None
        if self.ctx.llama is None:
            server = self._fake_server()
            server.begin_load()
            self._refill()  # the next standby imports while this load's delay runs
        self.loading = Loading(pod_name, time.monotonic(), server)

    def _fake_server(self) -> MemberServer:
        """The member's next fake server (not started): in here, or its standby process."""
        port, host = self.ctx.port_for(self.name), self.ctx.host_for(self.name)
        if self.ctx.in_process:
            return InProcessServer(self.name, port, self.ctx.log_dir, host)
        standby, self.standby = self.standby, None
        return UpstreamServer(self.name, port, self.ctx.log_dir, standby, host)

    async def _drop_loading(self) -> None:
        """The load ended without a server (aborted, failed): stop what it had started."""
        loading, self.loading = self.loading, None
        if loading and loading.server:
            await loading.server.stop(hard=True)

    async def _ensure_loaded(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        phase = self._phase()
        if self.server:
            if phase != "Ready":
                await self._report_ready()
            return
        if phase == "Failed" and (flag(self.isvc, ANN_FAIL) or self.failed_start == name):
            return  # stays failed until the annotation is cleared or the pod is replaced
        if phase == "Ready":
            # a simulator restart: the pod (and the model in it) survived, only our process
            # did not, so the server comes back without a new load delay
            await self._start_server(name, adopted=True)
            return
        self._begin_load(name)
        if phase != "Creating":
            await self._report("Creating", 1, 0)
        outcome = await self._wait_loaded(pod)
        if outcome == "aborted":
            await self._drop_loading()
            self.wake.set()  # the next pass handles whatever interrupted the load
        elif outcome == "failed":
            await self._drop_loading()
            await self._report("Failed", 1, 0)
            self._record("failed", name)
        else:
            await self._start_server(name, adopted=False)

    async def _wait_loaded(self, pod: dict[str, Any]) -> str:
        """Sit out the load delay: "loaded", "failed" (fail annotation) or "aborted"."""
        assert self.loading is not None
        began = self.loading.began
        while True:
            isvc = self.isvc
            if isvc is None or desired_replicas(isvc) < 1 or kill_requested(isvc, pod):
                return "aborted"
            timeout: float | None = None
            if not flag(isvc, ANN_STUCK):
                timeout = began + self._delay(ANN_LOAD_DELAY, self.ctx.default_load_delay) \
                    - time.monotonic()
                if timeout <= 0:
                    return "failed" if flag(isvc, ANN_FAIL) else "loaded"
            if await wait_event(self.wake, timeout):
                self.wake.clear()
                current = await self.kube.read_pod(self.namespace, pod["metadata"]["name"])
                if current is None or is_terminating(current):
                    return "aborted"

    async def _start_server(self, pod_name: str, adopted: bool) -> None:
        port = self.ctx.port_for(self.name)
        server: MemberServer
        if adopted:
            await self._drop_loading()  # (a load begun by a pass that then failed)
        loading, self.loading = self.loading, None
        if loading is not None and loading.server is not None:
            server = loading.server  # bound at the load's start, answering 503 until now
        elif self.ctx.llama is not None:
            server = self.ctx.llama.server(self.name, port, self.ctx.log_dir,
                                           annotations(self.isvc), self.ctx.host_for(self.name))
        else:
            server = self._fake_server()
        try:
            await server.start()
        except asyncio.CancelledError:
            await server.stop(hard=True)  # simulator stopping mid-start: leave no process behind
            raise
        except Exception as exc:  # a server that cannot start is a failed load, not a crash
            log.warning("member %s: upstream did not start: %r", self.name, exc)
            await server.stop(hard=True)
            self.failed_start = pod_name
            await self._report("Failed", 1, 0)
            self._record("failed", pod_name, reason="upstream did not start")
            return
        self.server, self.server_pod = server, pod_name
        self._record("server_started", pod_name, port=port)
        if adopted:
            self._record("adopted", pod_name)
        await self._report_ready()
        self._refill()  # after Ready: its fork is not part of this load

    async def _report_ready(self) -> None:
        port, host = self.ctx.port_for(self.name), self.ctx.host_for(self.name)
        await self.kube.set_pod_phase(self.namespace, self.server_pod, "Running", ready=True,
                                      ip=host)
        await self._report("Ready", 1, 1, endpoint=f"http://{host}:{port}")
        self._record("ready", self.server_pod)

    async def _stop_server(self, hard: bool = False, **why: str) -> None:
        if self.server is None:
            return
        # cleared only once stopped, so a stop() cancelling this still finds the process
        await self.server.stop(hard)
        pod_name = self.server_pod
        self.server = self.server_pod = None
        self._record("server_stopped", pod_name, **why)

    async def _server_crashed(self) -> None:
        """The process died on its own: like a container restart, the pod stays and reloads."""
        await self._stop_server(hard=True, reason="crashed")  # reaps the dead process
        if self.isvc is not None:
            await self._report("Progressing", 1, 0)

    async def _lost_pod(self) -> None:
        name = self.server_pod
        self._record("pod_killed", name)
        await self._stop_server(hard=True)
        self._record("pod_deleted", name)
        if self.isvc is not None:
            await self._report("Progressing", 0, 0)

    async def _kill(self, pod: dict[str, Any]) -> None:
        """The pod dies at once, without an unload delay (OOM kill, node loss)."""
        name = pod["metadata"]["name"]
        self._record("pod_killed", name)
        if self.server_pod == name:
            await self._stop_server(hard=True)
        if self.loading and self.loading.pod == name:
            await self._drop_loading()
        await self.kube.remove_pod(self.namespace, name)
        self._record("pod_deleted", name)
        if self.isvc is not None:
            await self._report("Progressing", 0, 0)

    async def _unload(self, pod: dict[str, Any]) -> None:
        """Graceful scale-down: the pod stays (terminating) until the model has unloaded."""
        name = pod["metadata"]["name"]
        await self.kube.begin_delete_pod(self.namespace, name)
        self._record("pod_terminating", name)
        # The unload runs from the pod's deletion (its kubelet stops the container then); the
        # controller's Progressing write races it in a cluster, so here it runs inside it.
        began = time.monotonic()
        await self._report("Progressing", 1, 0)
        await self._finish_unload(pod, began)

    async def _finish_unload(self, pod: dict[str, Any], began: float | None = None) -> None:
        """Stop the server, sit out the unload delay (from `began`), then let the pod go."""
        name = pod["metadata"]["name"]
        # a resumed unload (after an error or restart) counts from now: it then errs on the
        # safe side, the pod holding the slot a little longer, never shorter
        began = time.monotonic() if began is None else began
        delay = self._delay(ANN_UNLOAD_DELAY, self.ctx.default_unload_delay)
        await self._stop_server()  # the model goes first; the pod object goes last
        await self._drop_loading()
        await asyncio.sleep(max(0.0, began + delay - time.monotonic()))
        await self.kube.release_pod(self.namespace, name)
        self._record("pod_deleted", name)

    async def _report_stopped(self) -> None:
        if self.reported == "Stopped":
            return
        status = (self.isvc or {}).get("status") or {}
        if status.get("phase") == "Stopped" and not status.get("replicas") \
                and not status.get("readyReplicas"):
            self.reported = "Stopped"  # already true, e.g. after a simulator restart
            return
        await self._report("Stopped", 0, 0)
        self._record("stopped")
