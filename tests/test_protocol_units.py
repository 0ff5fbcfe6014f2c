"""Unit tests of the protocol layer: request parsing, and the wire encoding of every answer.

Our answers are built with upb protobuf classes (fast); envoy-data-plane's independent
betterproto2 classes decode them here, so an encoding mistake cannot hide behind one
library agreeing with itself.
"""

from __future__ import annotations

import asyncio

import json
from datetime import timedelta

import pytest
from envoy_data_plane.envoy.config.core.v3 import HeaderValueOptionHeaderAppendAction
from envoy_data_plane.envoy.service.ext_proc.v3 import ProcessingResponse

from extproc.protocol import answers
from extproc.protocol.request import BadRequest, RequestHead, model_scan
from extproc.protocol.jsonscan import run_async

OVERWRITE = HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD


def model_named(head: RequestHead, body: bytes, max_bytes: int) -> str:
    """The model ``model_scan`` reads from ``body``, scanned to its end at once."""
    return asyncio.run(run_async(model_scan(head, body, max_bytes)))


def test_route_answer_sets_header_and_clears_route_cache():
    decoded = ProcessingResponse.parse(answers.route("x-modelpool-member", "judge.demo"))
    common = decoded.request_body.response
    assert common.clear_route_cache is True
    (option,) = common.header_mutation.set_headers
    assert option.header.key == "x-modelpool-member"
    assert option.header.raw_value == b"judge.demo"  # Envoy reads raw_value, not value
    assert option.append_action == OVERWRITE


def _said(raw: bytes) -> dict:
    """The modelpool dynamic metadata of an answer (decoded by an independent decoder)."""
    metadata = ProcessingResponse.parse(raw).dynamic_metadata.fields["modelpool"]
    return {k: v.string_value for k, v in metadata.struct_value.fields.items()}


def test_answers_say_why_in_their_metadata_only_when_there_is_something_to_say():
    assert _said(answers.route("x-modelpool-member", "judge.demo")) == {"member": "judge.demo"}
    assert _said(answers.released("x-modelpool-member", "coder.demo", 1.2345, "judge->coder")) \
        == {"member": "coder.demo", "held_ms": "1234", "swap": "judge->coder"}
    assert _said(answers.released("x-modelpool-member", "coder.demo", 0.5, "")) == {
        "member": "coder.demo", "held_ms": "500"}
    assert _said(answers.route("x-modelpool-member", "fallback.small.demo", fallback=True)) == {
        "member": "fallback.small.demo",
        "fallback": "fallback.small.demo; reason=pool_incumbent_busy"}


def test_error_answer_is_an_immediate_json_response_with_retry_after():
    raw = answers.error(503, "swap_budget_exceeded", "too slow", "model", (("retry-after", "7"),))
    immediate = ProcessingResponse.parse(raw).immediate_response
    assert int(immediate.status.code) == 503
    headers = {o.header.key: o.header.raw_value for o in immediate.headers.set_headers}
    assert headers == {"content-type": b"application/json", "retry-after": b"7"}
    assert json.loads(immediate.body) == {"error": {
        "message": "too slow", "type": "service_unavailable", "param": "model",
        "code": "swap_budget_exceeded"}}
    assert immediate.details == "modelpool_swap_budget_exceeded"


def test_a_shed_request_is_a_429_with_an_openai_rate_limit_error():
    # The Endpoint Picker Protocol's answer to a sheddable request dropped under load
    raw = answers.error(429, "request_shed", "shed", "model", (("retry-after", "3"),))
    immediate = ProcessingResponse.parse(raw).immediate_response
    assert int(immediate.status.code) == 429
    assert {o.header.key: o.header.raw_value for o in immediate.headers.set_headers} == \
        {"content-type": b"application/json", "retry-after": b"3"}
    assert json.loads(immediate.body) == {"error": {
        "message": "shed", "type": "requests", "param": "model", "code": "request_shed"}}


def test_override_timeout_and_continue_answers():
    assert ProcessingResponse.parse(answers.override_timeout(305.5)).override_message_timeout \
        == timedelta(seconds=305.5)
    assert ProcessingResponse.parse(answers.CONTINUE_HEADERS).request_headers is not None
    body = ProcessingResponse.parse(answers.CONTINUE_BODY).request_body
    assert body is not None and body.response.header_mutation is None


def _multipart(fields: list[tuple[str, bytes]], boundary: str = "b0und") -> bytes:
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
             + value + b"\r\n" for name, value in fields]
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


@pytest.mark.parametrize("content_type, body, model", [
    ("application/json", b'{"model": "judge", "messages": []}', "judge"),
    ("", b'{"model": "judge"}', "judge"),
    ("application/json; charset=utf-8", b'{"model": "\\u00e9t\\u00e9"}', "\u00e9t\u00e9"),
    ("multipart/form-data; boundary=b0und",
     _multipart([("file", b"RIFF...."), ("model", b"whisper-1")]), "whisper-1"),
    ('multipart/form-data; boundary="b0und"', _multipart([("model", b"coder")]), "coder"),
])
def test_model_is_read_from_json_and_multipart(content_type, body, model):
    assert model_named(RequestHead(content_type=content_type), body, 10_000) == model


@pytest.mark.parametrize("head, body, status, code", [
    (RequestHead(), b"", 400, "missing_body"),
    (RequestHead(), b"x" * 1001, 413, "request_too_large"),
    (RequestHead(content_encoding="gzip"), b"\x1f\x8b", 415, "unsupported_content_encoding"),
    (RequestHead(content_type="text/plain"), b"model=judge", 415, "unsupported_media_type"),
    (RequestHead(), b'{"model": "judge"', 400, "invalid_json"),
    (RequestHead(), b"[" * 50 + b"]" * 50, 400, "invalid_request"),
    (RequestHead(), b'"judge"', 400, "invalid_request"),
    (RequestHead(), b'{"model": null}', 400, "invalid_model"),
    (RequestHead(), b'{"model": ["judge"]}', 400, "invalid_model"),
    (RequestHead(), b'{"model": "a\\nb"}', 400, "invalid_model"),
    (RequestHead(), b'{"model": "' + b"m" * 300 + b'"}', 400, "invalid_model"),
    (RequestHead(content_type="multipart/form-data"), b"--x\r\n", 400, "invalid_multipart"),
    (RequestHead(content_type="multipart/form-data; boundary=zz"), b"no boundary here",
     400, "invalid_multipart"),
    (RequestHead(content_type="multipart/form-data; boundary=b0und"),
     _multipart([("file", b"x")]), 400, "missing_model"),
    (RequestHead(content_type="multipart/form-data; boundary=b0und"),
     b'--b0und\r\nContent-Disposition: form-data; name="model"\r\n\r\njud', 400,
     "invalid_multipart"),
])
def test_bad_bodies_raise_the_right_error(head, body, status, code):
    with pytest.raises(BadRequest) as caught:
        model_named(head, body, 1000)
    assert (caught.value.status, caught.value.code) == (status, code)
