"""The service with one measured change applied, for part 6 (hand-offs) only.

``MODELPOOL_BENCH_VARIANT`` lists the changes, comma-separated: ``grpc:<option>=<value>`` (a
gRPC server option added to, or replacing, the service's own). (The event loop is the
service's own ``--event-loop``.) Everything else is ``extproc serve`` unchanged, so a variant measures that one
change and nothing else. Not shipped behaviour: what wins moves into the service itself.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import grpc

VARIANT_ENV = "MODELPOOL_BENCH_VARIANT"


def _value(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text


def apply(spec: str) -> None:
    """Apply the changes ``spec`` names (see the module docstring)."""
    options: dict[str, int | str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        if item.startswith("grpc:"):
            key, _, value = item[len("grpc:"):].partition("=")
            options[key] = _value(value)
        else:
            raise SystemExit(f"{VARIANT_ENV}: unknown change {item!r}")
    if options:
        original = grpc.aio.server

        def server(*args: Any, **kwargs: Any) -> grpc.aio.Server:
            merged = dict(kwargs.pop("options", None) or ())
            merged.update(options)
            return original(*args, options=list(merged.items()), **kwargs)

        grpc.aio.server = server  # type: ignore[assignment]


def main() -> int:
    """``python -m bench.variant serve ...``: the service's CLI with the variant applied."""
    apply(os.environ.get(VARIANT_ENV, ""))
    from extproc.cli import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
