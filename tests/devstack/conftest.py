"""Fixtures of the devstack tests: an emulator per test, simulators on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest
from kubernetes.aio import client, config

from devstack.kubeapi import KubeEmulator
from devstack.procs import free_port
from devstack.testkit import finish_within
from devstack.simulator import MemberSimulator
from devstack_cluster import CRD_FILES, LOAD, NS, UNLOAD, Cluster

# Teardown bounds: generous on a loaded 2-core machine, far below pytest-timeout's 120 s, so a
# stuck stop fails its test saying what it waited for. A simulator's stop is bounded by its
# upstreams' SIGTERM grace (2 s) and reap (10 s), run in parallel.
EMULATOR_STOP = 15.0
SIMULATOR_STOP = 30.0


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """A fresh emulator with the project's CRDs and namespace `sim`, and a client on it."""
    if not any("inferenceservices" in p.name for p in CRD_FILES):
        pytest.skip("crds/ has no InferenceService CRD")
    emu = KubeEmulator(crd_paths=CRD_FILES)
    await emu.start("127.0.0.1", free_port())
    kubeconfig = tmp_path / "kubeconfig"
    emu.write_kubeconfig(kubeconfig)
    api = await config.new_client_from_config(config_file=str(kubeconfig), persist_config=False)
    try:
        await client.CoreV1Api(api).create_namespace({"metadata": {"name": NS}})
        yield Cluster(emu, api, kubeconfig)
    finally:
        await finish_within(api.close(), EMULATOR_STOP, "the test's API client to close")
        await finish_within(emu.stop(), EMULATOR_STOP, "the emulator to stop")


SimFactory = Callable[..., Awaitable[MemberSimulator]]


@pytest.fixture
async def sims(cluster: Cluster, tmp_path: Path) -> AsyncIterator[SimFactory]:
    """Start simulators on the emulator (short delays); every one is stopped at teardown."""
    started: list[MemberSimulator] = []

    async def start(ports: dict[str, int] | None = None, **kwargs: Any) -> MemberSimulator:
        kwargs.setdefault("default_load_delay", LOAD)
        kwargs.setdefault("default_unload_delay", UNLOAD)
        kwargs.setdefault("timeline_path", tmp_path / "timeline.jsonl")
        sim = MemberSimulator(cluster.kubeconfig, [NS], ports or {}, log_dir=tmp_path, **kwargs)
        started.append(sim)
        await sim.start()
        return sim

    try:
        yield start
    finally:
        for n, sim in enumerate(started):
            await finish_within(sim.stop(), SIMULATOR_STOP,
                                f"simulator #{n} to stop (its watches, member tasks, upstreams)")


from reconciler_kit import llmkube  # noqa: E402,F401  (the stand-in's fixture, shared)
