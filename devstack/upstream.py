"""A fake OpenAI-compatible model server (llama-server lookalike) that names itself in answers."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from aiohttp import web

from devstack.signals import until_signalled
from devstack.upstream_slots import Prefill, Slots

TOKEN_DELAY_ENV = "MODELPOOL_UPSTREAM_TOKEN_DELAY_MS"
# Members (comma-separated names) whose /slots always reads idle: a misfitting idle probe, the
# fault of LLMKube #1800 (e2e/test_e2e_probecheck.py).
DEFAULT_TOKEN_DELAY_MS = 20.0
DEFAULT_TOKENS = 16
MAX_TOKENS = 200  # bounds every generated answer (and so every stream's duration)
SERVED_BY = "x-served-by"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class UpstreamStats:
    """Request counters. `served` counts every finished request except /_upstream/*;
    `inference` and `in_flight` count /v1/* requests (finished / in progress)."""

    name: str
    served: int = 0
    inference: int = 0
    in_flight: int = 0
    by_path: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready snapshot."""
        return {
            "name": self.name,
            "served": self.served,
            "inference": self.inference,
            "in_flight": self.in_flight,
            "by_path": dict(self.by_path),
        }


STATS_KEY = web.AppKey("stats", UpstreamStats)


@dataclass
class UpstreamHandle:
    """A running in-process fake upstream."""

    name: str
    host: str
    port: int
    stats: UpstreamStats
    runner: web.AppRunner

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:18081."""
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Close the listener and in-flight connections."""
        await self.runner.cleanup()


def build_app(name: str, token_delay_ms: float | None = None,
              slots: int | None = None) -> web.Application:
    """The aiohttp application of one fake member called `name` (slots None: from the
    environment, devstack/upstream_slots.py; 0: one per request)."""
    if token_delay_ms is None:
        token_delay_ms = float(os.environ.get(TOKEN_DELAY_ENV, DEFAULT_TOKEN_DELAY_MS))
    stats = UpstreamStats(name)
    fake = _Fake(name, stats, token_delay_ms, Slots.from_env(slots, name))
    app = web.Application(middlewares=[fake.count], client_max_size=64 * 1024 * 1024)
    app[STATS_KEY] = stats
    app.on_response_prepare.append(fake.stamp)
    app.router.add_post("/v1/chat/completions", fake.chat)
    app.router.add_post("/v1/completions", fake.completions)
    app.router.add_post("/v1/embeddings", fake.embeddings)
    app.router.add_post("/v1/audio/transcriptions", fake.transcriptions)
    app.router.add_get("/v1/models", fake.models)
    app.router.add_get("/health", fake.health)
    fake.slots.add_routes(app)
    app.router.add_get("/_upstream/stats", fake.stats_view)
    return app


async def start_upstream(
    name: str,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token_delay_ms: float | None = None,
    slots: int | None = None,
) -> UpstreamHandle:
    """Serve a fake member on host:port (0 = any free port) in the running event loop."""
    app = build_app(name, token_delay_ms, slots)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # uvicorn's backlog (vLLM serves with it), not aiohttp's 128: a release sends every held
    # request at once, and an overflowing accept queue drops connections the client already
    # counts as open (Envoy's 503 UC) or SYNs (503 UF after its connect timeout)
    site = web.TCPSite(runner, host, port, backlog=2048)
    await site.start()
    bound_port = runner.addresses[0][1]
    return UpstreamHandle(name, host, bound_port, app[STATS_KEY], runner)


class _Fake:
    """Request handlers sharing one member's name, counters and timing."""

    def __init__(self, name: str, stats: UpstreamStats, token_delay_ms: float, slots: Slots):
        self.name = name
        self.stats = stats
        self.token_delay_ms = token_delay_ms
        self.slots = slots

    @web.middleware
    async def count(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/_upstream/"):
            return await handler(request)
        inference = request.path.startswith("/v1/")
        self.stats.in_flight += inference
        try:
            return await handler(request)
        finally:
            # Counted in finally: a client that hangs up mid-stream was still served.
            self.stats.in_flight -= inference
            self.stats.inference += inference
            self.stats.served += 1
            self.stats.by_path[request.path] = self.stats.by_path.get(request.path, 0) + 1

    async def stamp(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[SERVED_BY] = self.name

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        messages = body.get("messages") or []
        prompt = str(messages[-1].get("content", "")) if messages else ""
        tokens = self._tokens(prompt, body)
        model = body.get("model", self.name)
        # the slot's cache holds the whole conversation, as a chat template would render it
        context = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        prefill = await self.slots.prefill(context.split(), _slot_of(body))
        done = context.split() + tokens
        if body.get("stream"):
            return await self._stream(request, model, tokens, prefill, done, chat=True)
        await self.slots.release(prefill.slot, done)
        text = " ".join(tokens)
        return web.json_response(
            {
                **_envelope("chatcmpl", "chat.completion", model),
                "timings": prefill.timings(),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": _usage(prompt, tokens),
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        prompt = str(body.get("prompt", ""))
        tokens = self._tokens(prompt, body)
        model = body.get("model", self.name)
        prefill = await self.slots.prefill(prompt.split(), _slot_of(body))
        done = prompt.split() + tokens
        if body.get("stream"):
            return await self._stream(request, model, tokens, prefill, done, chat=False)
        await self.slots.release(prefill.slot, done)
        return web.json_response(
            {
                **_envelope("cmpl", "text_completion", model),
                "timings": prefill.timings(),
                "choices": [{"index": 0, "text": " ".join(tokens), "finish_reason": "stop"}],
                "usage": _usage(prompt, tokens),
            }
        )

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        inputs = body.get("input", "")
        inputs = [inputs] if isinstance(inputs, str) else list(inputs)
        data = [
            {"object": "embedding", "index": i, "embedding": _vector(f"{self.name}:{text}")}
            for i, text in enumerate(inputs)
        ]
        n = sum(len(str(text).split()) for text in inputs)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body.get("model", self.name),
                "usage": {"prompt_tokens": n, "total_tokens": n},
            }
        )

    async def transcriptions(self, request: web.Request) -> web.StreamResponse:
        if not request.content_type.startswith("multipart/"):
            return _error(400, "expected multipart/form-data")
        size, filename = 0, ""
        reader = await request.multipart()
        async for part in reader:
            if part.name == "file":
                filename = part.filename or ""
                while chunk := await part.read_chunk():
                    size += len(chunk)
            else:
                await part.release()
        if not filename and size == 0:
            return _error(400, "missing multipart field 'file'")
        return web.json_response({"text": f"[{self.name}] transcribed {size} bytes of {filename}"})

    async def models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.name, "object": "model", "owned_by": "devstack"}],
            }
        )

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    async def stats_view(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.stats.as_dict())

    def _tokens(self, prompt: str, body: dict[str, Any]) -> list[str]:
        requested = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_TOKENS
        try:
            n = max(1, min(int(requested), MAX_TOKENS))
        except (TypeError, ValueError):
            n = DEFAULT_TOKENS
        words = [f"[{self.name}]", "you", "said:"] + prompt.split()
        words += [f"t{i}" for i in range(len(words), n)]
        return words[:n]

    async def _stream(self, request: web.Request, model: str, tokens: list[str],
                      prefill: Prefill, done: list[str], chat: bool) -> web.StreamResponse:
        try:
            return await self._send_stream(request, model, tokens, prefill, chat)
        finally:
            await self.slots.release(prefill.slot, done)  # a hang-up frees the slot too

    async def _send_stream(self, request: web.Request, model: str, tokens: list[str],
                           prefill: Prefill, chat: bool) -> web.StreamResponse:
        delay = _delay_seconds(request, self.token_delay_ms)
        resp = web.StreamResponse(
            headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
        )
        await resp.prepare(request)
        kind = ("chatcmpl", "chat.completion.chunk") if chat else ("cmpl", "text_completion")
        env = _envelope(*kind, model)
        first = True
        async for token in _paced(tokens, delay):
            text = token if first else " " + token
            if chat:
                delta = {"role": "assistant", "content": text} if first else {"content": text}
                choice = {"index": 0, "delta": delta, "finish_reason": None}
            else:
                choice = {"index": 0, "text": text, "finish_reason": None}
            await _send_event(resp, {**env, "choices": [choice]})
            first = False
        final = {"index": 0, "finish_reason": "stop"}
        final.update({"delta": {}} if chat else {"text": ""})
        await _send_event(resp, {**env, "choices": [final], "timings": prefill.timings()})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _slot_of(body: dict[str, Any]) -> int | None:
    """The ``id_slot`` a request asks for (llama.cpp's field), if a valid one."""
    slot = body.get("id_slot")
    return slot if isinstance(slot, int) and not isinstance(slot, bool) and slot >= 0 else None


async def _paced(tokens: list[str], delay: float) -> AsyncIterator[str]:
    for token in tokens:
        if delay > 0:
            await asyncio.sleep(delay)
        yield token


async def _send_event(resp: web.StreamResponse, payload: dict[str, Any]) -> None:
    await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


def _delay_seconds(request: web.Request, default_ms: float) -> float:
    raw = request.query.get("delay_ms")
    try:
        ms = float(raw) if raw is not None else default_ms
    except ValueError:
        ms = default_ms
    # Bounded so a stream never outlives MAX_TOKENS seconds.
    return max(0.0, min(ms, 1000.0)) / 1000.0


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise web.HTTPBadRequest(
            text=json.dumps(_error_body("request body is not valid JSON")),
            content_type="application/json",
        ) from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=json.dumps(_error_body("request body must be a JSON object")),
            content_type="application/json",
        )
    return body


def _error(status: int, message: str) -> web.Response:
    return web.json_response(_error_body(message), status=status)


def _error_body(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": None}}


def _envelope(prefix: str, obj: str, model: str) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
        "object": obj,
        "created": int(time.time()),
        "model": model,
    }


def _usage(prompt: str, tokens: list[str]) -> dict[str, int]:
    p = len(prompt.split())
    return {"prompt_tokens": p, "completion_tokens": len(tokens), "total_tokens": p + len(tokens)}


def _vector(text: str, dims: int = 8) -> list[float]:
    # Deterministic per (member, input) so tests can compare answers.
    seed = sum(text.encode())
    return [round(((seed * (i + 7)) % 997) / 997.0, 6) for i in range(dims)]


async def _serve(args: argparse.Namespace) -> None:
    if args.standby:
        # Started ahead (the simulator's standby, devstack/simulator_server.py): everything is
        # imported, only the bind waits for the word, so a member "loads" in milliseconds, not
        # the ~0.4 s of a Python start. Its parent gone (EOF), there is nothing to wait for.
        if not (await asyncio.to_thread(sys.stdin.readline)).strip():
            return
    handle = await start_upstream(
        args.name, args.host, args.port, token_delay_ms=args.token_delay_ms, slots=args.slots
    )
    print(f"fake upstream {args.name} listening on {handle.url}", flush=True)
    await until_signalled()
    await handle.stop()


def main(argv: list[str] | None = None) -> None:
    """Command line: python -m devstack.upstream --name judge --port 18081."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-delay-ms", type=float, default=None)
    parser.add_argument("--slots", type=int, default=None,
                        help="llama.cpp's --parallel (default: $MODELPOOL_UPSTREAM_SLOTS, "
                             "else 0: one slot per request)")
    parser.add_argument("--standby", action="store_true",
                        help="start, then bind and serve only once a line arrives on stdin")
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
    # Stopped, its connections closed: the interpreter's own teardown (~0.1 s, 8 ms without)
    # would only lengthen every simulated unload past its configured delay.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
