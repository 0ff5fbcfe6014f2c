"""The ``modelpool-extproc`` command line."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Coroutine
from importlib import metadata
from pathlib import Path
from typing import Any

from . import settings as settings_module
from . import settings_sources
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
    settings_sources.add_arguments(serve)
    check = sub.add_parser(
        "check-config", help="print the effective settings as JSON and validate a pools file, "
        "then exit", description="Resolve the settings exactly as `serve` would (flags, then "
        "environment, then defaults), validate them and any --pools-file, print them as JSON "
        "and exit: 0 when they are usable.", epilog=SERVE_EPILOG.split("\n\nexamples:")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    settings_sources.add_arguments(check)
    check.add_argument("--routes", action="append", default=[], metavar="FILE",
                       help="rendered manifests (kustomize or helm output, an Envoy config); "
                       "warn about every member of the pools that no route in them matches")
    check.add_argument("--modelpool", action="append", default=[], metavar="FILE",
                       help="ModelPool YAML whose members --routes must route (besides the "
                       "--pools-file pools)")
    _add_render_routes(sub)
    return parser


RENDER_EPILOG = """\
Each member's Service is named after its InferenceService (--service-template changes that)
on port 8080 (--port; per member: annotation modelpool.inference.llmkube.dev/member-ports on
the ModelPool, e.g. "large=8000"). The routing-header value is --route-template.

examples:
  modelpool-extproc render-routes deploy/examples/shared-gpu.yaml > httproute.yaml
  modelpool-extproc render-routes pool.yaml --format helm-values > pools-values.yaml
  modelpool-extproc render-routes pool.yaml --format envoy-clusters
  modelpool-extproc render-routes pool.yaml --format inferencepool  # any InferencePool gateway
"""


def _add_render_routes(sub: Any) -> None:
    from .routes import DEFAULT_PORT, FORMATS

    render = sub.add_parser(
        "render-routes", help="print the routes (HTTPRoute, chart values or standalone Envoy "
        "clusters) a ModelPool's members need", epilog=RENDER_EPILOG,
        description="Render one route per member of each ModelPool in the given files, so "
        "a member added to a pool is never left unroutable.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    render.add_argument("modelpools", nargs="+", metavar="MODELPOOL_YAML")
    render.add_argument("--format", choices=FORMATS, default="httproute")
    render.add_argument("--gateway", default="modelpool", help="the Gateway the HTTPRoute "
                        "attaches to (default: modelpool)")
    render.add_argument("--service-template", default="{member}", metavar="TEMPLATE",
                        help="member Service name; placeholders {member}, {pool}, {namespace}")
    render.add_argument("--port", type=int, default=DEFAULT_PORT, help="member Service port")
    for name in ("route_header", "route_template"):
        field = next(f for f in dataclasses.fields(settings_module.Settings) if f.name == name)
        render.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                            metavar=field.metadata["metavar"], help=field.metadata["help"])


def run(main: Coroutine[Any, Any, None], event_loop: str) -> None:
    """Run ``main`` to completion on the chosen event loop (``--event-loop``)."""
    if event_loop == "uvloop":
        import uvloop

        # A loop factory, not a global policy: nothing else in the process changes loops.
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main)
        return
    asyncio.run(main)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script: 0 on success, 2 for unusable configuration."""
    args = build_parser().parse_args(argv)
    try:
        settings = settings_sources.from_sources(args)
        from . import logs

        logs.configure(settings.log_level)
        if args.command == "render-routes":
            from .routes import load_pools, render

            try:
                print(render(load_pools(args.modelpools), settings, args.format,
                             gateway=args.gateway, service_template=args.service_template,
                             default_port=args.port), end="")
            except (OSError, ValueError) as exc:
                raise ConfigError(f"render-routes: {exc}") from None
            return 0
        if args.command == "check-config":
            specs = asyncio.run(_check(settings))
            print(json.dumps(dataclasses.asdict(settings), indent=2))
            if args.routes:
                _warn_unrouted(args, settings, specs)
            return 0
        from .app import serve

        run(serve(settings), settings.event_loop)
    except ConfigError as exc:
        print(f"modelpool-extproc: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


async def _check(settings: Settings) -> list[Any]:
    """Load what ``serve`` would load from files (pools file, kubeconfig); ConfigError if bad.

    Returns the static pools (none in cluster mode) for the routes check.
    """
    if settings.pools_file:
        from .platform.static import load_specs

        return load_specs(settings.pools_file, settings)
    if settings.kubeconfig:
        from .platform.kube.client import make_api_client

        client = await make_api_client(settings)
        await client.close()
    return []


def _warn_unrouted(args: argparse.Namespace, settings: settings_module.Settings,
                   specs: list[Any]) -> None:
    """One warning on stderr per pool member that no route in ``--routes`` matches (per pool
    without an InferencePool, with ``--endpoint-picker``)."""
    import yaml

    from .routes import MemberRoute, load_pools, member_routes, routed_values, unrouted

    expected = [MemberRoute(s.key.name, s.key.namespace, m, settings.route_template.format(
        member=m, pool=s.key.name, namespace=s.key.namespace), m, 0)
        for s in specs for m in s.members]
    if args.modelpool:
        expected += [r for pool in load_pools(args.modelpool)
                     for r in member_routes(pool, settings)]
    if settings.endpoint_picker:  # no member routes: one InferencePool per pool instead
        from .inference_pool import unpooled

        rendered = [d for path in args.routes for d in yaml.safe_load_all(
            Path(path).read_text()) if isinstance(d, dict)]
        for warning in unpooled(sorted({(r.namespace, r.pool) for r in expected}), rendered):
            print(f"warning: {warning}", file=sys.stderr)
        return
    routed = set().union(*(routed_values(path) for path in args.routes))
    for route in unrouted(expected, routed):
        print(f"warning: member {route.member} of pool {route.namespace}/{route.pool} has no "
              f"route in {', '.join(args.routes)} (no HTTPRoute rule or Envoy cluster for "
              f"{settings.route_header}: {route.value}); requests for it cannot reach it",
              file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
