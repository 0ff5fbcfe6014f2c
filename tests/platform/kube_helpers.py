"""Helpers for the platform tests: a recording listener, polling, object builders."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from extproc.platform.kube.cache import ClusterWatcher
from extproc.policy.model import MemberObservation, PoolKey, PoolSpec
from extproc.settings import Settings

NS = "ml"
CRDS = Path(__file__).resolve().parents[2] / "crds"


class Recorder:
    """A PoolListener that records every call as a tuple."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def pool_changed(self, spec: PoolSpec, status: dict) -> None:
        """Record."""
        self.calls.append(("pool_changed", spec, status))

    def pool_removed(self, key: PoolKey) -> None:
        """Record."""
        self.calls.append(("pool_removed", key))

    def member_changed(self, key: PoolKey, obs: MemberObservation) -> None:
        """Record."""
        self.calls.append(("member_changed", key, obs))

    def members(self) -> list[MemberObservation]:
        """Every member observation reported, in order."""
        return [c[2] for c in self.calls if c[0] == "member_changed"]

    def take(self) -> list[tuple]:
        """The calls so far, clearing them."""
        calls, self.calls = self.calls, []
        return calls


async def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """Poll ``check`` until it returns a truthy value or raise AssertionError at ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.02)


def isvc(name: str, *, replicas: int | None, phase: str) -> dict:
    """An InferenceService object in NS with a status."""
    spec: dict[str, Any] = {"modelRef": name}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": NS}, "spec": spec,
            "status": {"phase": phase}}


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
    """A ModelPool object in NS."""
    return {"apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "ModelPool",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations or {}},
            "spec": {"members": [{"inferenceServiceRef": {"name": m}} for m in members],
                     **spec}}


@contextlib.asynccontextmanager
async def running(api: Any, recorder: Any = None, **kwargs: Any) -> AsyncIterator[ClusterWatcher]:
    """Run a watcher on namespace ml until the block ends; waits for the first sync."""
    kwargs.setdefault("backoff_max", 0.5)
    watcher = ClusterWatcher(api, [NS], recorder or Recorder(),
                             settings=Settings(swap_budget=111.0, fairness_window=22.0),
                             **kwargs)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.synced.wait(), 5)
        yield watcher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


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
        await emu.stop()
