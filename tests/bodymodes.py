"""The stacks of tests/test_body_modes.py: the service in either mode behind a real Envoy whose
ext_proc filter sends request bodies in one body mode, under one per-connection buffer limit,
with request trailers kept (HTTP/1.1 ``enable_trailers``) and sent to the ext_proc."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

import yaml

from devstack import envoyconf, envoyproc, procs
from devstack.picker_envoy import picker_config
from devstack.testkit import DEMO_POOLS, stop_front_to_back
from devstack.fakemember import SERVED_BY, UpstreamHandle, start_upstream
from extproc.app import Service
from extproc.platform.hostport import join
from extproc.settings import Settings
from tests.reliability.rawhttp import build_request, exchange

#: Envoy's own default per-connection buffer limit, and the inference extension chart's.
DEFAULT_LIMIT, GATEWAY_LIMIT = 1024 * 1024, 32 * 1024
PODS = {"judge": "127.0.0.2", "coder": "127.0.0.3"}


@dataclass(frozen=True)
class Config:
    """One Envoy: the service's mode, the filter's request body mode, the buffer limit."""

    picker: bool
    body_mode: str
    limit: int

    @property
    def id(self) -> str:
        """A test id: picker-STREAMED-32KiB."""
        return f"{'picker' if self.picker else 'default'}-{self.body_mode}-{self.limit // 1024}KiB"


@dataclass
class Outcome:
    """What the client got: a status, the member that served it, the error code, or a hang."""

    status: int | None
    served_by: str = ""
    code: str = ""
    seconds: float = 0.0

    def __str__(self) -> str:
        if self.status is None:
            return f"no answer ({self.code}) after {self.seconds:.1f} s"
        if self.served_by:
            return f"{self.status} from {self.served_by}"
        return f"{self.status} {self.code}"


def _limited(cfg: dict[str, Any], config: Config) -> dict[str, Any]:
    listener = cfg["static_resources"]["listeners"][0]
    if config.limit == DEFAULT_LIMIT:
        listener.pop("per_connection_buffer_limit_bytes", None)  # Envoy's default: 1 MiB
    else:
        listener["per_connection_buffer_limit_bytes"] = config.limit
    hcm = envoyconf._named(listener["filter_chains"][0]["filters"],
                           envoyconf.HCM_FILTER)["typed_config"]
    hcm["http_protocol_options"] = {"enable_trailers": True}
    ext = envoyconf._named(hcm["http_filters"], envoyconf.EXTPROC_FILTER)["typed_config"]
    ext["processing_mode"]["request_body_mode"] = config.body_mode
    ext["processing_mode"]["request_trailer_mode"] = "SEND"
    return cfg


def _standalone(config: Config, extproc_port: int, members: dict[str, int]):
    """envoy/envoy.yaml with the config's body mode on both of its ext_proc modes (the
    filter's, and the one-message route's override, which keeps its headers skipped)."""
    def build(listen_port: int, admin_port: int, access_log: Path) -> dict[str, Any]:
        cfg = envoyconf.render(listen_port, admin_port, extproc_port, members, str(access_log))
        hcm = envoyconf._named(cfg["static_resources"]["listeners"][0]["filter_chains"][0]
                               ["filters"], envoyconf.HCM_FILTER)["typed_config"]
        for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
            override = route.get("typed_per_filter_config", {}).get(envoyconf.EXTPROC_FILTER)
            if override:
                override["overrides"]["processing_mode"]["request_body_mode"] = config.body_mode
                override["overrides"]["processing_mode"]["request_trailer_mode"] = "SEND"
        return _limited(cfg, config)
    return build


class BodyStack:
    """Fake members, the service, one Envoy; ``post`` sends one request and says what came."""

    def __init__(self, config: Config, service: Service, pods: dict[str, UpstreamHandle],
                 envoy: envoyproc.EnvoyProcess) -> None:
        self.config, self.service, self.pods, self.envoy = config, service, pods, envoy

    async def post(self, model: str, size: int, trailers: bool,
                   timeout: float = 6.0) -> Outcome:
        """POST a chat request naming ``model`` whose body is about ``size`` bytes: with a
        content-length, or chunked (16 KiB chunks) and followed by a trailer."""
        body = json.dumps({"model": model, "max_tokens": 1, "messages": [
            {"role": "user", "content": "x" * size}]}).encode()
        raw = build_request("POST", "/v1/chat/completions", body,
                            [("content-type", "application/json")],
                            framing="chunked" if trailers else "length", chunk_size=16384,
                            trailers=(("x-checksum", "abc"),) if trailers else ())
        started = time.monotonic()
        try:
            reply = await exchange(self.envoy.listen_port, raw, timeout=timeout)
        except TimeoutError:
            return Outcome(None, code="hang", seconds=time.monotonic() - started)
        seconds = time.monotonic() - started
        if reply is None:
            return Outcome(None, code="reset before any answer", seconds=seconds)
        try:
            code = json.loads(reply.body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = reply.body[:60].decode("latin-1")
        return Outcome(reply.status, reply.headers.get(SERVED_BY, ""), code, seconds)


async def start(config: Config, workdir: Path, **options: Any) -> AsyncIterator[BodyStack]:
    """The stack for ``config``; ``options``: more settings for the service."""
    pods: dict[str, UpstreamHandle] = {}
    envoy = None
    port = procs.free_port()
    if config.picker:
        for name, host in PODS.items():
            pods[name] = await start_upstream(name, host, port, token_delay_ms=0)
        pools = {"pools": [{"namespace": "demo", "name": "shared-gpu", "members": list(PODS),
                            "default": "judge", "swapBudget": "5s",
                            "endpoints": {m: [join(h, port)] for m, h in PODS.items()}}]}
        # as an operator would: the picker's STREAMED limit is the gateway's buffer limit
        settings = Settings(listen="127.0.0.1:0", metrics_listen="", endpoint_picker=True,
                            endpoint_port=port, pools_file=str(workdir / "pools.yaml"),
                            **{"streamed_body_limit": config.limit, **options})
        (workdir / "pools.yaml").write_text(yaml.safe_dump(pools), encoding="utf-8")
    else:
        for name in PODS:
            pods[name] = await start_upstream(name, token_delay_ms=0)
        (workdir / "pools.yaml").write_text(DEMO_POOLS, encoding="utf-8")
        settings = Settings(listen="127.0.0.1:0", metrics_listen="",
                            pools_file=str(workdir / "pools.yaml"), **options)
    service = Service(settings)
    try:
        await service.start()
        if config.picker:
            def build(listen: int, admin: int, log: Path) -> dict[str, Any]:
                return _limited(picker_config(listen, admin, str(log), service.grpc_port,
                                              config.body_mode), config)
        else:
            build = _standalone(config, service.grpc_port,
                                {f"{name}.demo": pod.port for name, pod in pods.items()})
        envoy = envoyproc.EnvoyProcess.from_config(build, workdir=workdir / "envoy").start()
        yield BodyStack(config, service, pods, envoy)
    finally:
        await stop_front_to_back(envoy, service.stop(), settings.shutdown_grace, pods.values())
