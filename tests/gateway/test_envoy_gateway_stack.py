"""The translated Envoy Gateway data path in front of the whole local stack: a real swap.

The API emulator holds the example ModelPool of deploy/examples/ and its members; the member
simulator plays LLMKube (a load takes e2e_support.LOAD_DELAY, pods come and go); the ext_proc
runs as its own process with the overlay's Deployment setting (no override_message_timeout).
Envoy Gateway's translation, on our Envoy, stands in front of the stack beside its own Envoy.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import AsyncIterator, Iterator

import aiohttp
import pytest
import yaml

from devstack import testkit
from devstack.stack import LocalStack
from devstack.stack_manifests import member
from devstack.fakemember import UpstreamHandle, start_upstream
from e2e.e2e_support import SWAP_BOUND, notices, start_stack, timeline
from tests.gateway.conftest import GatewayRun, run_translated
from tests.gateway.egctl import EXAMPLE_POOL, ExamplePool

pytestmark = [pytest.mark.envoy, pytest.mark.e2e]


@pytest.fixture
def stack(pool: ExamplePool, tmp_path: Path) -> Iterator[LocalStack]:
    """The local stack serving the example pool, in its own namespace, members cold."""
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": pool.namespace}}]
    docs += [member(name, pool.namespace) for name in pool.members]
    docs.append(yaml.safe_load(EXAMPLE_POOL.read_text(encoding="utf-8")))
    started = start_stack(tmp_path / "stack", docs, extproc_args=["--no-park-timeout-override"])
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def spares(pool: ExamplePool) -> AsyncIterator[dict[str, UpstreamHandle]]:
    """The example pool's IfIdle fallbacks (coder-small), each a real upstream."""
    handles = {name: await start_upstream(name, token_delay_ms=1) for name in pool.fallbacks}
    try:
        yield handles
    finally:
        for handle in handles.values():
            await handle.stop()


def _ports(stack: LocalStack, spares: dict[str, UpstreamHandle]) -> dict[str, int]:
    """Where the translated Envoy finds every Service: the members' and the fallbacks'."""
    return stack.ports.members | {name: h.port for name, h in spares.items()}


async def _resident(stack: LocalStack, pool: ExamplePool, expected: str) -> None:
    deadline = time.monotonic() + SWAP_BOUND
    while True:
        status = (await asyncio.to_thread(stack.pool, pool.name, pool.namespace)).get("status")
        if (status or {}).get("residentMember") == expected and status.get("phase") == "Ready":
            return
        if time.monotonic() >= deadline:
            pytest.fail(f"{expected} not resident after {SWAP_BOUND}s: {status}")
        await asyncio.sleep(0.1)


async def test_cross_model_request_is_parked_through_a_real_load(
        stack: LocalStack, gateway_run: GatewayRun, pool: ExamplePool, tmp_path: Path,
        spares: dict[str, UpstreamHandle]) -> None:
    envoy = run_translated(gateway_run, stack.ports.extproc, _ports(stack, spares),
                           tmp_path / "gateway-envoy")
    try:
        await _resident(stack, pool, pool.default)  # the cold pool warmed its default
        target = next(m for m in pool.members if m != pool.default)
        body = {"model": target, "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{envoy.url}/v1/chat/completions", json=body,
                                 timeout=aiohttp.ClientTimeout(total=60)) as resp:
                text = await resp.text()
                assert resp.status == 200, text
                assert resp.headers["x-served-by"] == target
                answered = time.monotonic()
    finally:
        envoy.stop()
    # The ext_proc's record: one swap from the default, and it released the held request.
    [swap] = [n for n in notices(stack, pool.name) if n["target"] == target]
    assert (swap["source"], swap["released"]) == (pool.default, 1)
    # The simulator's (same monotonic clock): the incumbent's pod was gone before the
    # target's was created, before the answer; the target went Ready once. (Its "ready"
    # line is written after the status, so the answer can beat it.)
    [gone] = timeline(stack, pool.default, "pod_deleted")
    [created] = timeline(stack, target, "pod_created")
    assert len(timeline(stack, target, "ready")) == 1
    assert gone["t"] < created["t"] < answered
    await _resident(stack, pool, target)


async def test_an_if_idle_request_goes_to_its_fallback_and_the_answer_says_so(
        stack: LocalStack, gateway_run: GatewayRun, pool: ExamplePool, tmp_path: Path,
        spares: dict[str, UpstreamHandle]) -> None:
    # The example pool names coder's fallback (coder-small); a real upstream plays it.
    (fallback,) = pool.fallbacks
    envoy = run_translated(gateway_run, stack.ports.extproc, _ports(stack, spares),
                           tmp_path / "gw")
    try:
        await _resident(stack, pool, pool.default)
        url = f"{envoy.url}/v1/chat/completions"
        async with aiohttp.ClientSession() as http:
            stream = asyncio.create_task(testkit.chat(
                http, envoy.url, pool.default, stream=True, tokens=20, token_delay_ms=100))
            await asyncio.sleep(0.6)  # the incumbent streams
            body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(url, json=body, headers={"x-modelpool-activation": "if-idle"},
                                 timeout=aiohttp.ClientTimeout(total=30)) as resp:
                text = await resp.text()
                assert resp.status == 200, text
                assert resp.headers["x-served-by"] == fallback
                assert "pool_incumbent_busy" in resp.headers["x-modelpool-fallback"]
            assert (await stream).status == 200
    finally:
        envoy.stop()
    assert not [n for n in notices(stack, pool.name, "SwapStarted") if n["target"] == "coder"]
