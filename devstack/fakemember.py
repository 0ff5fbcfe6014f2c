"""A fake OpenAI-compatible model server (llama-server lookalike) that names itself in answers.

What it shares with llama.cpp's server (checked against the real one by
tests/test_fakemember_vs_llamacpp.py): ``/health``; a loading phase (``load_ms``, default none)
during which every endpoint answers 503 ``Loading model`` as llama.cpp does while its model
loads; the slot API, ``/metrics`` and prompt cache of devstack/fakemember_slots.py; a completion's
``timings`` (llama.cpp's keys) and ``usage`` (``prompt_tokens`` counts the cached tokens too,
``prompt_tokens_details.cached_tokens`` says how many); with ``stream_options.include_usage``
a last chunk with no choices carrying ``usage`` and ``timings``.

Where it differs on purpose (tests pin it, and the service reads none of it): it says
``x-served-by`` (llama.cpp names its ``--alias`` as ``model`` instead, and this fake echoes the
request's ``model``); ``finish_reason`` is always ``stop`` (llama.cpp: ``length`` at
``max_tokens``); a body that is no JSON is a 400 (llama.cpp: 500 ``server_error``); the first
chunk of a chat stream carries content with its role (llama.cpp sends the role alone first).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiohttp import web

from devstack.signals import until_signalled
from devstack.fakemember_answers import Answers  # what it answers on /v1; here, the server
from devstack.fakemember_slots import Slots

TOKEN_DELAY_ENV = "MODELPOOL_UPSTREAM_TOKEN_DELAY_MS"
# how long the fake "loads its model" once listening (llama.cpp's 503 phase); default none
LOAD_MS_ENV = "MODELPOOL_UPSTREAM_LOAD_MS"
DEFAULT_TOKEN_DELAY_MS = 20.0
SERVED_BY = "x-served-by"
# The simulator's words to a standby (--standby) on its stdin: bind and serve now; bind now
# and answer 503 while the model loads; the load is over.
STANDBY_SERVE, STANDBY_LOAD, STANDBY_LOADED = "serve", "load", "loaded"

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
              slots: int | None = None, load_ms: float | None = None,
              loaded: asyncio.Event | None = None,
              slot_save: str | None = None) -> web.Application:
    """The aiohttp application of one fake member called `name` (slots None: from the
    environment, devstack/fakemember_slots.py; 0: one per request; load_ms None: from the
    environment, default 0: loaded at once; with `loaded`, the load lasts until it is set,
    then load_ms more; slot_save: its --slot-save-path, None: from the environment)."""
    if token_delay_ms is None:
        token_delay_ms = float(os.environ.get(TOKEN_DELAY_ENV, DEFAULT_TOKEN_DELAY_MS))
    if load_ms is None:
        load_ms = float(os.environ.get(LOAD_MS_ENV, "") or 0)
    stats = UpstreamStats(name)
    fake = _Server(name, stats, load_ms, loaded)
    answers = Answers(name, token_delay_ms, Slots.from_env(slots, name, slot_save))
    app = web.Application(middlewares=[fake.loading, fake.count],
                          client_max_size=64 * 1024 * 1024)
    app.on_startup.append(fake.start_loading)
    app.on_cleanup.append(fake.stop_loading)
    app[STATS_KEY] = stats
    app.on_response_prepare.append(fake.stamp)
    app.router.add_post("/v1/chat/completions", answers.chat)
    app.router.add_post("/v1/completions", answers.completions)
    app.router.add_post("/v1/embeddings", answers.embeddings)
    app.router.add_post("/v1/audio/transcriptions", answers.transcriptions)
    app.router.add_get("/v1/models", answers.models)
    app.router.add_get("/health", fake.health)
    answers.slots.add_routes(app)
    app.router.add_get("/_upstream/stats", fake.stats_view)
    return app


async def start_upstream(
    name: str,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token_delay_ms: float | None = None,
    slots: int | None = None,
    load_ms: float | None = None,
    loaded: asyncio.Event | None = None,
    slot_save: str | None = None,
) -> UpstreamHandle:
    """Serve a fake member on host:port (0 = any free port) in the running event loop; with
    ``load_ms`` it answers 503 that long first, as llama.cpp does while its model loads."""
    app = build_app(name, token_delay_ms, slots, load_ms, loaded, slot_save)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # uvicorn's backlog (vLLM serves with it), not aiohttp's 128: a release sends every held
    # request at once, and an overflowing accept queue drops connections the client already
    # counts as open (Envoy's 503 UC) or SYNs (503 UF after its connect timeout)
    site = web.TCPSite(runner, host, port, backlog=2048)
    await site.start()
    bound_port = runner.addresses[0][1]
    return UpstreamHandle(name, host, bound_port, app[STATS_KEY], runner)


class _Server:
    """One member's server state: its loading phase, its counters, its name on every answer."""

    def __init__(self, name: str, stats: UpstreamStats, load_ms: float = 0.0,
                 told: asyncio.Event | None = None):
        self.name = name
        self.stats = stats
        self.load_ms = max(0.0, load_ms)
        self.loaded = asyncio.Event()
        self._told = told  # set by whoever plays the load (the simulator's standby word)
        self._load: asyncio.Task[None] | None = None

    async def start_loading(self, app: web.Application) -> None:
        if self.load_ms <= 0 and self._told is None:
            self.loaded.set()
            return
        # the listener is up before the load ends, as llama-server binds before loading
        self._load = asyncio.get_running_loop().create_task(self._finish_load())

    async def _finish_load(self) -> None:
        if self._told is not None:
            await self._told.wait()
        await asyncio.sleep(self.load_ms / 1000)
        self.loaded.set()

    async def stop_loading(self, app: web.Application) -> None:
        if self._load is not None:
            self._load.cancel()

    @web.middleware
    async def loading(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # llama.cpp's middleware_server_state: every endpoint, /health, /slots and /metrics
        # included, answers this until the model is loaded (they become ready together)
        if self.loaded.is_set() or request.path.startswith("/_upstream/"):
            return await handler(request)
        return web.json_response({"error": {"message": "Loading model",
                                            "type": "unavailable_error", "code": 503}},
                                 status=503)

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

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    async def stats_view(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.stats.as_dict())


async def _serve(args: argparse.Namespace) -> None:
    loaded: asyncio.Event | None = None
    if args.standby:
        # Started ahead (the simulator's standby, devstack/simulator_server.py): everything is
        # imported, only the bind waits for the word, so a member "loads" in milliseconds, not
        # the ~0.4 s of a Python start. Its parent gone (EOF), there is nothing to wait for.
        word = (await asyncio.to_thread(sys.stdin.readline)).strip()
        if not word:
            return
        if word == STANDBY_LOAD:
            # the pod's container started: bind now and answer 503 until the simulator says
            # the (simulated) load is over, as llama-server binds before it loads its model
            loaded = asyncio.Event()
    handle = await start_upstream(
        args.name, args.host, args.port, token_delay_ms=args.token_delay_ms, slots=args.slots,
        load_ms=args.load_ms, loaded=loaded,
    )
    print(f"fake upstream {args.name} listening on {handle.url}", flush=True)
    if loaded is not None:
        waiting = asyncio.create_task(_loaded_when_told(loaded))
    await until_signalled()
    if loaded is not None:
        waiting.cancel()
    await handle.stop()


async def _loaded_when_told(loaded: asyncio.Event) -> None:
    """Set ``loaded`` once the simulator writes its second line (EOF: the parent is gone)."""
    if (await asyncio.to_thread(sys.stdin.readline)).strip() == STANDBY_LOADED:
        loaded.set()


def main(argv: list[str] | None = None) -> None:
    """Command line: python -m devstack.fakemember --name judge --port 18081."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-delay-ms", type=float, default=None)
    parser.add_argument("--slots", type=int, default=None,
                        help="llama.cpp's --parallel (default: $MODELPOOL_UPSTREAM_SLOTS, "
                             "else 0: one slot per request)")
    parser.add_argument("--load-ms", type=float, default=None,
                        help="answer 503 'Loading model' this long once listening, as "
                             f"llama-server does while loading (default: ${LOAD_MS_ENV}, else 0)")
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
