"""IfIdle through the real Envoy, in both actuation modes: a request that asks not to displace
a busy incumbent is answered at once (503 pool_incumbent_busy + Retry-After) or served by its
member's fallback (a real upstream behind its own Envoy cluster, the answer saying so), and no
swap starts; once the incumbent is idle the same request is served by its member.

Pool ``busy`` asks per request (header x-modelpool-activation); pool ``spill`` is IfIdle by
annotation and names ``spill-small`` as spill-b's fallback.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import pytest

from devstack import procs, testkit
from devstack.stack import LocalStack
from e2e_support import NAMESPACE, chat, notices, pools, status, wait_resident

BOTH_MODES = True
FALLBACK = "spill-small"
FALLBACK_CLUSTER = f"fallback.{FALLBACK}.{NAMESPACE}"
FALLBACK_PORT = procs.free_port()
IF_IDLE = {"x-modelpool-activation": "if-idle"}
STACK_DOCS = pools(
    ("busy", ["busy-a", "busy-b"], {"default": "busy-a"}),
    ("spill", ["spill-a", "spill-b"], {"default": "spill-a", "annotations": {
        "modelpool.inference.llmkube.dev/activation": "IfIdle",
        "modelpool.inference.llmkube.dev/fallbacks": f"spill-b={FALLBACK}"}}))
STACK_OPTIONS = {"extra_clusters": {FALLBACK_CLUSTER: FALLBACK_PORT}}
STREAM = {"stream": True, "tokens": 20, "token_delay_ms": 100}  # ~2 s on its member


@pytest.fixture(scope="module")
def fallback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[procs.ManagedProcess]:
    """The fallback backend: a real OpenAI-compatible upstream that names itself."""
    log = Path(tmp_path_factory.mktemp("fallback")) / "upstream.log"
    proc = procs.ManagedProcess([sys.executable, "-m", "devstack.fakemember", "--name", FALLBACK,
                                 "--port", str(FALLBACK_PORT)], log, cwd=procs.PROJECT_ROOT)
    proc.start()
    try:
        procs.wait_for_http(f"http://{procs.LOCALHOST}:{FALLBACK_PORT}/v1/models", timeout=20)
        yield proc
    finally:
        proc.stop()


async def _while_streaming(http: aiohttp.ClientSession, stack: LocalStack, incumbent: str,
                           ask: Any) -> tuple[testkit.Reply, Any]:
    """Run ``ask()`` once a long stream on ``incumbent`` has started; both answers."""
    stream = asyncio.create_task(chat(http, stack, incumbent, **STREAM))
    await asyncio.sleep(0.6)  # admitted and streaming (its first tokens are out by now)
    try:
        answer = await ask()
    finally:
        streamed = await stream
    return streamed, answer


async def test_if_idle_behind_a_busy_incumbent_is_a_503_and_no_swap(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    assert (await chat(http, stack, "busy-a")).status == 200
    await wait_resident(stack, "busy", "busy-a")
    started = len(notices(stack, "busy", "SwapStarted"))
    streamed, refused = await _while_streaming(
        http, stack, "busy-a", lambda: chat(http, stack, "busy-b", headers=IF_IDLE))
    assert streamed.status == 200 and streamed.events[-1] == "[DONE]"
    assert refused.status == 503, refused.body
    error = refused.json()["error"]
    assert error["code"] == "pool_incumbent_busy" and "busy-a" in error["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert len(notices(stack, "busy", "SwapStarted")) == started
    assert status(stack, "busy").get("residentMember") == "busy-a"
    # idle now: the same request starts the swap and is served by its member
    served = await chat(http, stack, "busy-b", headers=IF_IDLE)
    assert served.status == 200 and served.served_by == "busy-b"


async def test_wait_is_the_default_and_holds_behind_a_busy_incumbent(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    assert (await chat(http, stack, "busy-a")).status == 200
    streamed, held = await _while_streaming(http, stack, "busy-a",
                                            lambda: chat(http, stack, "busy-b"))
    assert streamed.status == 200 and held.status == 200 and held.served_by == "busy-b"


@pytest.mark.parametrize("shape", ["one-message", "chunked"])
async def test_the_pools_fallback_serves_if_idle_and_says_so(
        stack: LocalStack, http: aiohttp.ClientSession, fallback: procs.ManagedProcess,
        shape: str) -> None:
    assert (await chat(http, stack, "spill-a")).status == 200
    await wait_resident(stack, "spill", "spill-a")
    started = len(notices(stack, "spill", "SwapStarted"))

    async def ask() -> tuple[int, dict[str, str], str]:
        body = testkit.chat_body("spill-b")
        # a chunked body keeps Envoy's headers message (two-message mode)
        data: Any = body if shape == "one-message" else _chunks(body)
        async with http.post(f"{stack.url}/v1/chat/completions", data=data,
                             headers={"content-type": "application/json"}) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, \
                await resp.text()

    streamed, (code, headers, text) = await _while_streaming(http, stack, "spill-a", ask)
    assert streamed.status == 200
    assert code == 200, text
    assert headers["x-served-by"] == FALLBACK
    assert headers["x-modelpool-fallback"] == f"{FALLBACK_CLUSTER}; reason=pool_incumbent_busy"
    assert len(notices(stack, "spill", "SwapStarted")) == started
    assert status(stack, "spill").get("residentMember") == "spill-a"
    # an ordinary answer says nothing of a fallback
    plain = await chat(http, stack, "spill-a")
    assert plain.status == 200 and "x-modelpool-fallback" not in plain.headers


async def test_a_bad_activation_header_is_a_400(stack: LocalStack,
                                                http: aiohttp.ClientSession) -> None:
    reply = await chat(http, stack, "busy-a", headers={"x-modelpool-activation": "later"})
    assert reply.status == 400 and reply.json()["error"]["code"] == "invalid_activation"


async def _chunks(body: bytes) -> Any:
    """The body as two chunks (no content-length: chunked transfer)."""
    half = len(body) // 2
    yield body[:half]
    yield body[half:]
