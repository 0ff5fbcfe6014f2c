"""Starting the processes a benchmark needs: fake members and ext_proc services."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from devstack import envoyconf
from devstack.envoyproc import envoy_binary
from devstack.procs import LOCALHOST, PROJECT_ROOT, ManagedProcess, free_port, wait_for_http, \
    wait_for_port

from . import envoycfg

#: The shipped service, and the same logic on envoy-data-plane classes (the codec baseline).
EXTPROC = "extproc"
BASELINE = "bench.edp_service"


def start_upstream(workdir: Path, name: str, port: int) -> ManagedProcess:
    """A fake OpenAI member (devstack.fakemember) on ``port``, once it answers /health."""
    proc = ManagedProcess([sys.executable, "-m", "devstack.fakemember", "--name", name,
                           "--port", str(port)], workdir / f"upstream-{name}.log",
                          cwd=PROJECT_ROOT).start()
    wait_for_http(f"http://{LOCALHOST}:{port}/health", timeout=20, expect_status=200)
    return proc


class ExtProc:
    """One ext_proc process (the service, or the baseline) on free loopback ports."""

    def __init__(self, workdir: Path, label: str, module: str, *args: str) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.process = ManagedProcess(
            [sys.executable, "-m", module, "serve", "--listen", f"{LOCALHOST}:{self.port}",
             "--metrics-listen", f"{LOCALHOST}:{self.metrics_port}", *args],
            workdir / f"{label}.log", cwd=PROJECT_ROOT)

    @property
    def pid(self) -> int:
        """Process id (after start)."""
        assert self.process.pid is not None
        return self.process.pid

    def start(self) -> "ExtProc":
        """Start and wait until the gRPC and metrics ports answer; stopped again if not."""
        self.process.start()
        try:
            wait_for_port(LOCALHOST, self.port, timeout=30)
            wait_for_http(f"http://{LOCALHOST}:{self.metrics_port}/healthz", timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a short grace."""
        self.process.stop(grace=5)

    def pools(self) -> list[dict]:
        """The service's /debug/pools view."""
        url = f"http://{LOCALHOST}:{self.metrics_port}/debug/pools"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())

    def metric(self, name: str) -> float:
        """Sum of every sample of one metric family on /metrics (0 when absent)."""
        url = f"http://{LOCALHOST}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and (line[len(name)] in " {"))


def post(url: str, body: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str]]:
    """One POST; (status, headers). HTTP errors are returned, not raised."""
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            resp.read()
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        exc.read()
        exc.close()
        return exc.code, dict(exc.headers)


def wait_routed(url: str, body: bytes, timeout: float = 30.0) -> None:
    """Block until a POST through Envoy answers 200 (the member is resident and reachable)."""
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        status, _ = post(url, body)
        if status == 200:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer 200 within {timeout}s (last {status})")


def start_sink(workdir: Path) -> tuple[ManagedProcess, int]:
    """A bare Envoy answering 200 to everything, on a free port: (process, port)."""
    port, admin = free_port(), free_port()
    config = workdir / "sink.yaml"
    config.write_text(envoyconf.dump(envoycfg.sink_config(port, admin)), encoding="utf-8")
    proc = ManagedProcess([str(envoy_binary()), "-c", str(config), "--base-id", str(admin),
                           "--concurrency", "1", "--log-level", "warn"],
                          workdir / "sink.log").start()
    wait_for_http(f"http://{LOCALHOST}:{admin}/ready", timeout=20, expect_status=200)
    return proc, port
