"""The service as an InferencePool's endpoint picker, behind a real Envoy in each body mode.

Members' pods are fake servers on distinct loopback addresses with one port (127.0.0.2 and
127.0.0.3, as several pods of a cluster share a target port; ::1 for an IPv6 pod); Envoy sends
each request to the address the picker named (devstack/picker_envoy.py), so a request that
reaches the right member proves the header or metadata was right, and the member's own name in
its answer says which one served it.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

import aiohttp
import grpc
import pytest
import yaml

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack import envoyproc, procs
from devstack.picker_envoy import SERVED_HEADER, picker_config
from devstack.testkit import stop_front_to_back
from devstack.fakemember import SERVED_BY, UpstreamHandle, start_upstream
from extproc import metrics
from extproc.app import Service
from extproc.platform.hostport import join
from extproc.platform.static import StaticPlatform, load_endpoints, load_specs
from extproc.policy.model import PoolKey
from extproc.protocol.picker import DESTINATION
from extproc.protocol.service import SERVICE
from extproc.settings import Settings
from tests.reliability.grpcprobe import headers_message, open_process

pytestmark = pytest.mark.envoy

MODES = ["BUFFERED", "STREAMED", "FULL_DUPLEX_STREAMED"]
PODS = {"judge": "127.0.0.2", "coder": "127.0.0.3"}


def _no_ipv6_loopback() -> str:
    """Why this machine cannot serve on [::1] ("" when it can)."""
    if not socket.has_ipv6:
        return "Python was built without IPv6"
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError as exc:
        return f"the loopback has no IPv6 here: binding [::1] failed ({exc})"
    return ""


NO_IPV6 = _no_ipv6_loopback()


class SlowLoads(StaticPlatform):
    """The pools file's members, but each takes ``load`` seconds to start: a swap holds."""

    def __init__(self, pools_file: Path, settings: Settings, load: float) -> None:
        specs = load_specs(pools_file, settings)
        super().__init__(specs, load_endpoints(pools_file, specs, settings))
        self.load = load

    async def scale(self, key: PoolKey, member: str, replicas: int) -> None:
        """Start (after ``load`` seconds) or stop the member."""
        if replicas:
            await asyncio.sleep(self.load)
        await super().scale(key, member, replicas)


class PickerStack:
    """The fake pods, the service in picker mode on a static pool, and Envoy (one per test)."""

    def __init__(self, service: Service, pods: dict[str, UpstreamHandle]) -> None:
        self.service = service
        self.pods = pods
        self.envoy: envoyproc.EnvoyProcess | None = None

    def endpoint(self, member: str) -> str:
        """The member's pod as the picker names it."""
        return join(self.pods[member].host, self.pods[member].port)

    def served(self) -> dict[str, int]:
        """Requests each member's pod finished."""
        return {name: pod.stats.served for name, pod in self.pods.items()}


async def _start(tmp_path: Path, body_mode: str, hinted: tuple[str, ...] | None = None,
                 hosts: Mapping[str, str] = PODS, load: float = 0.0, served: str | None = None,
                 **options: Any) -> AsyncIterator[PickerStack]:
    """The stack; ``hinted``: the members whose pods the proxy's subset hint allows;
    ``hosts``: each member's pod address; ``load``: seconds a member takes to start;
    ``served``: what Envoy reports as the served endpoint (None: nothing);
    ``options``: more settings."""
    pods: dict[str, UpstreamHandle] = {}
    port = procs.free_port()
    subset = None if hinted is None else [join(hosts[m], port) for m in hinted]
    for name, host in hosts.items():
        pods[name] = await start_upstream(name, host, port, token_delay_ms=1)
    pools = {"pools": [{"namespace": "demo", "name": "shared-gpu", "members": list(hosts),
                        "default": "judge", "swapBudget": "5s",
                        "endpoints": {m: [join(h, port)] for m, h in hosts.items()}}]}
    pools_file = tmp_path / "pools.yaml"
    pools_file.write_text(yaml.safe_dump(pools), encoding="utf-8")
    # STREAMED bodies route up to the gateway's buffer limit: here Envoy's default, 1 MiB
    settings = Settings(listen="127.0.0.1:0", metrics_listen="", endpoint_picker=True,
                        endpoint_port=port, pools_file=str(pools_file),
                        **{"streamed_body_limit": 1024 * 1024, **options})
    service = Service(settings, SlowLoads(pools_file, settings, load) if load else None)
    stack = PickerStack(service, pods)
    try:
        await service.start()
        stack.envoy = envoyproc.EnvoyProcess.from_config(
            lambda listen, admin, log: picker_config(listen, admin, str(log), service.grpc_port,
                                                     body_mode, subset, served=served),
            workdir=tmp_path / "envoy").start()
        yield stack
    finally:
        await stop_front_to_back(stack.envoy, service.stop(), service.settings.shutdown_grace,
                                 pods.values())


