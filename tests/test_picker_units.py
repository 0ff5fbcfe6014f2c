"""The endpoint picker's pure parts: which pod it picks, the subset hint it reads, and the
wire encoding of its answers (decoded by envoy-data-plane's independent classes)."""

from __future__ import annotations

from collections import Counter

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy_data_plane.envoy.service.ext_proc.v3 import ProcessingResponse
from hypothesis import given
from hypothesis import strategies as st

from extproc.platform import hostport
from extproc.platform.static import load_endpoints, load_specs
from extproc.protocol import picker
from extproc.settings import ConfigError, Settings
from extproc.settings_sources import from_sources

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
    # IPv6 entries are read in the picker's own spelling; a bare v6:port is no endpoint
    assert picker.subset_hint(_hinted(["[FD00:0:0::5]:8000", "fd00::6:8000"])) == \
        ("[fd00::5]:8000", "fd00::6:8000")


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
    # the headers answer before the body's decision: a client's own value is removed
    stripped = ProcessingResponse.parse(picker.STRIP_HEADERS)
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


@pytest.mark.parametrize("environ, complaint", [
    ({"MODELPOOL_ENDPOINT_PICKER": "true", "MODELPOOL_PASSTHROUGH_UNKNOWN": "true"},
     "exclude each other"),
    ({"MODELPOOL_ENDPOINT_PORT": "70000"}, "bad endpoint_port 70000")])
def test_unusable_picker_settings_are_one_line(environ, complaint) -> None:
    with pytest.raises(ConfigError, match=complaint):
        from_sources(environ=environ)


def test_a_pools_file_behind_the_picker_names_every_members_pods(tmp_path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - {name: p, members: [a, b], endpoints: {a: [127.0.0.2:80]}}\n")
    picking = Settings(endpoint_picker=True, pools_file=str(pools))
    specs = load_specs(pools, picking)
    with pytest.raises(ConfigError, match=r"needs endpoints for \['b'\]"):
        load_endpoints(pools, specs, picking)
    assert load_endpoints(pools, specs, Settings())[specs[0].key] == \
        {"a": ("127.0.0.2:80",), "b": ()}
    pools.write_text("pools:\n  - {name: p, members: [a], endpoints: {a: [judge:80]}}\n")
    with pytest.raises(ConfigError, match="'judge:80' is not ip:port"):
        load_endpoints(pools, load_specs(pools, picking), picking)


@pytest.mark.parametrize("ip, port, endpoint", [
    ("10.0.0.5", 8000, "10.0.0.5:8000"), ("fd00:10:244::5", 8000, "[fd00:10:244::5]:8000"),
    ("::1", 19611, "[::1]:19611"), ("FD00:0:0::5", 80, "[fd00::5]:80")])
def test_an_endpoint_is_joined_as_go_does_with_ipv6_in_brackets(ip, port, endpoint) -> None:
    assert hostport.join(ip, port) == endpoint
    assert hostport.parse(endpoint) == endpoint  # and read back as written


@pytest.mark.parametrize("text, complaint", [
    ("fd00:10:244::5:8000", r"bracket an IPv6 address, as \[fd00:10:244::5\]:8000"),
    ("::1:19611", r"bracket an IPv6 address, as \[::1\]:19611"),
    ("[127.0.0.1]:80", "only an IPv6 address takes brackets"),
    ("[::1]", "is not ip:port"), ("[::1]:0", "is not ip:port"), ("judge:80", "is not ip:port"),
    ("10.0.0.1:65536", "is not ip:port"), ("10.0.0.1", "is not ip:port")])
def test_an_endpoint_that_envoy_could_not_parse_is_refused_in_one_line(text, complaint) -> None:
    with pytest.raises(ValueError, match=complaint) as refused:
        hostport.parse(text)
    assert "\n" not in str(refused.value)


def test_a_pools_file_names_ipv6_pods_in_brackets(tmp_path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text('pools:\n  - {name: p, members: [a], '
                     'endpoints: {a: ["[::1]:19611", "[FD00::5]:80", 127.0.0.2:80]}}\n')
    picking = Settings(endpoint_picker=True, pools_file=str(pools))
    specs = load_specs(pools, picking)
    assert load_endpoints(pools, specs, picking)[specs[0].key] == \
        {"a": ("[::1]:19611", "[fd00::5]:80", "127.0.0.2:80")}
    pools.write_text('pools:\n  - {name: p, members: [a], endpoints: {a: ["::1:19611"]}}\n')
    with pytest.raises(ConfigError, match=r"pools\[0\]\.endpoints\.a: '::1:19611' is not "
                                          r"ip:port: bracket an IPv6 address, as \[::1\]:19611"):
        load_endpoints(pools, specs, picking)


def _served(value: str | None) -> ep.ProcessingRequest:
    message = ep.ProcessingRequest(response_headers=ep.HttpHeaders())
    if value is not None:
        message.metadata_context.filter_metadata[picker.LB_NAMESPACE].update(
            {picker.SERVED_KEY: value})
    return message


@pytest.mark.parametrize("reported, picked, elsewhere", [
    ("10.0.0.5:8000", "10.0.0.5:8000", None),  # served where picked
    ("10.0.0.6:8000", "10.0.0.5:8000", "10.0.0.6:8000"),  # the gateway's retry moved it
    ("[FD00:0::5]:80", "[fd00::5]:80", None),  # one address, two spellings
    (None, "10.0.0.5:8000", None),  # a gateway that does not report it
    ("10.0.0.6:8000", "", None),  # nothing picked (an answer of our own)
])
def test_the_served_endpoint_is_compared_with_the_pick(reported, picked, elsewhere) -> None:
    assert picker.served_elsewhere(_served(reported), picked) == elsewhere
