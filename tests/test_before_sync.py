"""A replica that has not yet read its pools never answers "no such model".

Envoy may send a just-started replica requests before its health check says NOT_SERVING (a
restarted replica of several, docs/design/replicas.md). Until the platform's first full picture is
in, a request for a name the replica does not know yet waits for it, bounded by the request's own
patience (x-modelpool-max-wait) and the default swap budget, then is routed, refused as unknown, or
answered 503 ``pools_not_synced`` with Retry-After.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from devstack import testkit
from extproc.app import Service
from extproc.platform.static import StaticPlatform
from extproc.policy.model import PoolKey, PoolSpec
from extproc.settings import Settings

pytestmark = pytest.mark.envoy
SPEC = PoolSpec(PoolKey("demo", "shared-gpu"), ("judge", "coder"), default="judge",
                swap_budget=30.0)


class LateSync(StaticPlatform):
    """The static platform, announcing its pools only once ``release`` is set."""

    def __init__(self) -> None:
        super().__init__([SPEC])
        self.release = asyncio.Event()

    async def run(self, listener) -> None:
        """Wait for the test's word, then announce as the static platform does."""
        await self.release.wait()
        await super().run(listener)


@pytest.fixture
async def late(upstreams, envoy_factory):
    """(envoy, platform) with the platform not yet synced."""
    platform = LateSync()
    service = Service(Settings(listen="127.0.0.1:0", metrics_listen=""), platform)
    await service.start()
    envoy = envoy_factory(service.grpc_port, {f"{n}.demo": h.port
                                              for n, h in upstreams.items()})
    yield envoy, platform
    platform.release.set()
    await service.stop()


async def test_a_request_before_the_sync_waits_for_it_and_is_served(late) -> None:
    envoy, platform = late
    async with aiohttp.ClientSession() as session:
        asked = asyncio.create_task(testkit.chat(session, envoy.url, "coder"))
        await asyncio.sleep(0.5)
        assert not asked.done()  # held, not refused
        platform.release.set()
        reply = await asked
    assert reply.status == 200 and reply.headers["x-served-by"] == "coder", reply.body


async def test_an_unknown_model_is_refused_only_once_the_pools_are_known(late) -> None:
    envoy, platform = late
    async with aiohttp.ClientSession() as session:
        asked = asyncio.create_task(testkit.chat(session, envoy.url, "nonesuch"))
        await asyncio.sleep(0.3)
        assert not asked.done()
        platform.release.set()
        reply = await asked
    assert reply.status == 404, reply.body
    error = json.loads(reply.body)["error"]
    # refused once the pools were in (it waited for them), naming no model but its own
    assert error["code"] == "model_not_found" and "nonesuch" in error["message"]
    assert "coder" not in error["message"]


async def test_past_its_patience_an_unsynced_replica_says_so_with_retry_after(late) -> None:
    envoy, _ = late
    async with aiohttp.ClientSession() as session:
        reply = await testkit.chat(session, envoy.url, "coder",
                                   headers={"x-modelpool-max-wait": "300ms"})
    assert reply.status == 503 and reply.headers["retry-after"] == "1", reply.body
    assert json.loads(reply.body)["error"]["code"] == "pools_not_synced"
