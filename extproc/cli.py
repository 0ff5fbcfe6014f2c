"""The ``modelpool-extproc`` command line."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from importlib import metadata

from . import settings as settings_module
from .settings import ConfigError, Settings

DESCRIPTION = """\
Envoy external-processing (ext_proc) service that lets several LLMs share one GPU slot
behind one OpenAI-compatible endpoint. Envoy sends each request's headers and buffered body;
the service reads the body's "model", makes that ModelPool member resident if it is not
(holding the request while it swaps members), then tells Envoy where to route.
"""

SERVE_EPILOG = """\
Every flag can also be set by an environment variable (shown in brackets); a flag wins.
Durations accept 300, 300s, 5m, 1h30m, 250ms.

examples:
  modelpool-extproc serve --namespace llm                 # watch ModelPools in namespace llm
  modelpool-extproc serve --pools-file pools.yaml          # static pools, no Kubernetes
  modelpool-extproc serve --listen 0.0.0.0:9002 --tls-cert tls.crt --tls-key tls.key
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with its subcommands."""
    parser = argparse.ArgumentParser(
        prog="modelpool-extproc", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {metadata.version('modelpool-extproc')}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = sub.add_parser(
        "serve", help="run the ext_proc gRPC service", description=DESCRIPTION,
        epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    settings_module.add_arguments(serve)
    check = sub.add_parser(
        "check-config", help="print the effective settings as JSON and validate a pools file "
        "or kubeconfig, then exit", description="Resolve the settings exactly as `serve` would "
        "(flags, then environment, then defaults), validate them, any --pools-file and any "
        "--kubeconfig, print them as JSON and exit: 0 when they are usable, 2 (with one line "
        "saying what is wrong) when they are not.", epilog=SERVE_EPILOG.split("\n\nexamples:")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    settings_module.add_arguments(check)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script: 0 on success, 2 for unusable configuration."""
    args = build_parser().parse_args(argv)
    try:
        settings = settings_module.from_sources(args)
        from . import logs

        logs.configure(settings.log_level)
        if args.command == "check-config":
            asyncio.run(_check(settings))
            print(json.dumps(dataclasses.asdict(settings), indent=2))
            return 0
        from .app import serve

        asyncio.run(serve(settings))
    except ConfigError as exc:
        print(f"modelpool-extproc: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


async def _check(settings: Settings) -> None:
    """Load what ``serve`` would load from files (pools file, kubeconfig); ConfigError if bad."""
    if settings.pools_file:
        from .platform.static import load_specs

        load_specs(settings.pools_file, settings)
    elif settings.kubeconfig:
        from .platform.kube.client import make_api_client

        client = await make_api_client(settings)
        await client.close()


if __name__ == "__main__":
    sys.exit(main())
