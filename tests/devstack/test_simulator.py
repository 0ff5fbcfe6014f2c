"""The member simulator against the Kubernetes emulator, over HTTP with the real client."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Awaitable

import aiohttp
import pytest

from devstack.procs import PROJECT_ROOT, free_port
from devstack.simulator import MemberSimulator
from devstack.simulator_timeline import read_timeline
from devstack_cluster import LOAD, NS, UNLOAD, Cluster, eventually, health


def events(sim: MemberSimulator, member: str) -> list[str]:
    return [e.event for e in sim.timeline.of(member)]


def first(sim: MemberSimulator, member: str, event: str, pod: str | None = None) -> float:
    return next(e.t for e in sim.timeline.of(member, event) if pod in (None, e.pod))


async def _is(value: Awaitable[Any], expected: Any) -> bool:
    return (await value) == expected


async def _has(sim: MemberSimulator, member: str, event: str) -> bool:
    return bool(sim.timeline.of(member, event))


async def _phase_in(cluster: Cluster, name: str, phases: set[str]) -> bool:
    return (await cluster.status(name)).get("phase") in phases


async def _ready_count(cluster: Cluster, sim: MemberSimulator, member: str, count: int) -> bool:
    status = await cluster.status(member)
    return status.get("phase") == "Ready" and len(sim.timeline.of(member, "ready")) == count



def _count(cluster: Cluster, verb: str, resource: str) -> int:
    return sum(1 for r in cluster.emu.requests if r.verb == verb and r.resource == resource)


async def _kubectl(cluster: Cluster, *args: str) -> None:
    """Run kubectl against the emulator (the annotations must work from the command line)."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl is not on PATH")
    proc = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", str(cluster.kubeconfig), "-n", NS, *args,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, out.decode()


async def test_scale_up_creates_pod_then_ready_with_a_live_upstream(cluster: Cluster, sims):
    port = free_port()
    await cluster.create("judge", replicas=0)
    sim = await sims({"judge": port})
    await cluster.wait_phase("judge", "Stopped")
    assert await cluster.pods("judge") == []

    began = time.monotonic()
    await cluster.scale("judge", 1)
    status = await cluster.wait_phase("judge", "Creating")
    assert status["readyReplicas"] == 0
    (pod,) = await cluster.pods("judge")
    assert pod.metadata.name.startswith("judge-") and len(pod.metadata.name) == len("judge-") + 5
    assert pod.metadata.labels == {"app": "judge", "inference.llmkube.dev/service": "judge"}

    status = await cluster.wait_phase("judge", "Ready")
    assert time.monotonic() - began >= LOAD
    assert status == {"phase": "Ready", "replicas": 1, "readyReplicas": 1,
                      "endpoint": f"http://127.0.0.1:{port}"}
    assert await health(port) == 200
    (pod,) = await cluster.pods("judge")
    assert pod.status.phase == "Running"
    assert events(sim, "judge") == ["stopped", "pod_created", "server_started", "ready"]
    assert sim.timeline.of("judge", "ready")[0].t - first(sim, "judge", "pod_created") >= LOAD


async def test_a_load_hands_the_member_to_its_standby_and_starts_the_next(cluster: Cluster,
                                                                          sims):
    await cluster.create("judge", replicas=0)
    sim = await sims({"judge": free_port()})
    await cluster.wait_phase("judge", "Stopped")
    actor = sim.actors[(NS, "judge")]
    standby = actor.standby.pid  # started with the member, before any load
    await cluster.scale("judge", 1)
    await cluster.wait_phase("judge", "Ready")
    assert actor.server.process.pid == standby  # the load used it: no process start on the way
    assert actor.standby.running and actor.standby.pid != standby  # the next one waits


