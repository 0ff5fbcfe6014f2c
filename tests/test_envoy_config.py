"""envoy/envoy.yaml: validity, rendering, and Envoy's behaviour with it (real Envoy, stub ext_proc)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from devstack import envoyconf, procs
from devstack.testkit import posted
from devstack.fakemember import UpstreamHandle

pytestmark = pytest.mark.envoy

ROUTER_UNAVAILABLE = {
    "error": {
        "message": "model pool router unavailable; retry later",
        "type": "service_unavailable",
        "code": "router_unavailable",
    }
}


def validate(envoy_bin: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """Run `envoy --mode validate` on a config file."""
    return subprocess.run(
        [str(envoy_bin), "--mode", "validate", "-c", str(config), "--log-level", "warn"],
        capture_output=True, text=True, timeout=60,
    )


def test_template_validates(envoy_bin: Path) -> None:
    result = validate(envoy_bin, envoyconf.TEMPLATE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_config_validates(envoy_bin: Path, tmp_path: Path) -> None:
    path = envoyconf.write(
        tmp_path / "envoy.yaml", 18180, 19190, 19002, {"a.team": 18181, "b.team": 18182},
        str(tmp_path / "access.log"), ext_proc={"failure_mode_allow": False},
    )
    result = validate(envoy_bin, path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_render_rewrites_ports_and_members() -> None:
    cfg = envoyconf.render(1111, 2222, 3333, {"x.ns": 4444}, "/tmp/a.log")
    text = envoyconf.dump(cfg)
    assert cfg["admin"]["address"]["socket_address"]["port_value"] == 2222
    listener = cfg["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"]["port_value"] == 1111
    clusters = {c["name"]: c for c in cfg["static_resources"]["clusters"]}
    assert sorted(clusters) == ["extproc", "x.ns"]
    assert "3333" in json.dumps(clusters["extproc"]) and "4444" in json.dumps(clusters["x.ns"])
    assert "/tmp/a.log" in text and "/dev/stdout" not in text
    for port in (8080, 9901, 9002, 18081):
        assert f"port_value: {port}\n" not in text
    with pytest.raises(ValueError):
        envoyconf.render(1, 2, 3, {})


def test_template_settings_that_parking_depends_on() -> None:
    cfg = envoyconf.load_template()
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["stream_idle_timeout"] == "600s" and hcm["request_timeout"] == "0s"
    ext = hcm["http_filters"][0]["typed_config"]
    assert ext["failure_mode_allow"] is True and ext["max_message_timeout"] == "600s"
    assert ext["processing_mode"]["request_body_mode"] == "BUFFERED"
    member_route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert member_route["timeout"] == "0s" and member_route["cluster_header"] == "x-modelpool-member"


async def test_routes_to_decided_member_despite_spoofed_header(
    envoy_factory, stub_extproc, upstreams: dict[str, UpstreamHandle]
) -> None:
    members = {f"{n}.demo": h.port for n, h in upstreams.items()}
    envoy = envoy_factory(stub_extproc.port, members)
    async with posted(
        f"{envoy.url}/v1/chat/completions",
        json={"model": "coder", "messages": [{"role": "user", "content": "x"}]},
        headers={"x-modelpool-member": "judge.demo", "x-request-id": "req-1"},
    ) as resp:
        assert resp.status == 200
        assert resp.headers["x-served-by"] == "coder"
    assert upstreams["judge"].stats.served == 0 and upstreams["coder"].stats.served == 1
    entry = envoy.wait_access_log(1)[-1]
    assert entry["upstream_cluster"] == "coder.demo" and entry["member"] == "coder.demo"
    assert entry["request_id"] == "req-1" and entry["status"] == 200
    assert entry["method"] == "POST" and entry["path"] == "/v1/chat/completions"
    assert {"details", "flags", "duration_ms"} <= entry.keys()


async def test_sse_passes_through_complete(
    envoy_factory, stub_extproc, upstreams: dict[str, UpstreamHandle]
) -> None:
    envoy = envoy_factory(stub_extproc.port, {"judge.demo": upstreams["judge"].port})
    async with posted(
        f"{envoy.url}/v1/chat/completions?delay_ms=5",
        json={"model": "judge", "stream": True, "max_tokens": 50, "messages": []},
    ) as resp:
        assert resp.status == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [raw.decode().strip() async for raw in resp.content]
    events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) == 50 + 2


@pytest.mark.parametrize("status", [503, 504, 413, 400])
async def test_immediate_responses_are_not_rewritten(
    envoy_factory, stub_extproc, upstreams: dict[str, UpstreamHandle], status: int
) -> None:
    # local_reply_config must leave the service's own answers byte for byte.
    body = b'{"error":{"message":"held too long","type":"service_unavailable","code":"swap_budget"}}'
    stub_extproc.immediate = (status, body, {"retry-after": "7", "content-type": "application/json"})
    envoy = envoy_factory(stub_extproc.port, {"judge.demo": upstreams["judge"].port})
    async with posted(f"{envoy.url}/v1/chat/completions", json={"model": "judge"}) as resp:
        assert resp.status == status
        assert resp.headers["retry-after"] == "7"
        assert resp.headers["content-type"] == "application/json"
        assert await resp.read() == body
    assert upstreams["judge"].stats.served == 0
    assert envoy.wait_access_log(1)[-1]["details"] == "stub_immediate"


async def test_member_down_is_json_503(envoy_factory, stub_extproc) -> None:
    envoy = envoy_factory(stub_extproc.port, {"judge.demo": procs.free_port()})
    async with posted(f"{envoy.url}/v1/chat/completions", json={"model": "judge"}) as resp:
        assert resp.status == 503
        assert resp.headers["content-type"] == "application/json"
        body = await resp.json()
    assert body["error"]["type"] == "server_error"
    assert body["error"]["code"].startswith("upstream_reset_before_response_started")
    # a connect failure, tried once more (the virtual host's retry policy), then given up
    assert envoy.wait_access_log(1)[-1]["flags"] == "URX,UF"


async def test_oversized_body_is_json_413(
    envoy_factory, stub_extproc, upstreams: dict[str, UpstreamHandle]
) -> None:
    envoy = envoy_factory(stub_extproc.port, {"judge.demo": upstreams["judge"].port})
    async with posted(
        f"{envoy.url}/v1/audio/transcriptions", data=b"a" * (33 * 1024 * 1024)
    ) as resp:
        assert resp.status == 413
        assert resp.headers["content-type"] == "application/json"
        body = await resp.json()
    assert body["error"]["code"] == "payload_too_large"
    assert upstreams["judge"].stats.served == 0
