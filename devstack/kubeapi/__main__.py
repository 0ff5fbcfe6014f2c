"""Run the emulator until SIGINT/SIGTERM: `python -m devstack.kubeapi --port 0 --crds crds/ --kubeconfig-out K`."""

from __future__ import annotations

import argparse
import asyncio

from devstack.kubeapi.server import KubeEmulator
from devstack.signals import until_signalled


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m devstack.kubeapi", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="listen address (loopback by default)")
    parser.add_argument("--port", type=int, default=0, help="listen port; 0 picks a free one")
    parser.add_argument("--crds", action="append", default=[], metavar="PATH",
                        help="a CRD file or a directory of them; repeatable")
    parser.add_argument("--kubeconfig-out", metavar="FILE", help="write a kubeconfig pointing at the emulator")
    parser.add_argument("--bookmark-interval", type=float, default=1.0, help="seconds between watch bookmarks")
    parser.add_argument("--namespace", action="append", default=None, metavar="NAME",
                        help="namespace to create at start (default: default); repeatable")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    """Start, announce the URL, and wait for a termination signal."""
    emulator = KubeEmulator(args.crds, namespaces=args.namespace or ["default"],
                            bookmark_interval=args.bookmark_interval)
    url = await emulator.start(args.host, args.port)
    if args.kubeconfig_out:
        emulator.write_kubeconfig(args.kubeconfig_out)
    print(url, flush=True)
    try:
        await until_signalled()
    finally:
        await emulator.stop()


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
