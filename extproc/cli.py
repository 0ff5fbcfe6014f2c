"""The ``modelpool-extproc`` command line."""

from __future__ import annotations

import argparse
import asyncio
import sys

from . import settings as settings_module

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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = sub.add_parser(
        "serve", help="run the ext_proc gRPC service", description=DESCRIPTION,
        epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    settings_module.add_arguments(serve)
    check = sub.add_parser(
        "check-config", help="print the effective settings as JSON and validate a pools file, "
        "then exit", description="Resolve the settings exactly as `serve` would (flags, then "
        "environment, then defaults), validate them and any --pools-file, print them as JSON "
        "and exit: 0 when they are usable.", epilog=SERVE_EPILOG.split("\n\nexamples:")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    settings_module.add_arguments(check)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    settings = settings_module.from_sources(args)
    from . import logs

    logs.configure(settings.log_level)
    if args.command == "check-config":
        import dataclasses
        import json

        from .platform.static import load_specs

        if settings.pools_file:
            load_specs(settings.pools_file, settings)
        print(json.dumps(dataclasses.asdict(settings), indent=2))
        return 0
    from .app import serve

    try:
        asyncio.run(serve(settings))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
