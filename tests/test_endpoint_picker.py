"""The service as an InferencePool's endpoint picker, behind a real Envoy in each body mode.

Members' pods are fake servers on distinct loopback addresses with one port (127.0.0.2 and
127.0.0.3, as several pods of a cluster share a target port); Envoy sends each request to the
address the picker named (devstack/picker_envoy.py), so a request that reaches the right
member proves the header or metadata was right, and the member's own name in its answer
says which one served it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import AsyncIterator, Mapping

import aiohttp
import grpc
import pytest
import yaml

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack import procs
from devstack.picker_envoy import picker_config
from devstack.testkit import stop_front_to_back
from devstack.upstream import SERVED_BY, UpstreamHandle, start_upstream
from extproc.app import Service
from extproc.protocol.picker import DESTINATION
from extproc.protocol.service import SERVICE
from extproc.settings import Settings
from tests.reliability.grpcprobe import headers_message, open_process

pytestmark = pytest.mark.envoy

MODES = ["BUFFERED", "STREAMED", "FULL_DUPLEX_STREAMED"]
PODS = {"judge": "127.0.0.2", "coder": "127.0.0.3"}


class PickerStack:
    """The fake pods, the service in picker mode on a static pool, and Envoy (one per test)."""

    def __init__(self, service: Service, pods: dict[str, UpstreamHandle]) -> None:
        self.service = service
        self.pods = pods
        self.envoy: procs.EnvoyProcess | None = None

    def endpoint(self, member: str) -> str:
        """The member's pod as the picker names it."""
        return f"{self.pods[member].host}:{self.pods[member].port}"

    def served(self) -> dict[str, int]:
        """Requests each member's pod finished."""
        return {name: pod.stats.served for name, pod in self.pods.items()}


async def _start(tmp_path: Path, body_mode: str,
                 hinted: tuple[str, ...] | None = None) -> AsyncIterator[PickerStack]:
    """The stack; ``hinted``: the members whose pods the proxy's subset hint allows."""
    pods: dict[str, UpstreamHandle] = {}
    port = procs.free_port()
    subset = None if hinted is None else [f"{PODS[m]}:{port}" for m in hinted]
    for name, host in PODS.items():
        pods[name] = await start_upstream(name, host, port, token_delay_ms=1)
    pools = {"pools": [{"namespace": "demo", "name": "shared-gpu", "members": list(PODS),
                        "default": "judge", "swapBudget": "5s",
                        "endpoints": {m: [f"{h}:{port}"] for m, h in PODS.items()}}]}
    pools_file = tmp_path / "pools.yaml"
    pools_file.write_text(yaml.safe_dump(pools), encoding="utf-8")
    service = Service(Settings(listen="127.0.0.1:0", metrics_listen="", endpoint_picker=True,
                               endpoint_port=port, pools_file=str(pools_file)))
    stack = PickerStack(service, pods)
    try:
        await service.start()
        stack.envoy = procs.EnvoyProcess.from_config(
            lambda listen, admin, log: picker_config(listen, admin, str(log), service.grpc_port,
                                                     body_mode, subset),
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
