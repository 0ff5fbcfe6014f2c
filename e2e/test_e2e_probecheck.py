"""The idle probe cross-checked, through the real stack in llmkube mode: LLMKube's reconciler
(its stand-in) unloads an incumbent whose /slots always reads idle while our client streams
from it (LLMKube #1800); the service says so at once (Warning notice StreamsCut naming the
probe annotations) and counts the request it cut.

Another activator (LLMKube's own router, a second gateway) triggers the swap: this service
would not, while its own request streams on the incumbent.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Iterator

import aiohttp
import pytest

from devstack.stack import LocalStack
from devstack.stack_swaps import read_log
from devstack.fakemember_slots import BLIND_SLOTS_ENV
from e2e_support import NAMESPACE, chat, eventually, pools, wait_resident

STACK_DOCS = pools(("cut", ["cut-a", "cut-b"], {"default": "cut-a"}))
STACK_OPTIONS = {"actuation": "llmkube"}


@pytest.fixture(scope="module", autouse=True)
def blind_probe() -> Iterator[None]:
    """cut-a's /slots reads idle whatever it serves (its server inherits the environment)."""
    before = os.environ.get(BLIND_SLOTS_ENV)
    os.environ[BLIND_SLOTS_ENV] = "cut-a"
    yield
    if before is None:
        del os.environ[BLIND_SLOTS_ENV]
    else:
        os.environ[BLIND_SLOTS_ENV] = before


def _cuts(stack: LocalStack) -> list[dict]:
    return [e for e in read_log(stack.log_path("extproc")) if e.get("event") == "StreamsCut"]


async def test_an_unload_under_our_stream_is_reported_and_counted(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    assert (await chat(http, stack, "cut-a")).status == 200
    await wait_resident(stack, "cut", "cut-a")
    assert not _cuts(stack)
    stream = asyncio.create_task(chat(http, stack, "cut-a", stream=True, tokens=60,
                                      token_delay_ms=100))  # ~6 s
    await asyncio.sleep(0.8)
    # another activator asks for cut-b: LLMKube probes cut-a (idle, wrongly) and unloads it
    await asyncio.to_thread(stack.kubectl, "patch", "isvc", "cut-b", "-n", NAMESPACE,
                            "--type=merge", "-p", json.dumps({"spec": {"replicas": 1}}))
    [cut] = await eventually(lambda: _cuts(stack), what="the StreamsCut notice")
    assert cut["level"] == "warning" and cut["member"] == "cut-a" and cut["released"] == 1
    assert "inference.llmkube.dev/idle-metric" in cut["msg"]
    # the generation was cut before its end: the client sees a broken stream
    with pytest.raises(aiohttp.ClientPayloadError):
        await stream
    assert stack.metric("modelpool_extproc_requests_cut_total", member="cut-a",
                        reason="StreamsCut") == 1
