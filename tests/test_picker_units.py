"""The endpoint picker's pure parts: which pod it picks, the subset hint it reads, and the
wire encoding of its answers (decoded by envoy-data-plane's independent classes)."""

from __future__ import annotations

from collections import Counter

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy_data_plane.envoy.service.ext_proc.v3 import ProcessingResponse
from hypothesis import given
from hypothesis import strategies as st

from extproc.protocol import picker

ENDPOINTS = st.lists(st.sampled_from([f"10.0.0.{i}:8080" for i in range(1, 7)]), unique=True)


@given(ready=ENDPOINTS, allowed=st.none() | ENDPOINTS.map(tuple), picks=st.integers(1, 30))
def test_a_pick_is_ready_and_allowed_and_spread_evenly(ready, allowed, picks) -> None:
    chooser = picker.EndpointPicker(lambda key, member: ready)
    chosen = [chooser.pick("pool", "m", allowed) for _ in range(picks)]
    eligible = [e for e in ready if allowed is None or e in allowed]
    if not eligible:
        assert chosen == [None] * picks  # 503 no_endpoint, never a guess
        return
    assert set(chosen) <= set(eligible)
    counts = Counter(chosen)
    assert max(counts.values()) - min(counts.get(e, 0) for e in eligible) <= 1  # round robin


def _hinted(value: object) -> ep.ProcessingRequest:
    message = ep.ProcessingRequest()
    message.metadata_context.filter_metadata[picker.SUBSET_NAMESPACE].update(
        {picker.SUBSET_KEY: value})
    return message


def test_the_subset_hint_is_read_as_the_protocol_writes_it() -> None:
    assert picker.subset_hint(ep.ProcessingRequest()) is None  # no hint: any pod
    assert picker.subset_hint(_hinted(["10.0.0.1:8080", "10.0.0.2:8080"])) == \
        ("10.0.0.1:8080", "10.0.0.2:8080")
    assert picker.subset_hint(_hinted("10.0.0.1:8080, 10.0.0.3:8080")) == \
        ("10.0.0.1:8080", "10.0.0.3:8080")
    assert picker.subset_hint(_hinted([])) == ()  # an empty hint allows nothing
    assert picker.subset_hint(_hinted(7)) == ()


def _header_and_metadata(common, response) -> tuple[str, str]:
    (option,) = common.header_mutation.set_headers
    assert option.header.key == picker.DESTINATION
    return (option.header.raw_value.decode(),
            response.dynamic_metadata.fields[picker.LB_NAMESPACE].struct_value
            .fields[picker.DESTINATION].string_value)


def test_the_pick_goes_in_the_header_and_the_metadata_alike() -> None:
    body = ProcessingResponse.parse(picker.route_body("10.0.0.1:8080"))
    assert _header_and_metadata(body.request_body.response, body) == ("10.0.0.1:8080",) * 2
    headers = ProcessingResponse.parse(picker.route_headers("10.0.0.2:8080"))
    assert _header_and_metadata(headers.request_headers.response, headers) == \
        ("10.0.0.2:8080",) * 2
    # unpicked (passed through, or before the body): a client's own value is removed
    stripped = ProcessingResponse.parse(picker.route_headers(None))
    assert stripped.request_headers.response.header_mutation.remove_headers == \
        [picker.DESTINATION]


def test_full_duplex_bodies_are_handed_back_whole() -> None:
    sent = ProcessingResponse.parse(picker.streamed_body(b'{"model":"m"}', True))
    streamed = sent.request_body.response.body_mutation.streamed_response
    assert (streamed.body, streamed.end_of_stream) == (b'{"model":"m"}', True)
    chunk = ep.ProcessingRequest(response_body=ep.HttpBody(body=b"data: x\n\n"))
    echoed = ProcessingResponse.parse(picker.follow_up(chunk, duplex_response=True))
    assert echoed.response_body.response.body_mutation.streamed_response.body == b"data: x\n\n"
    assert picker.follow_up(ep.ProcessingRequest(observability_mode=True,
                                                 response_headers=ep.HttpHeaders()),
                            False) is None
