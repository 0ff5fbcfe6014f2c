"""Behind an InferencePool gateway the route check looks at the pool's InferencePool (API
emulator with the InferencePool CRD of the extension's Go module): pods it selects of no
member, and members whose pods it does not select, are each one Warning Event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kube_helpers import CRDS, NS, pod, started_emulator

from devstack import upstream_crds
from extproc.inference_pool import inference_pool
from extproc.names import POOL_LABEL
from extproc.platform.kube.client import make_api_client
from extproc.platform.kube.recorder import EventRecorder
from extproc.platform.kube.poolcheck import FOREIGN, UNSELECTED
from extproc.platform.kube.routecheck import RouteChecker
from extproc.policy.model import PoolKey, PoolSpec
from extproc.settings import Settings

KEY = PoolKey(NS, "slot")
SERVICE = "inference.llmkube.dev/service"


@pytest.fixture
async def pool_emulator(tmp_path: Path) -> AsyncIterator[Any]:
    """The emulator serving our CRDs and InferencePool's (from the Go module cache)."""
    crds = upstream_crds.need(upstream_crds.files, "inference-extension", ("InferencePool",))
    async with started_emulator(tmp_path, [CRDS, *crds]) as emu:
        yield emu


def _warnings(emulator: Any) -> list[tuple[str, str]]:
    return sorted((e["reason"], e["message"]) for e in emulator.list("events", NS)
                  if e["type"] == "Warning")


async def test_foreign_and_unselected_pods_are_warned_about_once(pool_emulator: Any) -> None:
    api = await make_api_client(Settings(kubeconfig=str(pool_emulator.kubeconfig)))
    try:
        pool_emulator.create("inferencepools", inference_pool("slot", NS, 8080), NS)
        pool_emulator.create("pods", pod("a-0", {SERVICE: "a", POOL_LABEL: "slot"}))
        pool_emulator.create("pods", pod("b-0", {SERVICE: "b"}))  # not labelled for the pool
        pool_emulator.create("pods", pod("x-0", {SERVICE: "x", POOL_LABEL: "slot"}))  # no member
        spec = PoolSpec(KEY, ("a", "b", "c"))  # c has no pod: nothing to select yet
        checker = RouteChecker(api, Settings(endpoint_picker=True, route_check_interval=60),
                               EventRecorder(api), lambda: [spec])
        await checker.check()
        found = _warnings(pool_emulator)
        assert [reason for reason, _ in found] == [FOREIGN, UNSELECTED]
        assert "x-0" in found[0][1] and "a-0" not in found[0][1]
        assert "of b:" in found[1][1] and f"{POOL_LABEL}: slot" in found[1][1]
        await checker.check()
        assert len(_warnings(pool_emulator)) == 2  # no repeat while nothing changed
        pool_emulator.delete("pods", "x-0", NS)
        pool_emulator.patch("pods", "b-0", {"metadata": {"labels": {POOL_LABEL: "slot"}}}, NS)
        await checker.check()
        assert len(_warnings(pool_emulator)) == 2  # fixed: nothing new
    finally:
        await api.close()


async def test_no_inference_pool_no_warning(pool_emulator: Any) -> None:
    api = await make_api_client(Settings(kubeconfig=str(pool_emulator.kubeconfig)))
    try:
        pool_emulator.create("pods", pod("a-0", {SERVICE: "a"}))
        checker = RouteChecker(api, Settings(endpoint_picker=True), EventRecorder(api),
                               lambda: [PoolSpec(KEY, ("a",))])
        await checker.check()
        assert _warnings(pool_emulator) == []
    finally:
        await api.close()
