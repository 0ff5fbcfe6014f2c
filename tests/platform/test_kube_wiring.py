"""KubePlatform end to end against the emulator: the runtime's Platform calls do what they say."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from kube_helpers import NS, Recorder, eventually, isvc, modelpool

from extproc.platform.kube.platform import KubePlatform
from extproc.policy.events import Notice
from extproc.policy.model import MemberObservation, PoolKey, PoolPhase, PoolView
from extproc.settings import Settings

KEY = PoolKey(NS, "slot")


async def test_platform_calls(emulator: Any) -> None:
    emulator.create("inferenceservices", isvc("a", replicas=1, phase="Ready"))
    emulator.create("inferenceservices", isvc("b", replicas=0, phase="Stopped"))
    emulator.create("modelpools", modelpool("slot", ["a", "b"]))

    async def slots(request: web.Request) -> web.Response:
        busy = request.match_info["member"] == "a"
        return web.json_response([{"id": 0, "is_processing": busy}])

    app = web.Application()
    app.router.add_get("/{ns}/{member}/slots", slots)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]

    settings = Settings(kubeconfig=str(emulator.kubeconfig), namespaces=[NS],
                        idle_probe_url=f"http://127.0.0.1:{port}/{{namespace}}/{{member}}/slots")
    platform = await KubePlatform.create(settings)
    recorder = Recorder()
    task = asyncio.create_task(platform.run(recorder))
    try:
        await asyncio.wait_for(platform.synced.wait(), 5)
        assert [c[0] for c in recorder.take()] == ["pool_changed", "member_changed",
                                                   "member_changed"]
        await eventually(lambda: platform.replicas.leads(KEY))  # a lone replica takes the Lease
        await platform.scale(KEY, "a", 0)
        await eventually(lambda: any(c[2].name == "a" and c[2].replicas == 0
                                     for c in recorder.calls if c[0] == "member_changed"))
        assert await platform.probe_idle(KEY, "a") is False
        assert await platform.probe_idle(KEY, "b") is True
        platform.publish(PoolView(KEY, PoolPhase.SWAPPING, "", "b",
                                  (MemberObservation("a", replicas=0, pods=0),
                                   MemberObservation("b", replicas=1, pods=1)), 1))
        platform.notify(KEY, Notice("SwapStarted", "swapping from a to b"))
        await eventually(lambda: (emulator.get("modelpools", "slot", NS).get("status") or {})
                         .get("pendingMember") == "b")
        await eventually(lambda: emulator.list("events", NS))
        event = emulator.list("events", NS)[0]
        assert event["reason"] == "SwapStarted" and event["type"] == "Normal"
        assert event["involvedObject"]["uid"] == platform.watcher.pool_uid(KEY)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await platform.stop()
        await runner.cleanup()
