"""The Kubernetes API emulator with a commit log: ``python -m bench.apiserver``.

The benchmarks need the exact moment a member's ``status.phase`` became Ready in the API, not
the moment some client noticed. So the emulator runs in this process and every committed write
of an InferenceService or Pod is appended, with ``time.time()`` taken at the commit, to a
JSON-lines file. The write happens inside the store's synchronous ``put``/``remove``, the same
step that hands the event to open watches, so no watcher can see a change before it is logged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from typing import Any, TextIO

from devstack.kubeapi import KubeEmulator

_LOGGED = ("inferenceservices", "pods")


def _entry(kind: str, event: str, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {"t": time.time(), "kind": kind, "event": event, "name": meta.get("name"),
            "replicas": (obj.get("spec") or {}).get("replicas"),
            "phase": (obj.get("status") or {}).get("phase"),
            "terminating": bool(meta.get("deletionTimestamp")),
            "labels": meta.get("labels") or {}}


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


async def serve(args: argparse.Namespace) -> None:
    """Start the emulator, write the kubeconfig, log commits until SIGTERM."""
    emulator = KubeEmulator([args.crds], namespaces=["default", *args.namespace])
    with open(args.commits, "a", encoding="utf-8") as out:
        record_commits(emulator, out)
        await emulator.start("127.0.0.1", args.port)
        emulator.write_kubeconfig(args.kubeconfig_out)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            await stop.wait()
        finally:
            await emulator.stop()


def main(argv: list[str] | None = None) -> None:
    """Command line: --port P --crds DIR --kubeconfig-out K --commits F [--namespace NS]."""
    parser = argparse.ArgumentParser(prog="python -m bench.apiserver", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--crds", required=True)
    parser.add_argument("--kubeconfig-out", required=True)
    parser.add_argument("--commits", required=True)
    parser.add_argument("--namespace", action="append", default=[])
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
