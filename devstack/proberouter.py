"""Loopback stand-in for the cluster DNS the idle probe relies on: ``python -m devstack.proberouter``.

In a cluster the service asks a member's llama.cpp ``/slots`` at
``http://{member}.{namespace}.svc:8080/slots`` (``--idle-probe-url``'s default). On loopback
every simulated member listens on a port of its own and no such name resolves, so a probe from
the local stack can never answer and a lost replica's requests would only be settled by
``--lost-replica-wait``. This process answers ``GET /{namespace}/{member}/slots`` by asking that
member's own server (``devstack.upstream``, which serves llama.cpp's ``/slots``) and passing
its answer through unchanged; a member it cannot reach is answered 502 (the probe then says
"cannot tell" and the swap waits, as on a cluster). ``GET /asked`` counts the probes per
member. Point the service at it with
``--idle-probe-url http://127.0.0.1:<port>/{namespace}/{member}/slots``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import aiohttp
from aiohttp import web

LOCALHOST = "127.0.0.1"
_MEMBERS = web.AppKey("members", dict)
_SESSION = web.AppKey("session", aiohttp.ClientSession)
_ASKED = web.AppKey("asked", dict)


def template(port: int) -> str:
    """The ``--idle-probe-url`` that names this router on ``port``."""
    return f"http://{LOCALHOST}:{port}/{{namespace}}/{{member}}/slots"


async def _slots(request: web.Request) -> web.Response:
    key = f"{request.match_info['namespace']}/{request.match_info['member']}"
    port = request.app[_MEMBERS].get(key)
    if port is None:
        return web.Response(status=404, text=f"no member {key}\n")
    asked = request.app[_ASKED]
    asked[key] = asked.get(key, 0) + 1
    try:
        async with request.app[_SESSION].get(f"http://{LOCALHOST}:{port}/slots",
                                             timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return web.Response(status=resp.status, body=await resp.read(),
                                content_type=resp.content_type)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return web.Response(status=502, text=f"{key}: {exc!r}\n")


async def serve(port: int, members: dict[str, int]) -> None:
    """Serve until SIGTERM or SIGINT."""
    app = web.Application()
    app[_MEMBERS] = members
    app[_ASKED] = {}
    app.router.add_get("/{namespace}/{member}/slots", _slots)
    app.router.add_get("/asked", lambda r: web.json_response(r.app[_ASKED]))
    app.router.add_get("/healthz", lambda _: web.Response(text="ok\n"))
    async with aiohttp.ClientSession() as session:
        app[_SESSION] = session
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, LOCALHOST, port).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    """Command line: --port P --member NAMESPACE/MEMBER=PORT ..."""
    parser = argparse.ArgumentParser(prog="python -m devstack.proberouter", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--member", action="append", default=[], metavar="NS/MEMBER=PORT",
                        type=lambda text: tuple(text.split("=", 1)))
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, {key: int(port) for key, port in args.member}))


if __name__ == "__main__":
    main()
