"""`python -m devstack demo [--smoke]`: the local stack for humans (see docs/demo.md)."""

from __future__ import annotations

import argparse
import sys

from devstack.simulator import RUNTIMES
from devstack.simulator_kube import duration_arg
from devstack.stack import ACTUATIONS
from devstack.stack_demo import REPLICAS_ENV, default_actuation, default_endpoint_picker, \
    default_replicas, default_runtime, default_workdir, run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m devstack",
                                     description="The modelpool-extproc local stack.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="run the demo stack until Ctrl-C",
                          description="Emulated Kubernetes API, simulated members, the ext_proc "
                          "and Envoy on loopback, with the sample pool demo/shared-gpu.")
    demo.add_argument("--smoke", action="store_true",
                      help="send one request per member and one SSE stream, print the swaps, "
                      "stop everything and exit (0 when every answer came from the right member)")
    demo.add_argument("--port", type=int, default=None,
                      help="Envoy listener port (default: $MODELPOOL_DEMO_PORT or 8080)")
    demo.add_argument("--load-delay", type=duration_arg, default=None,
                      help="how long a simulated member takes to load (default 3s; 0 with "
                      "llama.cpp members, whose load is real)")
    demo.add_argument("--runtime", choices=RUNTIMES, default=default_runtime(),
                      help="the members' servers: fake (the simulator's, a process per pod), "
                      "fake-in-process (the same, all in the simulator's process) or llama.cpp "
                      "(llama.cpp's own llama-server on a generated tiny model; `make "
                      "llama-server` builds it) (default: $MODELPOOL_DEMO_RUNTIME or fake)")
    demo.add_argument("--unload-delay", type=duration_arg, default=1.0,
                      help="how long a simulated member takes to unload (default 1s)")
    demo.add_argument("--actuation", choices=ACTUATIONS, default=default_actuation(),
                      help="own: the ext_proc moves the slot; llmkube: a stand-in for LLMKube's "
                      "ModelPool reconciler does, the ext_proc only triggers "
                      "(default: $MODELPOOL_DEMO_ACTUATION or own)")
    demo.add_argument("--replicas", default=default_replicas(),
                      help="ext_proc replicas behind the one Envoy (default: "
                      f"${REPLICAS_ENV} or 1)")
    demo.add_argument("--endpoint-picker", action=argparse.BooleanOptionalAction,
                      default=default_endpoint_picker(),
                      help="run behind an InferencePool-style gateway: the ext_proc as its "
                      "endpoint picker, members' pods on 127.0.0.2, 127.0.0.3, ... (default: "
                      "$MODELPOOL_DEMO_ENDPOINT_PICKER or off; one replica)")
    demo.add_argument("--workdir", default=str(default_workdir()),
                      help="kubeconfig, logs and records (default: .demo, or $MODELPOOL_DEMO_DIR)")
    args = parser.parse_args(argv)
    if args.command == "demo" and args.actuation not in ACTUATIONS:  # from the environment
        parser.error(f"MODELPOOL_DEMO_ACTUATION must be one of {', '.join(ACTUATIONS)}")
    if args.command == "demo" and args.runtime not in RUNTIMES:
        parser.error(f"MODELPOOL_DEMO_RUNTIME must be one of {', '.join(RUNTIMES)}")
    if args.command == "demo":
        # parsed here rather than by type=int, so a bad $MODELPOOL_DEMO_REPLICAS is reported too
        args.replicas = _replicas(parser, args.replicas)
    return args


def _replicas(parser: argparse.ArgumentParser, value: str) -> int:
    """A replica count of at least 1, or a usage error naming where it came from."""
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        parser.error(f"--replicas (or ${REPLICAS_ENV}) must be a whole number >= 1: {value!r}")
    return count


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