@pytest.fixture(params=MODES)
async def stack(request: pytest.FixtureRequest, envoy_bin: Path,
                tmp_path: Path) -> AsyncIterator[PickerStack]:
    """The picker stack in each body mode a gateway may configure."""
    async for started in _start(tmp_path, request.param):
        yield started


async def _chat(url: str, model: str, headers: dict[str, str] | None = None,
                stream: bool = False, prompt: str = "hi") -> tuple[int, Mapping[str, str], str]:
    body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": prompt}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers or {},
                             timeout=aiohttp.ClientTimeout(total=30)) as resp:
            return resp.status, resp.headers.copy(), await resp.text()


async def test_each_request_reaches_the_pod_of_its_member_across_a_swap(
        stack: PickerStack) -> None:
    assert stack.envoy is not None
    for model in ("judge", "coder", "judge"):
        status, headers, text = await _chat(stack.envoy.url, model)
        assert status == 200, text
        assert headers[SERVED_BY] == model
        assert json.loads(text)["model"] == model
    assert stack.served() == {"judge": 2, "coder": 1}


async def test_a_client_sent_destination_is_overwritten_or_stripped(stack: PickerStack) -> None:
    assert stack.envoy is not None
    spoofed = {DESTINATION: stack.endpoint("judge")}
    status, headers, text = await _chat(stack.envoy.url, "coder", spoofed)
    assert (status, headers[SERVED_BY]) == (200, "coder"), text
    # Refused by us: the spoofed address is never reached either.
    status, _, text = await _chat(stack.envoy.url, "no-such-model", spoofed)
    assert status == 404 and json.loads(text)["error"]["code"] == "model_not_found"
    assert stack.served() == {"judge": 0, "coder": 1}


async def test_an_event_stream_arrives_whole(stack: PickerStack) -> None:
    assert stack.envoy is not None
    status, headers, text = await _chat(stack.envoy.url, "coder", stream=True)
    assert (status, headers[SERVED_BY]) == (200, "coder"), text
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) > 2
    assert all(json.loads(e)["model"] == "coder" for e in events[:-1])


async def test_a_body_of_many_chunks_reaches_the_member_whole(stack: PickerStack) -> None:
    assert stack.envoy is not None
    words = 100_000  # ~600 KB: Envoy hands it over in many chunks (streamed, full duplex)
    status, headers, text = await _chat(stack.envoy.url, "coder",
                                        prompt=" ".join(f"w{i}" for i in range(words)))
    assert (status, headers[SERVED_BY]) == (200, "coder"), text[:300]
    assert json.loads(text)["usage"]["prompt_tokens"] == words  # every word arrived


async def test_models_are_listed_by_the_picker(stack: PickerStack) -> None:
    assert stack.envoy is not None
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{stack.envoy.url}/v1/models") as resp:
            assert resp.status == 200
            ids = {m["id"] for m in (await resp.json())["data"]}
    assert ids == set(PODS)


@pytest.mark.parametrize("body_mode", ["BUFFERED", "FULL_DUPLEX_STREAMED"])
async def test_the_proxys_subset_hint_is_honoured(body_mode: str, envoy_bin: Path,
                                                  tmp_path: Path) -> None:
    # The hint allows judge's pod only: coder has no eligible endpoint, judge still serves.
    async for stack in _start(tmp_path, body_mode, hinted=("judge",)):
        assert stack.envoy is not None
        status, headers, text = await _chat(stack.envoy.url, "coder")
        assert status == 503, text
        assert json.loads(text)["error"]["code"] == "no_endpoint"
        assert headers["retry-after"] == "1"
        status, headers, text = await _chat(stack.envoy.url, "judge")
        assert (status, headers[SERVED_BY]) == (200, "judge"), text
        assert stack.served() == {"judge": 1, "coder": 0}