async def test_scale_down_unloads_before_the_pod_goes(cluster: Cluster, sims, tmp_path: Path):
    port = free_port()
    await cluster.create("coder", replicas=1)
    sim = await sims({"coder": port})
    await cluster.wait_phase("coder", "Ready")
    server = sim.actors[(NS, "coder")].server
    assert server is not None and server.process.running

    await cluster.scale("coder", 0)
    await cluster.wait_phase("coder", "Progressing")
    (pod,) = await eventually(lambda: cluster.pods("coder"), what="the terminating pod")
    assert pod.metadata.deletion_timestamp is not None  # still there, but going
    await eventually(lambda: _is(health(port), None), what="the upstream to stop")
    assert await cluster.pods("coder")  # the server went first; the pod is still unloading

    status = await cluster.wait_phase("coder", "Stopped")
    assert status["replicas"] == 0 and status["readyReplicas"] == 0
    assert await cluster.pods("coder") == []
    assert not server.process.running
    assert events(sim, "coder") == ["pod_created", "server_started", "ready", "pod_terminating",
                                    "server_stopped", "pod_deleted", "stopped"]
    assert first(sim, "coder", "pod_deleted") - first(sim, "coder", "pod_terminating") >= UNLOAD
    # the file has the same record, for tests in other processes
    on_disk = read_timeline(tmp_path / "timeline.jsonl")
    assert [e["event"] for e in on_disk if e["member"] == "coder"] == events(sim, "coder")


async def test_fail_annotation_ends_in_failed_and_clearing_it_retries(cluster: Cluster, sims):
    port = free_port()
    await cluster.create("writer", replicas=0, **{"sim.llmkube.dev/fail": "true"})
    sim = await sims({"writer": port})
    await cluster.wait_phase("writer", "Stopped")
    await cluster.scale("writer", 1)
    await cluster.wait_phase("writer", "Failed")
    assert await health(port) is None
    assert len(await cluster.pods("writer")) == 1
    await asyncio.sleep(2 * LOAD)  # stays failed: no retry loop while the annotation holds
    assert (await cluster.status("writer"))["phase"] == "Failed"
    assert events(sim, "writer").count("failed") == 1

    await cluster.annotate("writer", "sim.llmkube.dev/fail", None)
    await cluster.wait_phase("writer", "Ready")
    assert await health(port) == 200


async def test_kill_pod_replaces_the_pod_and_loads_again(cluster: Cluster, sims):
    port = free_port()
    await cluster.create("judge", replicas=1, **{"sim.llmkube.dev/kill-pod": "0"})
    sim = await sims({"judge": port})
    await cluster.wait_phase("judge", "Ready")
    (old,) = await cluster.pods("judge")
    old_pid = sim.actors[(NS, "judge")].server.process.pid

    await _kubectl(cluster, "annotate", "isvc", "judge", "sim.llmkube.dev/kill-pod=1",
                   "--overwrite")
    await eventually(lambda: _phase_in(cluster, "judge", {"Progressing", "Creating"}),
                     what="judge to leave Ready")

    async def replaced() -> Any:
        pods = await cluster.pods("judge")
        return [p for p in pods if p.metadata.name != old.metadata.name]
    (new,) = await eventually(replaced, what="a replacement pod")
    await cluster.wait_phase("judge", "Ready")
    assert old.metadata.name not in [p.metadata.name for p in await cluster.pods("judge")]
    assert sim.actors[(NS, "judge")].server.process.pid != old_pid
    assert await health(port) == 200
    assert first(sim, "judge", "pod_deleted", old.metadata.name) \
        < first(sim, "judge", "pod_created", new.metadata.name)
    assert events(sim, "judge").count("pod_killed") == 1


async def test_stuck_stays_creating_until_cleared(cluster: Cluster, sims):
    port = free_port()
    await cluster.create("coder", replicas=0, **{"sim.llmkube.dev/stuck": "true"})
    await sims({"coder": port})
    await cluster.scale("coder", 1)
    await cluster.wait_phase("coder", "Creating")
    await asyncio.sleep(4 * LOAD)
    assert (await cluster.status("coder"))["phase"] == "Creating"
    # its server is bound since the pod's start and answers 503 while "loading", as
    # llama-server does (nothing yet if its standby is still importing on a busy machine)
    assert await health(port) in (None, 503)

    await cluster.annotate("coder", "sim.llmkube.dev/stuck", "false")
    await cluster.wait_phase("coder", "Ready")


