"""Process helpers for tests and the local stack: ports, readiness waits, managed processes."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

from devstack import testkit

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LOCALHOST = "127.0.0.1"


def tool_binary(env: str, default: str, missing: str) -> Path:
    """An executable: the path in $`env`, else `default` under the project root.

    FileNotFoundError (with `missing`, which says how to get it) when it is not there.
    """
    configured = os.environ.get(env)
    path = Path(configured) if configured else PROJECT_ROOT / default
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(f"{path.name} not found at {path}; {missing} (or set {env})")
    return path


# Ports handed out are drawn below the kernel's ephemeral range. A port from bind(0) lies in
# that range, which every outgoing connection on the machine draws its source port from too:
# between free_port() and the server's own bind, any client's connect (a test's, another
# user's, a `go` download) could take it, and Envoy or kube-apiserver then died with "Address
# already in use". Below the range only explicit binds compete, and those are checked for.
PORT_FLOOR = 10000
_RANDOM = random.Random()  # its own generator: a test that seeds `random` must not repeat ports
_HANDED_OUT: set[int] = set()  # handed out by this process, maybe not bound yet: never twice


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _share() -> tuple[int, int]:
    """(this test worker's index, how many workers): pytest-xdist's workers draw ports from
    disjoint residues, so two of them never hand out the same port (each checks only its own)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    return index % max(1, count), max(1, count)


def free_port(host: str = LOCALHOST) -> int:
    """A TCP port that was free a moment ago, below the ephemeral range where it can be."""
    low, _ = _ephemeral_range()
    index, count = _share()
    if low - PORT_FLOOR >= 1000 * count:
        for _ in range(100):
            port = _RANDOM.randrange(PORT_FLOOR + index, low, count)
            if port not in _HANDED_OUT and port_is_free(port, host):
                _HANDED_OUT.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # no room below: the kernel's
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_is_free(port: int, host: str = LOCALHOST) -> bool:
    """True when nothing listens on the port (TIME_WAIT leftovers do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def wait_for_port(host: str, port: int, timeout: float = 10.0) -> None:
    """Block until a TCP connect to host:port succeeds; TimeoutError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{host}:{port} not accepting after {timeout}s: {exc}") from exc
        time.sleep(0.05)


def wait_for_http(url: str, timeout: float = 10.0, expect_status: int | None = None) -> int:
    """Block until GET url answers (with `expect_status` if given); return the status.

    Blocking: do not use it on a server that runs on the caller's own event loop.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                status = resp.status
        except urllib.error.HTTPError as exc:
            status = exc.code
            exc.close()
        except OSError as exc:
            status, last = None, exc
        if status is not None:
            if expect_status is None or status == expect_status:
                return status
            last = f"status {status}"
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{url} not ready after {timeout}s (last: {last})")
        time.sleep(0.05)


class StackError(RuntimeError):
    """A piece of the stack did not come up (the message carries its log tail)."""


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy; StackError after ``timeout`` s."""
    try:
        return testkit.wait_until(check, timeout, what, interval)
    except testkit.TimedOut as exc:
        raise StackError(str(exc)) from None


def await_ready(proc: "ManagedProcess", check: Callable[[], Any], timeout: float,
                what: str) -> None:
    """Wait until ``check`` holds while ``proc`` runs; StackError with its log tail if not."""
    def ready() -> Any:
        if not proc.running:
            raise StackError(f"{proc.args[2]} exited while waiting for {what}:\n"
                             f"{proc.log_tail()}")
        return check()
    try:
        wait_until(ready, timeout, what, interval=0.1)
    except StackError as exc:
        raise StackError(f"{exc}\n--- {proc.log_path}:\n{proc.log_tail()}") from None


class ManagedProcess:
    """A subprocess in its own process group, output to a log file, always reaped on stop."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path | str,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | str | None = None,
        stdin_pipe: bool = False,
    ) -> None:
        self.args = [str(a) for a in args]
        self.stdin_pipe = stdin_pipe  # a pipe to the child's stdin (`tell`), else /dev/null
        self.log_path = Path(log_path)
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """Process id of the current run, None before start."""
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> "ManagedProcess":
        """Start the process (appending to the log file); error if it already runs."""
        if self.running:
            raise RuntimeError(f"already running: {self.args[0]} (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # Own session/process group: signals reach its children, and Ctrl-C in a terminal
            # running pytest does not hit it before the fixture's orderly stop().
            self.proc = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE if self.stdin_pipe else subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after `grace` s; reap and return the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.send_signal(signal.SIGTERM)
            # a paused (SIGSTOPped) process handles its SIGTERM only once it runs again
            self.send_signal(signal.SIGCONT)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.send_signal(signal.SIGKILL)
        return self._reap()

    def kill(self) -> int | None:
        """SIGKILL the process group at once (fault tests); reap and return the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.send_signal(signal.SIGKILL)
        return self._reap()

    def restart(self, grace: float = 5.0) -> "ManagedProcess":
        """Stop (if running) and start again with the same arguments."""
        self.stop(grace)
        return self.start()

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the log file, for error messages."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return ""
        return data[-max_bytes:].decode("utf-8", "replace")

    def tell(self, line: str) -> None:
        """Write one line to the child's stdin (``stdin_pipe``): a message it reads when ready."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the process group (a no-op once it is gone)."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass  # the group is gone already; _reap collects the exit code

    def _reap(self) -> int | None:
        assert self.proc is not None
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            # Only reachable if SIGKILL did not land (e.g. uninterruptible sleep).
            return None

    def __enter__(self) -> "ManagedProcess":
        return self.start() if not self.running else self

    def __exit__(self, *exc: object) -> None:
        self.stop()



def writing_into(directory: Path) -> list[int]:
    """Ids of live processes whose stdout is a file in `directory` (Linux /proc).

    Every member server the simulator starts logs to its own file there, so this finds this
    stack's servers, and only them, even after the simulator is gone.
    """
    prefix = str(directory.resolve()) + os.sep
    found = []
    for fd in Path("/proc").glob("[0-9]*/fd/1"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if target.startswith(prefix):
            found.append(int(fd.parent.parent.name))
    return found


def kill_member_server(pid: int) -> None:
    """SIGKILL a member server the simulator started, if it is still there."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return  # gone already
    if b"devstack.fakemember" not in cmdline:
        return  # the id now belongs to some other process
    try:
        os.killpg(pid, signal.SIGKILL)  # the server leads its own process group
    except (ProcessLookupError, PermissionError):
        pass
