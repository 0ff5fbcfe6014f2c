"""Flakiness, measured: ``python -m devstack.soak`` (``make soak-tests``).

Runs the end-to-end and fault test files (e2e/) ``--runs`` times, each round the way
``make test`` runs them (two pytest-xdist workers, whole files per worker), while a CPU hog
keeps one core busy, so the stacks meet the load a shared CI machine gives them. Every round
has its own seed (PYTHONHASHSEED, Python's ``random`` in the test processes, Hypothesis), and
every failure is printed with its round, seed and pytest's report (the captured log included).
Exit status 1 when anything failed.

The hog is a child process that spins until the soak ends (or its own deadline: the soak's
``--max-minutes``) and is stopped by its process id.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED_ENV = "MODELPOOL_TEST_SEED"  # read by tests/conftest.py and e2e/conftest.py
HOG = "import time\ndeadline = time.monotonic() + {seconds}\nwhile time.monotonic() < deadline:\n    pass\n"


@dataclass(frozen=True)
class Failure:
    """One failed or erroring test of one round."""

    round: int
    seed: int
    test: str
    report: str


def start_hog(seconds: float) -> subprocess.Popen:
    """A process keeping one core busy for at most ``seconds``."""
    return subprocess.Popen([sys.executable, "-c", HOG.format(seconds=seconds)])


def failures_in(junit: Path, round_: int, seed: int) -> list[Failure]:
    """The failures and errors a round's JUnit XML report records."""
    if not junit.exists():
        return [Failure(round_, seed, "(pytest wrote no report)", "")]
    found = []
    for case in ET.parse(junit).iter("testcase"):
        # the captured log and output (junit_logging=all) follow the traceback
        captured = "\n".join(part.text or "" for tag in ("system-out", "system-err")
                             for part in case.iter(tag))
        for problem in [*case.iter("failure"), *case.iter("error")]:
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            report = problem.text or problem.get("message", "")
            found.append(Failure(round_, seed, name, f"{report}\n{captured}".strip()))
    return found


def run_round(round_: int, seed: int, paths: list[str], workers: int, out: Path,
              extra: list[str]) -> tuple[list[Failure], float]:
    """One pytest run of ``paths`` with ``seed``; its failures and its duration."""
    junit = out / f"round-{round_}.xml"
    env = {**os.environ, "PYTHONHASHSEED": str(seed), SEED_ENV: str(seed)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "-n", str(workers), "--dist", "loadfile", f"--hypothesis-seed={seed}",
           f"--junitxml={junit}", "-o", "junit_logging=all", *extra, *paths]
    started = time.monotonic()
    with (out / f"round-{round_}.log").open("w") as log:
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return failures_in(junit, round_, seed), time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    """Run the rounds; print every failure; 1 if any."""
    parser = argparse.ArgumentParser(prog="python -m devstack.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="rounds of every file (3)")
    parser.add_argument("--hog", type=int, default=1, choices=(0, 1),
                        help="keep one core busy meanwhile (1) or not (0)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (2)")
    parser.add_argument("--max-minutes", type=float, default=240.0,
                        help="stop starting rounds after this long (240)")
    parser.add_argument("--out", default=str(ROOT / ".soak"), help="reports and logs (.soak/)")
    parser.add_argument("paths", nargs="*", default=["e2e"],
                        help="test files or directories (e2e: the end-to-end and fault files)")
    args, extra = parser.parse_known_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.max_minutes * 60
    hog = start_hog(args.max_minutes * 60) if args.hog else None
    failures: list[Failure] = []
    try:
        for round_ in range(1, args.runs + 1):
            if time.monotonic() > deadline:
                print(f"soak: stopped before round {round_}: --max-minutes reached")
                break
            seed = random.randrange(1, 2 ** 31)
            found, took = run_round(round_, seed, args.paths, args.workers, out, extra)
            failures += found
            print(f"soak: round {round_}/{args.runs} seed {seed}: {len(found)} failed "
                  f"in {took:.0f} s (log: {out / f'round-{round_}.log'})", flush=True)
    finally:
        if hog is not None:
            hog.terminate()
            hog.wait(10)
    for failure in failures:
        print(f"\n=== FAILED round {failure.round} seed {failure.seed}: {failure.test}\n"
              f"{failure.report}")
    print(f"\nsoak: {len(failures)} failure(s) in {args.runs} round(s)"
          f"{' under a one-core CPU hog' if args.hog else ''}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
