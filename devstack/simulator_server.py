"""The fake upstream process a simulated member serves from (``python -m devstack.fakemember``).

Starting a Python process costs ~0.4 s here (mostly imports), which a benchmark's swap would
count as orchestration. So each member keeps one *standby* process started ahead
(``--standby``: imported, waiting on its stdin); a load hands the member's next server to it
with one line at the start of the load, and it binds and answers 503 while the simulated
model loads (as llama-server does), then /health 200 once a second line ends the load. The
member's server is still a process of its own (fault tests SIGKILL it); the next standby is
started right after the hand-over.

A fleet of members is another matter: a process per member plus its standby is hundreds of
Python processes for a hundred pools, whose imports and idle loops would take the cores the
service under measure needs. ``InProcessServer`` serves a member from the simulator's own
event loop instead: the same fake (its own listener on the member's port, 503 while loading,
``x-served-by``), no process to start or to SIGKILL apart from the simulator.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from devstack.procs import LOCALHOST, PROJECT_ROOT, ManagedProcess, port_is_free
from devstack.fakemember import STANDBY_LOAD, STANDBY_LOADED, STANDBY_SERVE, UpstreamHandle, \
    start_upstream
from devstack.fakemember_slots import SLOT_SAVE_PATH_ENV

START_TIMEOUT = 15.0
STOP_GRACE = 2.0


def _command(member: str, port: int, standby: bool, host: str) -> list[str]:
    return [sys.executable, "-m", "devstack.fakemember", "--name", member, "--host", host,
            "--port", str(port), *(["--standby"] if standby else [])]


def _env(log_dir: Path) -> dict[str, str]:
    """The members' environment: llama.cpp's ``--slot-save-path`` on a directory that outlives
    every pod (the stack's), unless the caller's environment names one."""
    return {SLOT_SAVE_PATH_ENV: str(log_dir / "slot-save"), **os.environ}


def start_standby(member: str, port: int, log_dir: Path, host: str = LOCALHOST) -> ManagedProcess:
    """A member's next server process, started now, serving only once ``UpstreamServer`` says."""
    return ManagedProcess(_command(member, port, True, host), log_dir / f"upstream-{member}.log",
                          env=_env(log_dir), cwd=PROJECT_ROOT, stdin_pipe=True).start()


class MemberServer:
    """One member's server on its loopback port: started, healthy, stopped."""

    #: seconds a start may take before it counts as failed
    start_timeout = START_TIMEOUT

    def __init__(self, member: str, port: int, host: str = LOCALHOST) -> None:
        self.member, self.port, self.host = member, port, host
        self.bound = False  # set going at the load's start (`begin_load`): it holds the port

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """True while the server is up (a dead one is a crashed container)."""
        raise NotImplementedError

    def begin_load(self) -> None:
        """The pod's container starts: servers that can bind and answer 503 while the model
        loads do so now (`start` then only ends the load); the others start in `start`."""

    async def start(self, timeout: float | None = None) -> None:
        """Return once the server's /health answers 200; raise if it cannot."""
        raise NotImplementedError

    async def stop(self, hard: bool = False) -> None:
        """Stop the server (at once when hard)."""
        raise NotImplementedError


class ProcessServer(MemberServer):
    """A member's server that is a process of its own: started, healthy, stopped."""

    def __init__(self, member: str, port: int, process: ManagedProcess,
                 host: str = LOCALHOST) -> None:
        super().__init__(member, port, host)
        self.process = process

    @property
    def running(self) -> bool:
        return self.process.running

    def _launch(self) -> None:
        """Set the process going."""
        self.process.start()

    async def start(self, timeout: float | None = None) -> None:
        """Start the process and return once its /health answers 200; raise if it cannot
        (it exits, or stays unhealthy: llama.cpp answers 503 while its model loads)."""
        timeout = self.start_timeout if timeout is None else timeout
        # a leftover listener would answer /health in our place and hide a failed start
        if not self.bound and not port_is_free(self.port, self.host):
            raise RuntimeError(f"port {self.port} for {self.member} is already in use")
        self._launch()
        deadline = time.monotonic() + timeout
        pause = 0.001  # a standby binds within a few ms: look often at first, then back off
        async with aiohttp.ClientSession() as session:
            while True:
                if not self.process.running:
                    raise RuntimeError(f"server of {self.member} exited during startup:\n"
                                       f"{self.process.log_tail()}")
                try:
                    async with session.get(f"{self.url}/health",
                                           timeout=aiohttp.ClientTimeout(total=1)) as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass  # not listening yet
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"server of {self.member} not healthy after {timeout}s")
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.05)

    async def stop(self, hard: bool = False) -> None:
        """Stop the process (SIGTERM, SIGKILL after a grace; at once when hard) and reap it."""
        if hard:
            await asyncio.to_thread(self.process.kill)
        else:
            await asyncio.to_thread(self.process.stop, STOP_GRACE)


