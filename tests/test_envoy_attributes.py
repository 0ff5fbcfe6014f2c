"""What Envoy 1.40 sends when the request-headers message is skipped (real Envoy, recording stub).

The one-message mode of envoy/envoy.yaml rests on facts observed here, each pinned by a test:

* with ``request_header_mode: SKIP`` and ``request_body_mode: BUFFERED`` Envoy opens a stream
  and sends the buffered body as its only message, carrying ``request_attributes`` (method,
  path with query, request id, each named header) in ``attributes``; ``request.headers`` alone
  arrives as the useless string "CelMap value";
* the skipped headers pass the ext_proc filter at once, so without a filter holding them (the
  buffer filter) the router picks its route before the body is even sent: the fallback
  ``direct_response`` answers and no stream is opened at all;
* a body answer's header mutations are dropped ("headers aren't available"), so the decision
  reaches the route as dynamic metadata;
* bodyless and chunked requests take the two-message route: headers first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import aiohttp
import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from google.protobuf import json_format

from devstack import envoyconf
from devstack.fakemember import UpstreamHandle
from extproc.protocol import answers
from extproc.protocol.request import ATTRIBUTES, ATTRIBUTES_KEY

pytestmark = pytest.mark.envoy


@dataclass
class Recorder(ep_grpc.ExternalProcessorServicer):
    """Answers every request with the service's routing answer for coder.demo, and records each
    stream's messages (kind, attributes, body)."""

    streams: list[list[dict[str, Any]]] = field(default_factory=list)

    async def Process(self, requests: Any, context: Any) -> AsyncIterator[ep.ProcessingResponse]:
        """Record, then answer headers with CONTINUE and the body with the routing answer."""
        seen: list[dict[str, Any]] = []
        self.streams.append(seen)
        async for msg in requests:
            kind = msg.WhichOneof("request")
            attrs = msg.attributes.get(ATTRIBUTES_KEY)
            seen.append({"kind": kind,
                         "attributes": json_format.MessageToDict(attrs) if attrs else {},
                         "body": msg.request_body.body if kind == "request_body" else None})
            if kind == "request_headers":
                yield ep.ProcessingResponse.FromString(answers.CONTINUE_HEADERS)
            elif kind == "request_body":
                yield ep.ProcessingResponse.FromString(
                    answers.route("x-modelpool-member", "coder.demo"))


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, int]]:
    """The recording stub on a free loopback port: (recorder, port)."""
    stub = Recorder()
    server = grpc.aio.server()
    ep_grpc.add_ExternalProcessorServicer_to_server(stub, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield stub, port
    finally:
        await server.stop(None)


async def _send(url: str, method: str, body: Any, headers: dict[str, str]) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url, data=body, headers=headers) as resp:
            await resp.read()
            return resp.status, resp.headers.get("x-served-by", "")


async def _chunks(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _members(upstreams: dict[str, UpstreamHandle]) -> dict[str, int]:
    return {f"{name}.demo": handle.port for name, handle in upstreams.items()}


async def test_a_post_with_a_body_is_one_message_with_its_head_in_attributes(
        envoy_factory, recorder, upstreams: dict[str, UpstreamHandle]) -> None:
    stub, port = recorder
    envoy = envoy_factory(port, _members(upstreams))
    body = json.dumps({"model": "coder", "messages": []}).encode()
    status, served_by = await _send(
        f"{envoy.url}/v1/chat/completions?x=1", "POST", body,
        {"content-type": "application/json", "x-request-id": "rid-1",
         "x-modelpool-max-wait": "20s", "x-modelpool-member": "judge.demo"})
    assert (status, served_by) == (200, "coder")
    [stream] = stub.streams
    assert [m["kind"] for m in stream] == ["request_body"] and stream[0]["body"] == body
    assert stream[0]["attributes"] == {
        "request.method": "POST", "request.path": "/v1/chat/completions?x=1",
        "request.id": "rid-1", "request.headers['content-type']": "application/json",
        "request.headers['x-modelpool-max-wait']": "20s"}  # absent headers: no entry
    entry = envoy.wait_access_log(1)[-1]
    assert entry["upstream_cluster"] == "coder.demo" and entry["member"] == "coder.demo"


async def test_the_shipped_attributes_are_the_ones_the_service_reads() -> None:
    ext = next(f for f in _hcm(envoyconf.load_template())["http_filters"]
               if f["name"] == envoyconf.EXTPROC_FILTER)["typed_config"]
    assert ext["request_attributes"] == list(ATTRIBUTES)
    assert ext["metadata_options"]["receiving_namespaces"]["untyped"] == \
        [answers.METADATA_NAMESPACE]


@pytest.mark.parametrize("method,body,headers", [
    pytest.param("GET", None, {}, id="get"),
    pytest.param("POST", b"", {}, id="empty-post"),
    pytest.param("POST", "chunked", {}, id="chunked"),
])
async def test_other_requests_keep_the_headers_message(
        envoy_factory, recorder, upstreams: dict[str, UpstreamHandle], method: str, body: Any,
        headers: dict[str, str]) -> None:
    stub, port = recorder
    envoy = envoy_factory(port, _members(upstreams))
    if body == "chunked":
        body = _chunks(b'{"model":', b'"coder"}')  # no content-length: transfer-encoding
    await _send(f"{envoy.url}/v1/chat/completions", method, body, headers)
    [stream] = stub.streams
    assert stream[0]["kind"] == "request_headers"


async def test_without_the_buffer_filter_the_route_is_chosen_before_the_body(
        envoy_factory, recorder, upstreams: dict[str, UpstreamHandle], tmp_path) -> None:
    stub, port = recorder
    envoy = envoy_factory(port, _members(upstreams))
    envoy.stop()
    cfg = envoyconf.load_template(envoy.config_path)
    filters = _hcm(cfg)["http_filters"]
    filters[:] = [f for f in filters if f["name"] != envoyconf.BUFFER_FILTER]
    envoy.config_path.write_text(envoyconf.dump(cfg), encoding="utf-8")
    envoy.start()
    status, _ = await _send(f"{envoy.url}/v1/chat/completions", "POST", b'{"model":"coder"}',
                            {"content-type": "application/json"})
    assert status == 503 and stub.streams == []  # the fallback answered; no stream at all


async def test_a_body_answer_cannot_set_headers_when_they_were_skipped(
        envoy_factory, recorder, upstreams: dict[str, UpstreamHandle]) -> None:
    stub, port = recorder
    envoy = envoy_factory(port, _members(upstreams), log_level="debug")
    status, served_by = await _send(f"{envoy.url}/v1/chat/completions", "POST",
                                    b'{"model":"coder"}', {"content-type": "application/json"})
    assert (status, served_by) == (200, "coder")  # by the metadata route
    assert "headers aren't available" in (envoy.workdir / "envoy.log").read_text()


def _hcm(cfg: dict[str, Any]) -> dict[str, Any]:
    listener = cfg["static_resources"]["listeners"][0]
    return next(f for f in listener["filter_chains"][0]["filters"]
                if f["name"] == envoyconf.HCM_FILTER)["typed_config"]
