"""Loopback stand-in for the cluster DNS the idle probe relies on: ``python -m devstack.proberouter``.

In a cluster the service asks a member's llama.cpp ``/slots`` at
``http://{member}.{namespace}.svc:8080/slots`` (``--idle-probe-url``'s default). On loopback
every simulated member listens on a port of its own and no such name resolves, so a probe from
the local stack can never answer and a lost replica's requests would only be settled by
``--lost-replica-wait``. This process answers ``GET /{namespace}/{member}/slots`` by asking that
member's own server (``devstack.fakemember``, which serves llama.cpp's ``/slots``) and passing
its answer through unchanged; a member it cannot reach is answered 502 (the probe then says
"cannot tell" and the swap waits, as on a cluster). ``GET /asked`` counts the probes per
member. ``POST /{namespace}/{member}/slots/{id}?action=save|restore|erase`` passes llama.cpp's
slot save and restore through the same way (prompt-cache carry-over). Point the service at it
with ``--idle-probe-url http://127.0.0.1:<port>/{namespace}/{member}/slots``.

It is also an HTTP proxy for the one name LLMKube's reconciler dials,
``http://<member>.<namespace>.svc.cluster.local:<port>/slots`` (the LLMKube stand-in's
``--probe-proxy``): a proxied request's Host names the member, so it is answered the same way.
``GET /asked-hosts`` lists, per member, the ``host:port`` each proxied probe asked for, so a
test can tell which port the caller picked.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

from devstack.signals import until_signalled

LOCALHOST = "127.0.0.1"
_MEMBERS = web.AppKey("members", dict)
_SESSION = web.AppKey("session", aiohttp.ClientSession)
_ASKED = web.AppKey("asked", dict)
_HOSTS = web.AppKey("hosts", dict)


def template(port: int) -> str:
    """The ``--idle-probe-url`` that names this router on ``port``."""
    return f"http://{LOCALHOST}:{port}/{{namespace}}/{{member}}/slots"


CLUSTER_DOMAIN = ".svc.cluster.local"


async def _slots(request: web.Request) -> web.Response:
    key = f"{request.match_info['namespace']}/{request.match_info['member']}"
    return await _forward(request, key)


async def _slot_action(request: web.Request) -> web.Response:
    """``POST /{namespace}/{member}/slots/{id}?action=...``: llama.cpp's slot save/restore."""
    key = f"{request.match_info['namespace']}/{request.match_info['member']}"
    port = request.app[_MEMBERS].get(key)
    if port is None:
        return web.Response(status=404, text=f"no member {key}\n")
    url = f"http://{LOCALHOST}:{port}/slots/{request.match_info['slot']}?{request.query_string}"
    try:
        async with request.app[_SESSION].post(url, data=await request.read(),
                                              headers={"content-type": "application/json"},
                                              timeout=aiohttp.ClientTimeout(total=30)) as resp:
            return web.Response(status=resp.status, body=await resp.read(),
                                content_type=resp.content_type)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return web.Response(status=502, text=f"{key}: {exc!r}\n")


async def _proxied_slots(request: web.Request) -> web.Response:
    """A proxied ``GET http://<member>.<ns>.svc.cluster.local:<port>/slots``: DNS's part."""
    host = request.headers.get("Host", "")  # aiohttp's request.host drops the port
    name = host.rsplit(":", 1)[0]
    if not name.endswith(CLUSTER_DOMAIN) or name.count(".") != 4:
        return web.Response(status=502, text=f"{host}: not a cluster Service name\n")
    member, namespace = name[:-len(CLUSTER_DOMAIN)].split(".")
    key = f"{namespace}/{member}"
    request.app[_HOSTS].setdefault(key, []).append(host)
    return await _forward(request, key)


async def _forward(request: web.Request, key: str) -> web.Response:
    port = request.app[_MEMBERS].get(key)  # a port on 127.0.0.1, or "host:port"
    if port is None:
        return web.Response(status=404, text=f"no member {key}\n")
    asked = request.app[_ASKED]
    asked[key] = asked.get(key, 0) + 1
    try:
        address = port if isinstance(port, str) else f"{LOCALHOST}:{port}"
        async with request.app[_SESSION].get(f"http://{address}/slots",
                                             timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return web.Response(status=resp.status, body=await resp.read(),
                                content_type=resp.content_type)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return web.Response(status=502, text=f"{key}: {exc!r}\n")


class ProbeRouter:
    """The router in this process (tests): ``await start()``, ``await stop()``."""

    def __init__(self, port: int, members: dict[str, int | str]) -> None:
        self.port = port
        self.app = web.Application()
        self.app[_MEMBERS] = members
        self.app[_ASKED] = {}
        self.app[_HOSTS] = {}
        self.app.router.add_get("/{namespace}/{member}/slots", _slots)
        self.app.router.add_post("/{namespace}/{member}/slots/{slot}", _slot_action)
        self.app.router.add_get("/slots", _proxied_slots)
        self.app.router.add_get("/asked", _asked)
        self.app.router.add_get("/asked-hosts", _asked_hosts)
        self.app.router.add_get("/healthz", _healthz)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the proxy address (``--probe-proxy``)."""
        return f"http://{LOCALHOST}:{self.port}"

    @property
    def hosts(self) -> dict[str, list[str]]:
        """``namespace/member`` -> every ``host:port`` a proxied probe asked for, in order."""
        return self.app[_HOSTS]

    async def start(self) -> None:
        """Listen on 127.0.0.1:port."""
        self.app[_SESSION] = aiohttp.ClientSession()
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, LOCALHOST, self.port).start()

    async def stop(self) -> None:
        """Stop listening and close the upstream session."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            await self.app[_SESSION].close()


async def serve(port: int, members: dict[str, int | str]) -> None:
    """Serve until SIGTERM or SIGINT."""
    router = ProbeRouter(port, members)
    await router.start()
    try:
        await until_signalled()
    finally:
        await router.stop()


def main(argv: list[str] | None = None) -> None:
    """Command line: --port P --member NAMESPACE/MEMBER=PORT (or =HOST:PORT) ..."""
    parser = argparse.ArgumentParser(prog="python -m devstack.proberouter", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--member", action="append", default=[], metavar="NS/MEMBER=PORT",
                        type=lambda text: tuple(text.split("=", 1)))
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, {key: int(port) if port.isdigit() else port
                                  for key, port in args.member}))


async def _asked(request: web.Request) -> web.Response:
    """Which members' probes were asked, in order (tests read it)."""
    return web.json_response(request.app[_ASKED])


async def _asked_hosts(request: web.Request) -> web.Response:
    """Which cluster DNS names were dialled through the proxy, in order."""
    return web.json_response(request.app[_HOSTS])


async def _healthz(_: web.Request) -> web.Response:
    """Up."""
    return web.Response(text="ok\n")


if __name__ == "__main__":
    main()

