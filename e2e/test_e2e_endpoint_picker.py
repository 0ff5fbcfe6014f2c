"""The swap scenarios behind an endpoint picker: the service as an InferencePool's EPP.

The same tests as test_e2e_swaps.py (a held cross-model request, coalescing, SSE drain) and
test_e2e_faults.py's budget 503 + Retry-After, a cold start of our own, in both actuation
modes, on a stack whose members' pods share one port on addresses of their own (127.0.0.2, 127.0.0.3, ...) and
whose Envoy runs Envoy Gateway's translation of deploy/overlays/inference-pool (an HTTPRoute
whose backend is the InferencePool) completed as its InferencePool extension completes it
(tests/gateway/inference_extension.py): request and response bodies FULL_DUPLEX_STREAMED, a
5 s message timeout (Envoy AI Gateway's before v0.4.0, 300 s since: the shorter one is the
one a hold must outlast), the pod the picker names. A member's server listens on its pod's address
only, so a reply from the right member shows the picker named the right pod.
"""

from __future__ import annotations

import functools

import aiohttp

import test_e2e_faults as faults
import test_e2e_swaps as swaps
from devstack.stack import LocalStack
from e2e_support import chat, pools, timeline, wait_resident
from extproc.protocol.picker import DESTINATION
from extproc.settings import parse_duration
from tests.gateway.inference_extension import inference_gateway
from test_e2e_faults import (  # noqa: F401  (collected here, on this module's stack)
    test_budget_exceeded_answers_503_and_the_swap_still_completes)
from test_e2e_swaps import (  # noqa: F401  (collected here, on this module's stack)
    test_concurrent_requests_for_one_member_share_one_swap,
    test_cross_model_request_is_held_through_an_ordered_swap,
    test_swap_waits_for_an_sse_stream_on_the_incumbent)

BOTH_MODES = True
MESSAGE_TIMEOUT = "5s"
LONG_LOAD = "7s"  # above the picker filter's message timeout
STACK_OPTIONS = {"endpoint_picker": True,
                 "gateway": functools.partial(inference_gateway, message_timeout=MESSAGE_TIMEOUT)}
STACK_DOCS = swaps.STACK_DOCS + [
    d for d in faults.STACK_DOCS if d["metadata"]["name"].startswith("budget")] + \
    [d for d in pools(("spoof", ["spoof-a", "spoof-b"], {"default": "spoof-a"}),
                      ("long", ["long-a", "long-b"], {"default": "long-a", "member_annotations": {
                          "long-b": {"sim.llmkube.dev/load-delay": LONG_LOAD}}}))
     if d["kind"] != "Namespace"]


async def test_a_spoofed_destination_from_the_client_is_ignored(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "spoof", "spoof-a")
    spoofed = {DESTINATION: stack.member_address("spoof-b")}
    reply = await chat(http, stack, "spoof-a", headers=spoofed)
    assert (reply.status, reply.served_by) == (200, "spoof-a"), reply.body
    assert timeline(stack, "spoof-b", "pod_created") == []  # nothing woke the other member
    # and for the other member, the picker's answer, not the client's, is where it goes
    reply = await chat(http, stack, "spoof-b", headers={DESTINATION: stack.member_address(
        "spoof-a")})
    assert (reply.status, reply.served_by) == (200, "spoof-b"), reply.body


async def test_a_hold_outlasts_the_gateways_message_timeout(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    # Full duplex: Envoy holds the request headers for our answer without timing them out
    # by the filter's message timeout (5 s here), so a longer swap still ends in a 200.
    await wait_resident(stack, "long", "long-a")
    reply = await chat(http, stack, "long-b")
    assert (reply.status, reply.served_by) == (200, "long-b"), reply.body
    assert reply.took >= parse_duration(LONG_LOAD)


async def test_the_cold_pool_serves_its_default_from_its_pod(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    # (test_e2e_swaps' cold-start test also wants our SwapCompleted notice of the warm-up,
    # which in llmkube mode the reconciler may finish before our process is up.)
    await wait_resident(stack, "cold", "cold-a")
    reply = await chat(http, stack, "cold-a")
    assert (reply.status, reply.served_by) == (200, "cold-a"), reply.body
    assert reply.json()["choices"][0]["message"]["content"].startswith("[cold-a]")
    assert timeline(stack, "cold-b", "pod_created") == []  # the other member never started
