"""A Lease call is not queued behind a burst of other requests: a takeover of a thousand pools
sends thousands of writes at once, and a membership renew waiting for a connection behind them
landed past its deadline (the replica stopped serving every pool)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import pytest
import yaml
from aiohttp import web

from extproc.platform.kube.credentials import from_kubeconfig
from extproc.platform.kube.leases import LeaseClient
from extproc.platform.kube.rest import REQUEST_CONNECTIONS, KubeClient

LEASES = "/apis/coordination.k8s.io/v1/namespaces/llm/leases/"
POOL = "/apis/inference.llmkube.dev/v1alpha1/namespaces/llm/modelpools/p/status"
BOUND = 30.0  # seconds: only a client that never sends the Lease call waits this long


class SlowServer:
    """An API server that holds every request but Lease calls until told."""

    def __init__(self) -> None:
        self.held = 0
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        if request.path.startswith(LEASES):
            name = request.path.rsplit("/", 1)[-1]
            return web.json_response({"metadata": {"name": name, "namespace": "llm",
                                                   "resourceVersion": "1"},
                                      "spec": {"holderIdentity": "r0"}})
        self.held += 1
        await self.release.wait()
        return web.json_response({})


@pytest.fixture
async def slow(tmp_path: Path) -> AsyncIterator[tuple[SlowServer, KubeClient]]:
    server = SlowServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u"}}]}))
    client = KubeClient(await from_kubeconfig(str(path)))
    try:
        yield server, client
    finally:
        server.release.set()
        await client.close()
        await runner.cleanup()


async def test_a_lease_call_is_answered_while_every_request_connection_is_busy(slow) -> None:
    server, client = slow
    writes = [asyncio.create_task(client.call("PATCH", POOL, body={"status": {}}))
              for _ in range(REQUEST_CONNECTIONS + 10)]  # ten more wait for a connection
    for _ in range(int(BOUND / 0.05)):
        if server.held >= REQUEST_CONNECTIONS:
            break
        await asyncio.sleep(0.05)
    assert server.held == REQUEST_CONNECTIONS  # every request connection is taken

    lease = await asyncio.wait_for(LeaseClient(client, "llm").get("replica-0"), BOUND)

    assert lease is not None and lease.holder == "r0"
    assert server.held == REQUEST_CONNECTIONS and not any(w.done() for w in writes)
    server.release.set()
    await asyncio.gather(*writes)
