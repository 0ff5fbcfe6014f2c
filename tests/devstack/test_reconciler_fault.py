"""The LLMKube stand-in's lost activation (devstack.reconciler_fault) and its command line.

Both ways of losing an activation that LLMKube's reconciler shows, reproduced on the emulator:
the opt-in stale pass (annotation or constructor flag), and the issue's deterministic steps
with the stand-in running as its own process (pause it, trigger, undo the trigger as an
admin, resume it).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devstack import stack_manifests as manifests
from devstack.proberouter import ProbeRouter
from devstack.procs import PROJECT_ROOT, free_port
from devstack.reconciler import POOLS, USER
from devstack.reconciler_fault import ANNOTATION
from devstack.simulator_kube import GROUP, MERGE_PATCH, VERSION
from devstack_cluster import NS, Cluster, eventually
from reconciler_kit import POOL, SWAP_TIMEOUT, calls, pool_history, replica_history, \
    replicas, resident_is, version_now, warm


async def lost(cluster: Cluster) -> bool:
    """The lost activation's end: Ready on judge, nothing pending, coder at 0, judge at 1."""
    settled = await resident_is(cluster, "judge")
    return bool(settled) and await replicas(cluster, "coder") == 0 \
        and await replicas(cluster, "judge") == 1


@pytest.mark.parametrize("opt_in", ["annotation", "constructor"])
async def test_the_fault_loses_one_activation_as_llmkube_does(cluster: Cluster, llmkube,
                                                             opt_in: str):
    options = {"lose_activations": 1} if opt_in == "constructor" else {}
    stack = await warm(cluster, llmkube, **options)
    if opt_in == "annotation":
        await cluster.custom.patch_namespaced_custom_object(
            GROUP, VERSION, NS, POOLS, POOL, {"metadata": {"annotations": {ANNOTATION: "1"}}},
            _content_type=MERGE_PATCH)
    since = version_now(cluster)

    await cluster.scale("coder", 1)  # the activator's trigger
    await eventually(lambda: _fired(stack.reconciler), SWAP_TIMEOUT, "the stale pass")
    await eventually(lambda: lost(cluster), SWAP_TIMEOUT, "the pool back on judge")

    # the trigger held at 0, the resident unloaded then brought back
    assert await replica_history(cluster, "coder", since) == [1, 0]
    assert await replica_history(cluster, "judge", since) == [0, 1]
    # coder was recorded pending, then the stale write put the resident in its place
    pending = [s.get("pendingMember") for s in await pool_history(cluster, since)]
    assert "coder" in pending and "judge" in pending[pending.index("coder"):], pending
    assert stack.reconciler.faults.fired == 1

    # it fires once: the activator's next trigger swaps as usual
    await cluster.scale("coder", 1)
    await eventually(lambda: resident_is(cluster, "coder"), SWAP_TIMEOUT, "coder resident")
    assert stack.reconciler.faults.fired == 1


async def test_without_opting_in_no_activation_is_lost(cluster: Cluster, llmkube):
    stack = await warm(cluster, llmkube)
    for target in ("coder", "judge", "coder"):
        await cluster.scale(target, 1)
        await eventually(lambda t=target: resident_is(cluster, t), SWAP_TIMEOUT, target)
    assert stack.reconciler.faults.fired == 0


async def _fired(reconciler) -> bool:
    return reconciler.faults.fired > 0


async def test_the_cli_runs_paused_and_resumed_and_stops_on_sigterm(cluster: Cluster, sims,
                                                                     tmp_path: Path):
    for name in ("judge", "coder"):
        await cluster.create(name, replicas=0)
    pool = manifests.pool(POOL, NS, ("judge", "coder"), default="judge")
    await cluster.custom.create_namespaced_custom_object(GROUP, VERSION, NS, POOLS, pool)
    ports = {m: free_port() for m in ("judge", "coder")}
    router = ProbeRouter(free_port(), {f"{NS}/{m}": p for m, p in ports.items()})
    await router.start()
    await sims(ports)
    log_path = tmp_path / "reconciler.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "devstack.reconciler", "--kubeconfig",
             str(cluster.kubeconfig_for(USER)), "--namespace", NS, "--requeue", "300ms",
             "--probe-proxy", router.url], cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL,
            stderr=log_file)
    try:
        await eventually(lambda: resident_is(cluster, "judge"), SWAP_TIMEOUT, "judge warmed")
        since = version_now(cluster)
        # The reproduction: the reconciler paused, a trigger, an admin undoing it.
        proc.send_signal(signal.SIGSTOP)
        await cluster.scale("coder", 1)
        await cluster.scale("coder", 0)
        # paused a while: the emulator (in this process) writes both events to its watch
        # before the reconciler reads any, as they would wait for a paused process
        await asyncio.sleep(0.5)
        resumed_at = len(cluster.emu.requests_of(USER))
        proc.send_signal(signal.SIGCONT)
        # it catches up (a pass lists pods), and the activation is simply gone
        await eventually(lambda: _listed_pods_since(cluster, resumed_at), SWAP_TIMEOUT,
                         "a pass after resuming")
        await asyncio.sleep(1.0)  # three requeues' worth: nothing moves any more
        assert await lost(cluster), (await pool_history(cluster, since),
                                     await replica_history(cluster, "coder", since),
                                     log_path.read_text()[-9000:])
        assert await replica_history(cluster, "judge", since) == []
        assert [s.get("pendingMember") for s in await pool_history(cluster, since)] == []
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 15)
        await router.stop()
    assert proc.returncode == 0, log_path.read_text()
    assert "reconciler running: namespaces=['sim'] requeue=0.3s" in log_path.read_text()
    assert calls(cluster, USER, "patch", POOLS, "status")  # it wrote as its own user


async def _listed_pods_since(cluster: Cluster, index: int) -> bool:
    return any(r.resource == "pods" and r.verb == "list"
               for r in cluster.emu.requests_of(USER)[index:])