@dataclass
class Loading:
    """A load under way: its pod, when it began (monotonic), the server bound for it."""

    pod: str
    began: float
    server: MemberServer | None


class UpstreamServer(ProcessServer):
    """One member's OpenAI-compatible fake server process (devstack/fakemember.py)."""

    def __init__(self, member: str, port: int, log_dir: Path,
                 standby: ManagedProcess | None = None, host: str = LOCALHOST) -> None:
        # a standby that died (killed, or its start failed) is no use: start one the slow way
        self._standby = standby is not None and standby.running
        super().__init__(member, port, standby if standby is not None and self._standby
                         else ManagedProcess(_command(member, port, False, host),
                                             log_dir / f"upstream-{member}.log",
                                             env=_env(log_dir), cwd=PROJECT_ROOT), host)

    def begin_load(self) -> None:
        # A standby binds at once and answers 503 until the load is over: when the load ends,
        # only a line and one /health separate it from Ready, and a standby still importing
        # (a loaded machine) catches up within the load delay instead of after it.
        if self._standby and port_is_free(self.port, self.host):
            self.process.tell(STANDBY_LOAD)
            self.bound = True

    def _launch(self) -> None:
        if self.bound:
            self.process.tell(STANDBY_LOADED)
        elif self._standby:
            self.process.tell(STANDBY_SERVE)
        else:
            self.process.start()


class InProcessServer(MemberServer):
    """One member's fake server on its own port, served from the simulator's event loop."""

    def __init__(self, member: str, port: int, log_dir: Path, host: str = LOCALHOST) -> None:
        super().__init__(member, port, host)
        # what a member process gets (``_env``), passed in: the environment is the caller's
        self._slot_save = _env(log_dir)[SLOT_SAVE_PATH_ENV]
        self._loaded = asyncio.Event()
        self._binding: asyncio.Task[UpstreamHandle] | None = None
        self._stopped = False

    @property
    def running(self) -> bool:
        return self._binding is not None and not self._stopped and (
            not self._binding.done() or self._binding.exception() is None)

    def begin_load(self) -> None:
        # bound now, answering 503 until `start` ends the load (as a standby does)
        self._binding = asyncio.get_running_loop().create_task(
            start_upstream(self.member, self.host, self.port, loaded=self._loaded,
                           slot_save=self._slot_save))
        self.bound = True

    async def start(self, timeout: float | None = None) -> None:
        """Bind (unless the load did) and end the load; raise if the port cannot be had."""
        if self._binding is None:
            self.begin_load()
        assert self._binding is not None
        self._loaded.set()
        await asyncio.wait_for(asyncio.shield(self._binding),
                               self.start_timeout if timeout is None else timeout)

    async def stop(self, hard: bool = False) -> None:
        """Close the listener and its connections (at once either way: nothing to kill)."""
        self._stopped = True
        binding, self._binding = self._binding, None
        if binding is None:
            return
        if not binding.done():
            binding.cancel()
        handle = (await asyncio.gather(binding, return_exceptions=True))[0]
        if isinstance(handle, UpstreamHandle):
            await handle.stop()
