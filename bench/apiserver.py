"""The Kubernetes API emulator with a commit log: ``python -m bench.apiserver``.

The benchmarks need the exact moment a member's ``status.phase`` became Ready in the API, not
the moment some client noticed. So the emulator runs in this process and every committed write
of an InferenceService, Pod or ModelPool is appended, with ``time.time()`` taken at the commit,
to a JSON-lines file. The write happens inside the store's synchronous ``put``/``remove``, the
same step that hands the event to open watches, so no watcher can see a change before it is
logged. Each entry also names the API user whose request made the write (``user``, from the
kubeconfig token ``<user>-token``; ``--kubeconfig-for USER=PATH`` writes one such kubeconfig),
so in llmkube mode the service's trigger is told apart from the reconciler's scaling.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import time
from typing import Any, TextIO

from aiohttp import web

from devstack.kubeapi import KubeEmulator
from devstack.kubeapi.routes import caller
from devstack.signals import until_signalled

_LOGGED = ("inferenceservices", "pods", "modelpools")
# The API user of the request being served; each connection's handler runs in its own task,
# so a write reads the user of the request that made it.
_CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="")


def _entry(kind: str, event: str, obj: dict[str, Any]) -> dict[str, Any]:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    return {"t": time.time(), "kind": kind, "event": event, "name": meta.get("name"),
            "user": _CALLER.get(), "replicas": (obj.get("spec") or {}).get("replicas"),
            "phase": status.get("phase"), "resident": status.get("residentMember"),
            "pending": status.get("pendingMember"),
            "terminating": bool(meta.get("deletionTimestamp")),
            "labels": meta.get("labels") or {}}


class _CallerTagged:
    """The emulator's request handler, telling the commit log whose request is being served."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        token = _CALLER.set(caller(request.headers.get("Authorization")))
        try:
            return await self._inner(request)
        finally:
            _CALLER.reset(token)

    async def __aenter__(self) -> Any:
        return await self._inner.__aenter__()

    async def __aexit__(self, *exc_info: object) -> Any:
        return await self._inner.__aexit__(*exc_info)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def record_commits(emulator: KubeEmulator, out: TextIO) -> None:
    """Log every commit of the logged kinds to ``out`` (one JSON object per line)."""
    store = emulator.store
    put, remove = store.put, store.remove

    def logged_put(rt: Any, obj: dict[str, Any]) -> dict[str, Any]:
        stored = put(rt, obj)
        if rt.plural in _LOGGED:
            out.write(json.dumps(_entry(rt.plural, "put", stored)) + "\n")
            out.flush()
        return stored

    def logged_remove(rt: Any, namespace: str | None, name: str,
                      final: dict[str, Any] | None = None) -> dict[str, Any]:
        gone = remove(rt, namespace, name, final)
        if rt.plural in _LOGGED:
            out.write(json.dumps(_entry(rt.plural, "delete", gone)) + "\n")
            out.flush()
        return gone

    store.put = logged_put  # type: ignore[method-assign]
    store.remove = logged_remove  # type: ignore[method-assign]
    emulator.handler = _CallerTagged(emulator.handler)  # type: ignore[assignment]


async def serve(args: argparse.Namespace) -> None:
    """Start the emulator, write the kubeconfig, log commits until SIGTERM."""
    emulator = KubeEmulator(args.crds, namespaces=["default", *args.namespace])
    with open(args.commits, "a", encoding="utf-8") as out:
        record_commits(emulator, out)
        await emulator.start("127.0.0.1", args.port)
        for user, path in args.kubeconfig_for:
            emulator.write_kubeconfig(path, user=user)
        emulator.write_kubeconfig(args.kubeconfig_out)  # last: callers wait for this one
        try:
            await until_signalled()
        finally:
            await emulator.stop()


def main(argv: list[str] | None = None) -> None:
    """Command line: --port P --crds DIR --kubeconfig-out K --commits F [--namespace NS]
    [--kubeconfig-for USER=PATH]."""
    parser = argparse.ArgumentParser(prog="python -m bench.apiserver", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--crds", required=True, action="append",
                        help="a CRD file or directory (repeatable)")
    parser.add_argument("--kubeconfig-out", required=True)
    parser.add_argument("--commits", required=True)
    parser.add_argument("--namespace", action="append", default=[])
    parser.add_argument("--kubeconfig-for", action="append", default=[], metavar="USER=PATH",
                        type=lambda text: tuple(text.split("=", 1)),
                        help="also write a kubeconfig whose token names USER")
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