def _children_of(pid: int) -> set[int]:
    """The live child processes of ``pid`` (every thread's)."""
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        found |= {int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()}
    return found


async def test_in_process_members_serve_from_the_simulator_and_start_no_process(
        cluster: Cluster, sims):
    port = free_port()
    await cluster.create("coder", replicas=0, **{"sim.llmkube.dev/stuck": "true"})
    before = _children_of(os.getpid())
    sim = await sims({"coder": port}, runtime="fake-in-process")
    await cluster.scale("coder", 1)
    await cluster.wait_phase("coder", "Creating")
    # bound since the pod's start, 503 while "loading", as the process's server does
    await eventually(lambda: _is(health(port), 503), what="coder bound and loading")
    await cluster.annotate("coder", "sim.llmkube.dev/stuck", "false")
    await cluster.wait_phase("coder", "Ready")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                json={"model": "coder", "messages": [
                                    {"role": "user", "content": "hi"}]}) as resp:
            assert resp.status == 200 and resp.headers["x-served-by"] == "coder"
    assert _children_of(os.getpid()) <= before  # no server nor standby process of its own
    assert sim.actors[(NS, "coder")].standby is None

    await cluster.scale("coder", 0)
    await cluster.wait_phase("coder", "Stopped")
    assert await health(port) is None  # its listener closed with the unload
    assert events(sim, "coder") == ["stopped", "pod_created", "server_started", "ready",
                                    "pod_terminating", "server_stopped", "pod_deleted", "stopped"]


async def test_quick_flip_finishes_the_unload_before_the_new_pod(cluster: Cluster, sims):
    await cluster.create("judge", replicas=1)
    sim = await sims()
    await cluster.wait_phase("judge", "Ready")
    await cluster.scale("judge", 0)
    # Back to 1 once the unload has begun: the simulator reconciles levels, so a flip it
    # only sees the end of (both writes before its next pass, as under load) is no flip.
    await eventually(lambda: _has(sim, "judge", "pod_terminating"), what="the unload to begin")
    await cluster.scale("judge", 1)
    await eventually(lambda: _ready_count(cluster, sim, "judge", 2), what="judge Ready again")
    pods = [e for e in sim.timeline.of("judge") if e.event in ("pod_created", "pod_deleted")]
    assert [e.event for e in pods] == ["pod_created", "pod_deleted", "pod_created"]
    assert len(await cluster.pods("judge")) == 1
    assert await health(sim.ports["judge"]) == 200  # an unmapped member got a free port


async def test_restart_adopts_existing_state(cluster: Cluster, sims):
    port = free_port()
    await cluster.create("judge", replicas=1)
    await cluster.create("coder", replicas=0)
    first_sim = await sims({"judge": port})
    await cluster.wait_phase("judge", "Ready")
    await cluster.wait_phase("coder", "Stopped")
    (pod,) = await cluster.pods("judge")
    await first_sim.stop()
    assert await health(port) is None  # stop() leaves no upstream behind

    second = await sims({"judge": port}, timeline_path=None)
    await eventually(lambda: _has(second, "judge", "ready"), what="judge re-reported Ready")
    assert await health(port) == 200
    assert (await cluster.status("judge"))["phase"] == "Ready"
    assert [p.metadata.name for p in await cluster.pods("judge")] == [pod.metadata.name]
    assert events(second, "judge") == ["server_started", "adopted", "ready"]
    assert events(second, "coder") == []  # already Stopped: nothing to do


