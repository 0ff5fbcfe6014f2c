"""The optional route check against the API emulator with the Gateway API CRDs: a member no
HTTPRoute routes gets one Warning Event on its ModelPool, again only after it was fixed and
broke again; a cluster without the Gateway API (or without RBAC for it) gets none."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kube_helpers import CRDS, NS, Recorder, eventually, isvc, modelpool, started_emulator

from devstack import upstream_crds
from extproc.platform.kube.client import make_api_client
from extproc.platform.kube.recorder import EventRecorder
from extproc.platform.kube.routecheck import REASON, RouteChecker
from extproc.platform.kube.platform import KubePlatform
from extproc.policy.model import PoolKey, PoolSpec
from extproc.settings import Settings

KEY = PoolKey(NS, "slot")


@pytest.fixture
async def gw_emulator(tmp_path: Path) -> AsyncIterator[Any]:
    """The emulator serving our CRDs and Gateway API's (HTTPRoute, from the Go module cache)."""
    gateway_api = upstream_crds.need(upstream_crds.files, "gateway-api")
    async with started_emulator(tmp_path, [CRDS, *gateway_api]) as emu:
        yield emu


def _route(values: list[str]) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "slot", "namespace": NS},
            "spec": {"parentRefs": [{"name": "modelpool"}], "rules": [
                {"matches": [{"headers": [{"name": "x-modelpool-member", "type": "Exact",
                                           "value": v}]}],
                 "backendRefs": [{"name": v.split(".")[0], "port": 8080}]} for v in values]}}


def _warnings(emulator: Any) -> list[str]:
    return [e["message"].split()[1] for e in emulator.list("events", NS)
            if e["reason"] == REASON and e["type"] == "Warning"]


async def test_a_member_without_a_route_is_warned_about_once(gw_emulator: Any) -> None:
    api = await make_api_client(Settings(kubeconfig=str(gw_emulator.kubeconfig)))
    try:
        gw_emulator.create("httproutes", _route(["a.ml"]), NS)
        spec = PoolSpec(KEY, ("a", "b"))
        checker = RouteChecker(api, Settings(), EventRecorder(api), lambda: [spec])
        await checker.check()
        assert _warnings(gw_emulator) == ["b"]
        await checker.check()
        assert _warnings(gw_emulator) == ["b"]  # no repeat while nothing changed
        gw_emulator.delete("httproutes", "slot", NS)
        gw_emulator.create("httproutes", _route(["a.ml", "b.ml"]), NS)
        await checker.check()
        assert _warnings(gw_emulator) == ["b"]
        gw_emulator.delete("httproutes", "slot", NS)
        gw_emulator.create("httproutes", _route(["b.ml"]), NS)
        await checker.check()
        assert sorted(_warnings(gw_emulator)) == ["a", "b"]  # a lost its route
    finally:
        await api.close()


async def test_the_platform_runs_the_check_only_when_asked(gw_emulator: Any) -> None:
    gw_emulator.create("inferenceservices", isvc("a", replicas=1, phase="Ready"))
    gw_emulator.create("inferenceservices", isvc("b", replicas=0, phase="Stopped"))
    gw_emulator.create("modelpools", modelpool("slot", ["a", "b"]))
    gw_emulator.create("httproutes", _route(["a.ml"]), NS)
    for interval, expected in ((0.0, []), (0.1, ["b"])):
        settings = Settings(kubeconfig=str(gw_emulator.kubeconfig), namespaces=[NS],
                            route_check_interval=interval)
        platform = await KubePlatform.create(settings)
        task = asyncio.create_task(platform.run(Recorder()))
        try:
            await asyncio.wait_for(platform.synced.wait(), 10)
            if expected:
                await eventually(lambda: _warnings(gw_emulator) == expected)
            else:
                await asyncio.sleep(0.5)  # several intervals of the enabled case
                assert _warnings(gw_emulator) == []
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await platform.stop()


async def test_no_gateway_api_means_no_warning(emulator: Any, api: Any) -> None:
    checker = RouteChecker(api, Settings(), EventRecorder(api), lambda: [PoolSpec(KEY, ("a",))])
    await checker.check()  # the list fails (404): logged, nothing recorded
    assert emulator.list("events", NS) == []