@pytest.mark.skipif(bool(NO_IPV6), reason=NO_IPV6 or "[::1] serves")
@pytest.mark.parametrize("body_mode", ["BUFFERED", "FULL_DUPLEX_STREAMED"])
async def test_an_ipv6_pod_is_reached_on_its_bracketed_address(body_mode: str, envoy_bin: Path,
                                                               tmp_path: Path) -> None:
    # coder's pod listens on [::1] only: Envoy's ORIGINAL_DST cluster reaches it when the
    # picker names it [::1]:port (fd00::5:8000 unbracketed was a 503 no healthy upstream)
    async for stack in _start(tmp_path, body_mode, hosts={"judge": "127.0.0.2", "coder": "::1"}):
        assert stack.envoy is not None
        for model in ("coder", "judge", "coder"):
            status, headers, text = await _chat(stack.envoy.url, model)
            assert (status, headers.get(SERVED_BY)) == (200, model), text
        assert stack.served() == {"judge": 1, "coder": 2}


async def test_a_sheddable_request_shed_under_the_held_bound_gets_429(
        envoy_bin: Path, tmp_path: Path) -> None:
    # Two priority -1 requests fill the bound while coder loads; a plain one outranks them
    # and the newer -1 is shed: the protocol's 429 for a dropped sheddable request
    async for stack in _start(tmp_path, "FULL_DUPLEX_STREAMED", load=1.0, max_held=2):
        assert stack.envoy is not None
        url = stack.envoy.url
        assert (await _chat(url, "judge"))[0] == 200

        async def coder(delay: float, priority: str) -> tuple[int, Mapping[str, str], str]:
            await asyncio.sleep(delay)  # arrival order: the held bound sees them one by one
            return await _chat(url, "coder", {"x-modelpool-priority": priority})
        results = await asyncio.gather(coder(0, "-1"), coder(0.2, "-1"), coder(0.4, "0"))
        assert [r[0] for r in results] == [200, 429, 200], results
        _, headers, text = results[1]
        assert json.loads(text)["error"]["code"] == "request_shed"
        assert int(headers["retry-after"]) >= 1
        assert stack.served() == {"judge": 1, "coder": 2}


async def test_the_protocols_health_services_answer(stack: PickerStack) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.service.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("liveness", "readiness", SERVICE):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, name


async def test_full_duplex_request_trailers_are_answered_after_the_decision(
        stack: PickerStack) -> None:
    # What a gateway's full-duplex filter sends for a request with trailers (an HTTP/2 or
    # gRPC client's), spoken directly: headers, a body chunk that does not end the stream,
    # then the trailers, which end it.
    head = ep.ProcessingRequest.FromString(headers_message())
    head.protocol_config.request_body_mode = pm.ProcessingMode.FULL_DUPLEX_STREAMED
    body = b'{"model": "judge", "messages": []}'
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.service.grpc_port}") as channel:
        call = open_process(channel)
        for message in (head, ep.ProcessingRequest(request_body=ep.HttpBody(body=body)),
                        ep.ProcessingRequest(request_trailers=ep.HttpTrailers())):
            await call.write(message.SerializeToString())
        replies = [await call.read() for _ in range(3)]
        await call.done_writing()
    routed, forwarded, trailers = replies
    (option,) = routed.request_headers.response.header_mutation.set_headers
    assert (option.header.key, option.header.raw_value) == \
        (DESTINATION, stack.endpoint("judge").encode())
    streamed = forwarded.request_body.response.body_mutation.streamed_response
    assert (streamed.body, streamed.end_of_stream) == (body, True)
    assert trailers.HasField("request_trailers")


@pytest.mark.parametrize("reported, elsewhere", [
    ("%UPSTREAM_REMOTE_ADDRESS%", 0),  # where Envoy really sent it: the pod we named
    ("127.0.0.9:1", 1),  # a gateway whose retry or fallback moved it
])
async def test_a_gateways_served_endpoint_is_compared_with_the_pick(
        reported: str, elsewhere: int, envoy_bin: Path, tmp_path: Path) -> None:
    async for stack in _start(tmp_path, "FULL_DUPLEX_STREAMED", served=reported):
        assert stack.envoy is not None
        counter = metrics.SERVED_ELSEWHERE.labels("demo", "shared-gpu")
        before = counter._value.get()  # noqa: SLF001
        status, headers, text = await _chat(stack.envoy.url, "judge")
        assert (status, headers[SERVED_BY]) == (200, "judge"), text
        assert SERVED_HEADER not in headers  # moved into the metadata, not shown the client
        assert counter._value.get() - before == elsewhere  # noqa: SLF001
