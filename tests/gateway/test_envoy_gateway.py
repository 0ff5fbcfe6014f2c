"""The Envoy Gateway overlay for real: Envoy Gateway's translation, run by our Envoy.

egctl (Envoy Gateway v1.9's translator) turns deploy/overlays/envoy-gateway and the example
pool's member Services into xDS; tests/gateway/bootstrap.py puts that on loopback unchanged
but for addresses, and the requests below go through it to the service (static pools file,
members always reachable: a swap flips the slot once the incumbent has drained) and to fake
members.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from extproc import metrics
from tests.deploy.conftest import render_path
from tests.gateway.bootstrap import connection_managers, dumped, gateway_listener
from tests.gateway.conftest import GATEWAY_LISTENER, OVERLAY, GatewayRun, GatewayStack
from tests.gateway.egctl import ExamplePool

pytestmark = pytest.mark.envoy
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"


def _chat_body(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


async def _chat(http: aiohttp.ClientSession, stack: GatewayStack, model: str,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes, float]:
    """POST a chat completion; (status, lower-cased headers, body, monotonic time it ended)."""
    async with http.post(f"{stack.url}/v1/chat/completions", json=_chat_body(model),
                         headers=headers or {}) as resp:
        body = await resp.read()
        return resp.status, {k.lower(): v for k, v in resp.headers.items()}, body, time.monotonic()


def _conditions(status: dict[str, Any]) -> dict[str, str]:
    """Condition type -> status of a policy's or route's first ancestor/parent."""
    parents = status.get("ancestors") or status.get("parents") or []
    assert parents, f"no parent/ancestor status: {status}"
    return {c["type"]: c["status"] for c in parents[0]["conditions"]}


def _assert_catch_all(status: int, headers: dict[str, str], body: bytes) -> None:
    """The answer is the overlay's catch-all: its HTTPRouteFilter's direct response."""
    (found,) = [d for d in render_path(OVERLAY) if d["kind"] == "HTTPRouteFilter"]
    fallback = found["spec"]["directResponse"]
    assert status == fallback["statusCode"] == 503, body
    assert headers["retry-after"] == "5"
    assert headers["content-type"] == fallback["contentType"] == "application/json"
    assert body == fallback["body"]["inline"].encode()
    assert json.loads(body)["error"]["code"] == "router_unavailable"


def test_envoy_gateway_accepts_every_overlay_object(gateway_run: GatewayRun) -> None:
    translation = gateway_run.translation
    route = _conditions(translation.status_of("httpRoutes", "shared-gpu"))
    assert route["Accepted"] == "True" and route["ResolvedRefs"] == "True", route
    for kind_list, name in (("envoyExtensionPolicies", "modelpool-extproc"),
                            ("clientTrafficPolicies", "modelpool"),
                            ("backendTrafficPolicies", "modelpool-members")):
        conditions = _conditions(translation.status_of(kind_list, name))
        assert conditions["Accepted"] == "True", (kind_list, conditions)


def test_ext_proc_filter_as_translated(gateway_run: GatewayRun) -> None:
    # What the overlay asks of the filter and cannot be exercised quickly: a 330 s message
    # timeout (a whole hold) and fail-open; and the body buffered whole before the decision.
    listener = gateway_listener(gateway_run.config_dump, GATEWAY_LISTENER)
    (ext_proc,) = [f["typedConfig"] for hcm in connection_managers(listener)
                   for f in hcm["httpFilters"] if f["name"].startswith(EXT_PROC_FILTER)]
    assert ext_proc["messageTimeout"] == "330s"
    assert ext_proc["failureModeAllow"] is True
    assert ext_proc["processingMode"]["requestBodyMode"] == "BUFFERED"
    # Two messages each way here: Envoy Gateway sends the request headers whenever
    # processingMode.request is set, and the body mode lives under it (its API has no
    # headers-skip), nor a buffer filter or a route matching dynamic metadata, which the
    # standalone Envoy's one-message mode needs (tests/test_envoy_attributes.py).
    assert ext_proc["processingMode"]["requestHeaderMode"] == "SEND"
    assert "maxMessageTimeout" not in ext_proc, "the Deployment patch assumes there is none"


def test_member_clusters_take_a_whole_release(gateway_run: GatewayRun,
                                              pool: ExamplePool) -> None:
    # Every held request is released to the member at once: a cluster's limits (Envoy's
    # default 1,024) must not turn a large release into overflow 503s.
    serves = gateway_run.cluster_backends()
    clusters = {c["name"]: c for c in dumped(gateway_run.config_dump, "Clusters",
                                             "dynamicActiveClusters", "cluster")}
    members = {name: clusters[name] for name, services in serves.items()
               if services <= set(pool.members)}
    assert sorted(s for name in members for s in serves[name]) == sorted(pool.members)
    for name, cluster in members.items():
        (limits,) = cluster["circuitBreakers"]["thresholds"]
        for field in ("maxConnections", "maxPendingRequests", "maxRequests"):
            assert limits.get(field, 1024) >= 100_000, (name, field, limits)


async def test_request_is_routed_by_the_ext_proc_to_its_member(
        gateway: GatewayStack, gateway_run: GatewayRun, pool: ExamplePool) -> None:
    async with aiohttp.ClientSession() as http:
        status, headers, body, _ = await _chat(http, gateway, pool.default)
    assert status == 200, body
    assert headers["x-served-by"] == pool.default
    assert json.loads(body)["choices"][0]["message"]["content"].startswith(f"[{pool.default}]")
    assert gateway.served() == {m: int(m == pool.default) for m in pool.members + pool.fallbacks}
    # The request carried no routing header, so it matched the catch-all first; only the
    # ext_proc's header plus route cache clear can have moved it to the member's rule.
    entry = gateway.envoy.wait_access_log(1)[-1]
    assert entry["upstream_cluster"] == gateway_run.cluster_of(pool.default)
    assert entry["response_code_details"] == "via_upstream"


async def test_a_body_above_envoys_default_buffer_reaches_its_member(
        gateway: GatewayStack, pool: ExamplePool) -> None:
    # The ext_proc needs the whole body; Envoy's default buffer is 1 MiB and the
    # ClientTrafficPolicy raises it to 32 MiB (the service itself answers 413 above 25 MiB).
    prompt = "x" * (3 * 1024 * 1024)
    body = {"model": pool.default, "messages": [{"role": "user", "content": prompt}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gateway.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["x-served-by"] == pool.default
            answer = await resp.json()
    # the fake member echoes the prompt: all of it arrived
    assert prompt in answer["choices"][0]["message"]["content"]


async def test_cross_model_request_is_parked_through_a_swap_and_served(
        gateway: GatewayStack, pool: ExamplePool) -> None:
    incumbent, target = pool.default, next(m for m in pool.members if m != pool.default)
    labels = (pool.namespace, pool.name)
    swaps = metrics.SWAPS.labels(*labels, incumbent, target, "completed")
    swaps_before = swaps._value.get()
    async with aiohttp.ClientSession() as http:
        # A long SSE answer keeps the incumbent busy: drain before unload must hold the
        # cross-model request inside Envoy until this stream has ended.
        async with http.post(f"{gateway.url}/v1/chat/completions?delay_ms=50",
                             json=_chat_body(incumbent, stream=True, max_tokens=60)) as sse:
            assert sse.status == 200 and sse.headers["x-served-by"] == incumbent
            await sse.content.readline()
            crossing = asyncio.create_task(_chat(http, gateway, target))
            await _until(lambda: metrics.HELD.labels(*labels, target)._value.get() == 1,
                         "the cross-model request to be held")
            assert not crossing.done(), "served while the incumbent was still streaming"
            assert gateway.members[incumbent].stats.in_flight == 1
            rest = await sse.read()
            stream_ended = time.monotonic()
        status, headers, body, served_at = await crossing
    assert rest.rstrip().endswith(b"data: [DONE]")
    assert status == 200, body
    assert headers["x-served-by"] == target
    assert served_at > stream_ended  # an order, not a duration: released after the drain
    assert swaps._value.get() == swaps_before + 1
    assert gateway.members[target].stats.served == 1


async def _until(check: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("extproc_up", [True, False], ids=["ext_proc-up", "ext_proc-down"])
async def test_client_routing_header_is_stripped_before_routing(
        gateway: GatewayStack, pool: ExamplePool, extproc_up: bool) -> None:
    spoofed = next(m for m in pool.members if m != pool.default)
    if not extproc_up:
        await gateway.stop_extproc()
    async with aiohttp.ClientSession() as http:
        status, headers, body, _ = await _chat(
            http, gateway, pool.default,
            headers={"x-modelpool-member": f"{spoofed}.{pool.namespace}"})
    if extproc_up:
        # the ext_proc's own header decides, not the client's
        assert (status, headers.get("x-served-by")) == (200, pool.default), body
    else:
        # nothing set a header after the strip: the catch-all, not the spoofed member
        _assert_catch_all(status, headers, body)
    assert gateway.served()[spoofed] == 0


async def test_catch_all_answers_503_with_retry_after_when_the_ext_proc_is_down(
        gateway: GatewayStack, pool: ExamplePool) -> None:
    await gateway.stop_extproc()
    async with aiohttp.ClientSession() as http:
        status, headers, body, _ = await _chat(http, gateway, pool.default)
    _assert_catch_all(status, headers, body)
    assert gateway.served() == {m: 0 for m in pool.members + pool.fallbacks}
