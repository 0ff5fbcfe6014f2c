"""Part 4: a resident hit makes no Kubernetes API call.

With member ``a`` resident, 10,000 requests for it go through Envoy (h2load over HTTP/1.1,
32 connections). The emulator's request record is emptied before and read after; every entry
that is not a watch is an API call made while serving. The ext_proc's own call counter is read
too, as a cross-check that names the caller.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from . import tools
from .cluster import ClusterStack, body_for

KUBE_CALLS = "modelpool_extproc_kube_requests_total"


def run(workdir: Path, requests: int = 10_000, connections: int = 32) -> dict[str, Any]:
    """Serve ``requests`` resident hits and count the API requests made meanwhile."""
    stack = ClusterStack(workdir, load_delay=0.2, unload_delay=0.1)
    try:
        stack.start()
        body = workdir / "body-a.json"
        body.write_bytes(body_for("a"))
        time.sleep(1.0)  # let the warm-up's status writes land before the window opens
        stack.reset_api_record()
        own_before = stack.extproc.metric(KUBE_CALLS)
        args = tools.h2load_args(stack.url, body, requests, connections, 1, h1=True)
        out = subprocess.run(args, capture_output=True, text=True, timeout=300, check=True)
        result = tools.parse_h2load(out.stdout, " ".join(args))
        time.sleep(0.5)  # anything the run triggered has had time to reach the API
        record = stack.api_requests()
        own_after = stack.extproc.metric(KUBE_CALLS)
    finally:
        stack.stop()
    calls = [r for r in record if r["verb"] != "watch"]
    figures = {
        "requests": requests, "succeeded": result.succeeded, "failed": result.failed,
        "api_calls": len(calls),
        "api_calls_by_kind": dict(Counter(f"{r['verb']} {r['resource']}"
                                          + (f"/{r['subresource']}" if r["subresource"] else "")
                                          for r in calls)),
        "watch_requests": len(record) - len(calls),
        "extproc_counted_calls": int(own_after - own_before),
        "command": result.command,
    }
    print(f"  hotpath: {figures}", flush=True)
    return figures
