"""A BUFFERED request body followed by trailers, through the real Envoy, in both modes.

When trailers follow, Envoy sends the one buffered body message with ``end_of_stream: false``
and the trailers only after that message is answered (or never, with ``request_trailer_mode:
SKIP``). The service must take the buffered message as the whole body: waiting for an end
that never comes held every such request until Envoy's message timeout. The client sends
its trailers in HTTP/1.1 chunked encoding (Envoy keeps them with ``enable_trailers``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devstack import envoyconf, envoyproc
from devstack.testkit import DEMO_POOLS
from extproc.app import Service
from extproc.settings import Settings
from tests.reliability.rawhttp import build_request, send

pytestmark = pytest.mark.envoy


def _config(extproc_port: int, members: dict[str, int], trailer_mode: str):
    """Envoy's standalone config, HTTP/1.1 trailers kept, request trailers sent or skipped."""
    def build(listen_port: int, admin_port: int, access_log: Path) -> dict:
        cfg = envoyconf.render(listen_port, admin_port, extproc_port, members, str(access_log))
        hcm = envoyconf._named(cfg["static_resources"]["listeners"][0]["filter_chains"][0]
                               ["filters"], envoyconf.HCM_FILTER)["typed_config"]
        hcm["http_protocol_options"] = {"enable_trailers": True}
        ext = envoyconf._named(hcm["http_filters"], envoyconf.EXTPROC_FILTER)["typed_config"]
        ext["processing_mode"]["request_trailer_mode"] = trailer_mode
        return cfg
    return build


@pytest.mark.parametrize("trailer_mode", ["SEND", "SKIP"])
async def test_a_buffered_body_with_trailers_is_routed(tmp_path: Path, upstreams, envoy_bin,
                                                       trailer_mode: str) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(DEMO_POOLS)
    service = Service(Settings(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0",
                               pools_file=str(pools)))
    await service.start()
    members = {f"{name}.demo": handle.port for name, handle in upstreams.items()}
    envoy = envoyproc.EnvoyProcess.from_config(_config(service.grpc_port, members, trailer_mode),
                                           workdir=tmp_path / "envoy").start()
    try:
        for model in ("judge", "coder"):  # a resident hit, then a swap
            body = json.dumps({"model": model, "messages": [{"role": "user",
                                                             "content": "hi" * 500}]}).encode()
            raw = build_request("POST", "/v1/chat/completions", body,
                                [("content-type", "application/json")], framing="chunked",
                                chunk_size=256, trailers=(("x-checksum", "abc"),))
            reply = await send(envoy.listen_port, raw, timeout=8.0)
            assert reply.status == 200, reply
            assert reply.headers["x-served-by"] == model
    finally:
        envoy.stop()
        await service.stop()
