"""The swap engine through the real Envoy, with a controllable fake platform.

Requests are parked in Envoy (the ext_proc holds the stream) while a FakeCluster loads and
unloads members after short delays; the fake records every scale call so tests can check
the order of operations against what clients saw.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from devstack import testkit
from extproc import metrics
from extproc.app import Service
from extproc.platform.static import StaticPlatform
from extproc.policy.model import MemberObservation, PoolKey, PoolSpec
from extproc.settings import Settings

pytestmark = pytest.mark.envoy
KEY = PoolKey("demo", "shared-gpu")


class FakeCluster(StaticPlatform):
    """The static Platform, but members take ``load``/``unload`` seconds; records what happened."""

    def __init__(self, specs: list[PoolSpec], *, load: float = 0.4, unload: float = 0.1,
                 fail: set[str] | None = None) -> None:
        super().__init__(specs)
        self.load, self.unload = load, unload
        self.fail = fail or set()
        self.record: list[tuple[float, str, str]] = []
        self.notices: list[str] = []

    def _see(self, key, member, phase, replicas, pods) -> None:
        self.record.append((time.monotonic(), member, phase))
        self._listener.member_changed(key, MemberObservation(member, phase=phase,
                                                             replicas=replicas, pods=pods))

    async def scale(self, key, member, replicas) -> None:
        """Load or unload after a delay, like a real controller would."""
        if replicas:
            self._see(key, member, "Creating", 1, 1)
            await asyncio.sleep(self.load)
            self._see(key, member, "Failed" if member in self.fail else "Ready", 1, 1)
        else:
            self._see(key, member, "Progressing", 0, 1)
            await asyncio.sleep(self.unload)
            self._see(key, member, "Stopped", 0, 0)

    def notify(self, key, notice) -> None:
        """Keep the notices for assertions."""
        self.notices.append(notice.kind)

    def scale_ups(self, member: str) -> int:
        """How many times ``member`` started loading."""
        return sum(1 for _, m, phase in self.record if m == member and phase == "Creating")


@pytest.fixture
async def make_stack(upstreams, envoy_factory):
    """Build (envoy, cluster, upstreams) for a pool with the given spec options."""
    services: list[Service] = []

    async def build(default: str = "", swap_budget: float = 30.0, fairness: float = 30.0,
                    max_held: int = 0, **cluster_options):
        spec = PoolSpec(KEY, ("judge", "coder"), default=default, swap_budget=swap_budget,
                        fairness_window=fairness)
        cluster = FakeCluster([spec], **cluster_options)
        service = Service(Settings(listen="127.0.0.1:0", metrics_listen="", max_held=max_held),
                          cluster)
        await service.start()
        services.append(service)
        envoy = envoy_factory(service.grpc_port, {f"{n}.demo": h.port
                                                  for n, h in upstreams.items()})
        await cluster.synced.wait()
        return envoy, cluster

    yield build
    for service in services:
        await service.stop()


async def _chat(session: aiohttp.ClientSession, url: str, model: str, **extra):
    reply = await testkit.chat(session, url, model, **extra)
    return reply.status, reply.headers, reply.body, reply.began, reply.ended


def _held() -> float:
    (family,) = metrics.HELD.collect()
    return sum(s.value for s in family.samples
               if (s.labels["namespace"], s.labels["pool"]) == (KEY.namespace, KEY.name))


async def test_cold_request_is_held_then_served(make_stack, upstreams):
    envoy, cluster = await make_stack(load=0.5)
    async with aiohttp.ClientSession() as session:
        status, headers, _, started, ended = await _chat(session, envoy.url, "coder")
    assert status == 200 and headers["x-served-by"] == "coder"
    assert ended - started >= 0.5  # it waited for the load
    assert cluster.scale_ups("coder") == 1 and cluster.scale_ups("judge") == 0
    assert _held() == 0


async def test_cross_model_request_waits_for_in_flight_sse_stream(make_stack, upstreams):
    envoy, cluster = await make_stack(default="judge", unload=0.05, load=0.1)
    async with aiohttp.ClientSession() as session:
        await _chat(session, envoy.url, "judge")  # judge resident and warm
        sse_done = asyncio.Event()

        async def stream() -> list[str]:
            async with session.post(f"{envoy.url}/v1/chat/completions?delay_ms=20", json={
                    "model": "judge", "stream": True, "max_tokens": 40,
                    "messages": [{"role": "user", "content": "long"}]}) as resp:
                assert resp.status == 200
                text = await resp.text()
            sse_done.set()
            return [line for line in text.splitlines() if line.startswith("data: ")]

        stream_task = asyncio.create_task(stream())
        await asyncio.sleep(0.2)  # the stream is flowing
        status, headers, _, _, ended = await _chat(session, envoy.url, "coder")
        events = await stream_task
    assert events[-1] == "data: [DONE]"  # the stream was not cut
    assert sum('"content"' in e for e in events) == 40
    assert status == 200 and headers["x-served-by"] == "coder"
    unload_started = next(t for t, m, phase in cluster.record
                          if m == "judge" and phase == "Progressing")
    assert sse_done.is_set()
    assert unload_started >= ended - 5  # sanity: the swap belongs to this request
    judge_ready = max(t for t, m, phase in cluster.record if m == "judge" and phase == "Ready")
    coder_load = next(t for t, m, phase in cluster.record if m == "coder" and phase == "Creating")
    assert judge_ready < unload_started < coder_load


async def test_twenty_concurrent_requests_share_one_swap(make_stack, upstreams):
    envoy, cluster = await make_stack(default="judge", load=0.4)
    async with aiohttp.ClientSession() as session:
        await _chat(session, envoy.url, "judge")
        results = await asyncio.gather(*(_chat(session, envoy.url, "coder")
                                         for _ in range(20)))
    assert [r[0] for r in results] == [200] * 20
    assert {r[1]["x-served-by"] for r in results} == {"coder"}
    assert cluster.scale_ups("coder") == 1
    assert cluster.notices.count("SwapCompleted") == 2  # warm judge, then judge -> coder
    assert _held() == 0


async def test_budget_exceeded_gets_503_and_the_swap_still_completes(make_stack, upstreams):
    envoy, cluster = await make_stack(default="judge", swap_budget=0.5, load=1.5)
    async with aiohttp.ClientSession() as session:
        for _ in range(40):  # wait for the default to warm (bounded)
            if cluster.notices.count("SwapCompleted"):
                break
            await asyncio.sleep(0.1)
        status, headers, body, started, ended = await _chat(session, envoy.url, "coder")
        assert status == 503
        assert int(headers["retry-after"]) >= 1
        error = json.loads(body)["error"]
        assert error["code"] == "swap_budget_exceeded" and "coder" in error["message"]
        assert 0.5 <= ended - started < 1.5
        for _ in range(40):  # the swap goes on without its waiter
            if cluster.notices.count("SwapCompleted") == 2:
                break
            await asyncio.sleep(0.1)
        status, headers, _, started, ended = await _chat(session, envoy.url, "coder")
    assert status == 200 and headers["x-served-by"] == "coder"
    assert ended - started < 0.5  # served warm
    assert cluster.scale_ups("coder") == 1


async def test_disconnect_while_held_drops_the_request_not_the_swap(make_stack, upstreams):
    envoy, cluster = await make_stack(default="judge", load=1.0)
    async with aiohttp.ClientSession() as session:
        await _chat(session, envoy.url, "judge")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(_chat(session, envoy.url, "coder"), timeout=0.3)
        for _ in range(30):  # Envoy ends the stream within milliseconds of the client
            if _held() == 0:
                break
            await asyncio.sleep(0.05)
        assert _held() == 0
        for _ in range(40):
            if cluster.notices.count("SwapCompleted") == 2:
                break
            await asyncio.sleep(0.1)
        assert cluster.notices.count("SwapCompleted") == 2
        status, headers, _, _, _ = await _chat(session, envoy.url, "coder")
    assert status == 200 and headers["x-served-by"] == "coder"


async def test_failed_member_fails_held_requests_fast(make_stack, upstreams):
    envoy, cluster = await make_stack(default="judge", load=0.3, fail={"coder"})
    async with aiohttp.ClientSession() as session:
        await _chat(session, envoy.url, "judge")
        status, headers, body, started, ended = await _chat(session, envoy.url, "coder")
    assert status == 503
    assert json.loads(body)["error"]["code"] == "member_failed"
    assert ended - started < 5  # fast, long before the 30 s budget
    assert "SwapFailed" in cluster.notices


async def _until_swaps_completed(cluster: FakeCluster, count: int) -> None:
    for _ in range(100):  # bounded: 10 s at most
        if cluster.notices.count("SwapCompleted") >= count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{count} swaps not completed: {cluster.notices}")


def _refused(outcome: str) -> float:
    return metrics.REQUESTS.labels(KEY.namespace, KEY.name, outcome)._value.get()


async def test_a_deadline_shorter_than_the_expected_wait_gets_503_and_the_swap_goes_on(
        make_stack, upstreams):
    envoy, cluster = await make_stack(default="judge", load=1.0)
    patience = {"x-modelpool-max-wait": "200ms"}
    async with aiohttp.ClientSession() as session:
        await _chat(session, envoy.url, "judge")  # one swap of ~1 s is the pool's history
        status, headers, body, _, _ = await _chat(session, envoy.url, "coder",
                                                  headers=patience)
        assert status == 503 and json.loads(body)["error"]["code"] == "max_wait_exceeded"
        assert int(headers["retry-after"]) >= 1  # ~1 s expected: rounded up, at least 1
        await _until_swaps_completed(cluster, 2)  # coder was loaded without a waiter
        status, headers, _, _, _ = await _chat(session, envoy.url, "coder", headers=patience)
    assert status == 200 and headers["x-served-by"] == "coder"
    assert cluster.scale_ups("coder") == 1


async def test_a_deadline_longer_than_the_expected_wait_is_held_as_usual(make_stack,
                                                                          upstreams):
    envoy, cluster = await make_stack(default="judge", load=0.3)
    async with aiohttp.ClientSession() as session:
        await _chat(session, envoy.url, "judge")
        status, headers, _, _, _ = await _chat(session, envoy.url, "coder",
                                               headers={"x-modelpool-max-wait": "1m"})
    assert status == 200 and headers["x-served-by"] == "coder"


@pytest.mark.parametrize("value", ["soon", "-5s", "10", "5 parsecs"])
async def test_a_bad_deadline_header_is_a_400_and_moves_nothing(make_stack, upstreams, value):
    envoy, cluster = await make_stack(default="judge")
    async with aiohttp.ClientSession() as session:
        await _chat(session, envoy.url, "judge")
        status, _, body, _, _ = await _chat(session, envoy.url, "coder",
                                            headers={"x-modelpool-max-wait": value})
    if value == "10":  # a bare number is seconds, as in every duration setting
        assert status == 200
        return
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "invalid_max_wait"
    assert error["param"] == "x-modelpool-max-wait" and error["type"] == "invalid_request_error"
    assert cluster.scale_ups("coder") == 0


async def test_beyond_the_held_bound_requests_get_503_at_once(make_stack, upstreams):
    envoy, cluster = await make_stack(default="judge", load=1.0, max_held=2)
    before = _refused("too_many_held")
    async with aiohttp.ClientSession() as session:
        await _chat(session, envoy.url, "judge")
        results = await asyncio.gather(*(_chat(session, envoy.url, "coder")
                                         for _ in range(5)))
    statuses = sorted(r[0] for r in results)
    assert statuses == [200, 200, 503, 503, 503]
    refused = [r for r in results if r[0] == 503]
    assert all(json.loads(r[2])["error"]["code"] == "too_many_held" for r in refused)
    assert all(int(r[1]["retry-after"]) >= 1 for r in refused)
    assert _refused("too_many_held") - before == 3  # counted per pool
    assert metrics.HELD_LIMIT.labels(KEY.namespace, KEY.name)._value.get() == 2


async def test_a_sheddable_request_shed_under_the_held_bound_gets_429(make_stack, upstreams):
    # Two priority -1 requests fill the bound; a plain one outranks them and the newer -1 is
    # shed: 429, as the Endpoint Picker Protocol asks for a sheddable request under load
    envoy, cluster = await make_stack(default="judge", load=1.0, max_held=2)
    before = _refused("request_shed")
    async with aiohttp.ClientSession() as session:
        await _chat(session, envoy.url, "judge")

        async def coder(delay: float, priority: str):
            await asyncio.sleep(delay)  # arrival order: the held bound sees them one by one
            return await _chat(session, envoy.url, "coder",
                               headers={"x-modelpool-priority": priority})
        results = await asyncio.gather(coder(0, "-1"), coder(0.2, "-1"), coder(0.4, "0"))
    assert [r[0] for r in results] == [200, 429, 200]
    _, headers, body, _, _ = results[1]
    error = json.loads(body)["error"]
    assert (error["code"], error["type"]) == ("request_shed", "requests")
    assert "priority -1" in error["message"] and int(headers["retry-after"]) >= 1
    assert _refused("request_shed") - before == 1
