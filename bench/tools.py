"""The load tools (wrk, h2load): installing them, running them, reading their output."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from devstack.procs import PROJECT_ROOT

BODY = (b'{"model":"judge","messages":[{"role":"user","content":"Say hello in one word."}],'
        b'"max_tokens":4}')
_PACKAGES = {"wrk": "wrk", "h2load": "nghttp2-client"}
# Their shared libraries a Debian 12 base may lack (libssl and libc are there).
_LIBRARIES = ("libluajit-5.1-2", "libnghttp2-14", "libev4", "libjemalloc2", "libc-ares2")
_ROOT = PROJECT_ROOT / ".tools" / "bench"
_LIB = _ROOT / "usr" / "lib" / "x86_64-linux-gnu"


def ensure_tools() -> dict[str, str]:
    """Make wrk and h2load runnable (Debian's packages unpacked into ``.tools/bench`` when
    the machine lacks them: no root, nothing installed on the system); their versions."""
    if any(shutil.which(tool) is None for tool in _PACKAGES):
        _unpack_packages()
        os.environ["PATH"] = f"{_ROOT / 'usr' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, (str(_LIB), os.environ.get("LD_LIBRARY_PATH"))))
    lost = [t for t in _PACKAGES if shutil.which(t) is None]
    if lost:
        raise SystemExit(f"bench: {', '.join(lost)} not found, and not in Debian's packages")
    wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
    h2 = subprocess.run(["h2load", "--version"], capture_output=True, text=True)
    if "error while loading shared libraries" in wrk.stderr + h2.stderr:
        raise SystemExit(f"bench: wrk or h2load cannot start: {wrk.stderr}{h2.stderr}")
    return {"wrk": (wrk.stdout + wrk.stderr).splitlines()[0].strip(),
            "h2load": h2.stdout.strip().splitlines()[0]}


def _unpack_packages() -> None:
    """``apt-get download`` (a user's command: no root) and ``dpkg -x`` into ``.tools``."""
    if (_ROOT / "usr" / "bin" / "wrk").exists() and (_ROOT / "usr" / "bin" / "h2load").exists():
        return
    debs = _ROOT.parent / "bench-debs"
    debs.mkdir(parents=True, exist_ok=True)
    fetched = subprocess.run(["apt-get", "download", *_PACKAGES.values(), *_LIBRARIES],
                             cwd=debs, capture_output=True, text=True)
    if fetched.returncode:
        raise SystemExit(f"bench: apt-get download failed: {fetched.stderr.strip()[-500:]}")
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(_ROOT)], check=True)


def wrk_script(workdir: Path, body: bytes = BODY, name: str = "post.lua") -> Path:
    """A wrk Lua script ``workdir/name`` that POSTs ``body`` as JSON."""
    path = workdir / name
    path.write_text('wrk.method = "POST"\n'
                    f"wrk.body = '{body.decode()}'\n"
                    'wrk.headers["Content-Type"] = "application/json"\n', encoding="utf-8")
    return path


@dataclass
class WrkResult:
    """One wrk run: throughput, latency percentiles, errors and the command line."""

    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    command: str


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def wrk(url: str, script: Path, connections: int, seconds: int) -> WrkResult:
    """Run wrk with one thread for ``seconds``; bounded by its own duration plus a margin."""
    args = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "--timeout", "5s",
            "-s", str(script), url]
    out = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 30,
                         check=True).stdout
    percentiles = dict(re.findall(r"^\s+(50|99)(?:\.0+)?%\s+(\S+)$", out, re.M))
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), "
                              r"timeout (\d+)", out)
    if socket_errors:
        errors += sum(int(n) for n in socket_errors.groups())
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    assert rps is not None, out
    return WrkResult(rps=float(rps.group(1)),
                     p50_ms=_ms(percentiles["50"]), p99_ms=_ms(percentiles["99"]),
                     requests=requests, errors=errors, command=" ".join(args))


@dataclass
class H2loadResult:
    """One h2load run: how many requests succeeded, failed, and the command line."""

    succeeded: int
    failed: int
    status_2xx: int
    output: str
    command: str


def h2load_args(url: str, body_file: Path, requests: int, clients: int, streams: int,
                h1: bool = False, rate: int = 0) -> list[str]:
    """An h2load command line: ``requests`` POSTs over ``clients`` connections (h2c unless h1),
    opening ``rate`` connections per second when given (all at once otherwise)."""
    args = ["h2load", "-n", str(requests), "-c", str(clients), "-t", "1",
            "-H", "content-type: application/json", "-d", str(body_file)]
    args += ["-r", str(rate)] if rate else []
    args += ["--h1"] if h1 else ["-m", str(streams)]
    return args + [url]


def parse_h2load(output: str, command: str) -> H2loadResult:
    """Read h2load's summary."""
    match = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, "
                      r"(\d+) failed", output)
    status = re.search(r"status codes: (\d+) 2xx", output)
    return H2loadResult(succeeded=int(match.group(1)) if match else 0,
                        failed=int(match.group(2)) if match else -1,
                        status_2xx=int(status.group(1)) if status else 0,
                        output=output, command=command)
