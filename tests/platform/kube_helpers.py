"""Helpers for the platform tests: a recording listener, object builders, a running watcher.

Polling comes from ``devstack.testkit`` (re-exported here for the tests that import it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from devstack import stack_manifests as manifests
from devstack.testkit import finish_within
from devstack.testkit import eventually  # noqa: F401  (re-exported for the tests)
from extproc.platform.kube.watcher import ClusterWatcher
from extproc.policy.model import MemberObservation, PoolKey, PoolSpec, StartHints
from extproc.settings import Settings

NS = "ml"
CRDS = Path(__file__).resolve().parents[2] / "crds"


class IgnoresReplicas:
    """The replica reports of a PoolListener, for test listeners about pools and members only."""

    def admission_changed(self, until: float) -> None:
        """Ignored."""

    def leadership_changed(self, key: PoolKey, leading: bool) -> None:
        """Ignored."""

    def peers_changed(self, peers: object) -> None:
        """Ignored."""

    def drain_announced(self, key: PoolKey, epoch: int, target: str) -> None:
        """Ignored."""

    def endpoints_changed(self, key: PoolKey, member: str, endpoints: tuple[str, ...]) -> None:
        """Ignored."""

    def replica_load(self) -> dict:
        """Nothing held, nothing in flight."""
        return {}


class Recorder(IgnoresReplicas):
    """A PoolListener that records every pool, member and status call as a tuple."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.endpoints: dict[tuple[PoolKey, str], tuple[str, ...]] = {}

    def pool_changed(self, spec: PoolSpec, hints: StartHints) -> None:
        """Record."""
        self.calls.append(("pool_changed", spec, hints))

    def pool_removed(self, key: PoolKey) -> None:
        """Record."""
        self.calls.append(("pool_removed", key))

    def member_changed(self, key: PoolKey, obs: MemberObservation) -> None:
        """Record."""
        self.calls.append(("member_changed", key, obs))

    def endpoints_changed(self, key: PoolKey, member: str, endpoints: tuple[str, ...]) -> None:
        """Keep the member's latest endpoints (apart from ``calls``)."""
        self.endpoints[(key, member)] = endpoints

    def members(self) -> list[MemberObservation]:
        """Every member observation reported, in order."""
        return [c[2] for c in self.calls if c[0] == "member_changed"]

    def take(self) -> list[tuple]:
        """The calls so far, clearing them."""
        calls, self.calls = self.calls, []
        return calls


def isvc(name: str, *, replicas: int | None, phase: str) -> dict:
    """An InferenceService object in NS with a status."""
    return manifests.member(name, NS, model=name, replicas=replicas, phase=phase)


def pod(name: str, labels: dict[str, str], *, finalizers: list[str] | None = None,
        namespace: str = NS) -> dict:
    """A Pod object with ``labels``."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "server", "image": "llama"}]}}


def modelpool(name: str, members: list[str], *, annotations: dict | None = None,
              **spec: Any) -> dict:
    """A ModelPool object in NS (``spec``: raw camelCase fields)."""
    return manifests.pool(name, NS, members, annotations=annotations, **spec)


@contextlib.asynccontextmanager
async def running(api: Any, recorder: Any = None, *, namespaces: tuple[str, ...] = (NS,),
                  sync_timeout: float = 5.0, **settings: Any) -> AsyncIterator[ClusterWatcher]:
    """Run a watcher (on namespace ml by default) until the block ends; waits for the sync.

    tests/kube_real uses it too, against the real API server (a longer ``sync_timeout``).
    """
    settings.setdefault("api_retry_max", 0.5)
    watcher = ClusterWatcher(api, Settings(namespaces=list(namespaces), swap_budget=111.0,
                                           fairness_window=22.0, **settings))
    task = asyncio.create_task(watcher.run(recorder or Recorder()))
    try:
        await asyncio.wait_for(watcher.synced.wait(), sync_timeout)
        yield watcher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await finish_within(task, 15, "the cluster watcher to end after its cancel")


@contextlib.asynccontextmanager
async def serving(route: str, handler: Callable[..., Any]) -> AsyncIterator[str]:
    """Serve GET ``route`` with ``handler`` on a free loopback port; yields the base URL."""
    from aiohttp import web  # noqa: PLC0415 - only the HTTP-serving tests need it

    app = web.Application()
    app.router.add_get(route, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def serving_answers(route: str, answers: dict[str, tuple[int, str]],
                          content_type: str) -> AsyncIterator[str]:
    """Serve ``answers[case]`` (status, body) at ``route``, which names ``{case}``; yields the URL."""
    from aiohttp import web  # noqa: PLC0415 - only the HTTP-serving tests need it

    async def handler(request: web.Request) -> web.Response:
        status, body = answers[request.match_info["case"]]
        return web.Response(status=status, text=body or None, content_type=content_type)

    async with serving(route, handler) as base:
        yield base


@contextlib.asynccontextmanager
async def started_emulator(tmp_path: Path, crd_dirs: list[Path]) -> AsyncIterator[Any]:
    """A started KubeEmulator with ``crd_dirs`` (namespaces ml and other), its kubeconfig set."""
    kubeapi = pytest.importorskip("devstack.kubeapi", reason="the API emulator is not written yet")
    if not (CRDS / "inference.llmkube.dev_modelpools.yaml").exists():
        pytest.skip("crds/ has no ModelPool CRD yet")
    emu = kubeapi.KubeEmulator(crd_dirs, namespaces=("default", NS, "other"),
                               bookmark_interval=0.2)
    await emu.start()
    emu.kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    try:
        yield emu
    finally:
        await finish_within(emu.stop(), 15, "the API emulator to stop")