async def test_cli_runs_until_sigterm_and_leaves_nothing(cluster: Cluster, tmp_path: Path):
    port = free_port()
    timeline = tmp_path / "cli-timeline.jsonl"
    await cluster.create("judge", replicas=1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "devstack.simulator", "--kubeconfig", str(cluster.kubeconfig),
         "--namespace", NS, "--port", f"judge={port}", "--load-delay", "200ms",
         "--timeline", str(timeline), "--log-dir", str(tmp_path)],
        cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "cli.log", "wb"))
    try:
        await cluster.wait_phase("judge", "Ready", timeout=20)
        assert await health(port) == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 15)
    assert proc.returncode == 0, (tmp_path / "cli.log").read_text()
    assert await health(port) is None
    assert [e["event"] for e in read_timeline(timeline)] == \
        ["pod_created", "server_started", "ready", "server_stopped"]


async def test_survives_410_an_api_outage_and_failed_writes(cluster: Cluster, sims):
    await cluster.create("judge", replicas=0)
    sim = await sims()
    await cluster.wait_phase("judge", "Stopped")

    lists_before = _count(cluster, "list", "inferenceservices")
    cluster.emu.compact()  # open watches get 410 Gone: the simulator must re-list
    await cluster.scale("judge", 1)
    await cluster.wait_phase("judge", "Ready")
    assert _count(cluster, "list", "inferenceservices") > lists_before

    cluster.emu.set_unavailable(True)
    await asyncio.sleep(0.5)
    cluster.emu.set_unavailable(False)
    cluster.emu.fail_writes("pods", 2)  # deleting the pod fails twice: retried with backoff
    await cluster.scale("judge", 0)
    await cluster.wait_phase("judge", "Stopped")
    assert await cluster.pods("judge") == []
    assert "pod_killed" not in events(sim, "judge")  # failed writes only delay the unload

    # the simulator writes an InferenceService's status only, never its spec
    writes = [r for r in cluster.emu.requests if r.resource == "inferenceservices"
              and r.verb in ("update", "patch") and r.subresource != "status"]
    assert len(writes) == 2  # the test's own two scale patches


async def test_restart_mid_unload_finishes_the_unload(cluster: Cluster, sims):
    await cluster.create("coder", replicas=1, **{"sim.llmkube.dev/unload-delay": "30s"})
    first_sim = await sims(timeline_path=None)
    await cluster.wait_phase("coder", "Ready")
    await cluster.scale("coder", 0)
    await eventually(lambda: _has(first_sim, "coder", "server_stopped"), what="unload under way")
    await first_sim.stop()
    (pod,) = await cluster.pods("coder")
    assert pod.metadata.deletion_timestamp is not None

    await cluster.annotate("coder", "sim.llmkube.dev/unload-delay", "200ms")
    second = await sims(timeline_path=None)
    await cluster.wait_phase("coder", "Stopped")
    assert await cluster.pods("coder") == []
    assert events(second, "coder") == ["pod_deleted", "stopped"]


async def test_kubectl_delete_pod_gets_a_replacement(cluster: Cluster, sims):
    await cluster.create("writer", replicas=1)
    sim = await sims(timeline_path=None)
    await cluster.wait_phase("writer", "Ready")
    (old,) = await cluster.pods("writer")
    await _kubectl(cluster, "delete", "pod", old.metadata.name, "--wait=false")
    await eventually(lambda: _ready_count(cluster, sim, "writer", 2), what="a reloaded writer")
    (new,) = await cluster.pods("writer")
    assert new.metadata.name != old.metadata.name
    assert await health(sim.ports["writer"]) == 200


async def test_a_crashed_upstream_is_restarted_in_the_same_pod(cluster: Cluster, sims):
    await cluster.create("judge", replicas=1)
    sim = await sims(timeline_path=None)
    await cluster.wait_phase("judge", "Ready")
    (pod,) = await cluster.pods("judge")
    os.kill(sim.actors[(NS, "judge")].server.process.pid, signal.SIGKILL)
    await eventually(lambda: _phase_in(cluster, "judge", {"Progressing", "Creating"}),
                     what="judge to leave Ready")
    await eventually(lambda: _ready_count(cluster, sim, "judge", 2), what="judge Ready again")
    assert [p.metadata.name for p in await cluster.pods("judge")] == [pod.metadata.name]
    assert sim.timeline.of("judge", "server_stopped")[0].extra == {"reason": "crashed"}
