"""Run each mutant of mutants.py against a copy of the tree and say what caught it.

For every mutant: copy extproc/ and tests/policy/ into a temporary directory (the checkout's
files are never touched), apply the patch there, run the exhaustive search
(test_exhaustive.py, stopping at its first failure) and the other tests of tests/policy (a
fixed Hypothesis seed, so a row is reproducible), with the copy first on the import path.
The table says, per mutant, which scenario's search caught it (and the violation's first
line), which named tests failed, or "nothing". ``make mutants`` runs it; it is not part of
``make test`` (a mutant the search misses costs the whole search, minutes).

    python tests/policy/mutants_run.py [NAME ...] [--jobs N] [--depth D] [--clean] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SEARCH = "tests/policy/test_exhaustive.py"
COVERAGE = f"{SEARCH}::test_every_transition_row_fires_in_some_scenario"
# Not run against a mutant: the search (run above) and the layout check (the copy holds only
# extproc/ and tests/policy/, and a mutant changes no import)
NOT_BEHAVIOUR = {"test_exhaustive.py", "test_layers.py"}
# The search under a mutant may be slower than clean (a wedge takes the whole horizon):
# the suite's 120 s per test would call a slow scenario a catch.
DEPTH = [0]  # added to every scenario's depth (--depth; negative: a quicker, shallower table)
INI = "[pytest]\ntimeout = 1800\naddopts = -p no:cacheprovider\n"
OTHERS_TIMEOUT = 30  # seconds per test of tests/policy but the search (each takes a few at most)


@dataclass
class Row:
    """What caught one mutant."""

    mutant: Mutant
    search: str = ""  # "scenario: violation" or ""
    tests: tuple[str, ...] = ()
    seconds: float = 0.0
    error: str = ""

    def caught_by(self) -> str:
        """The table's cell."""
        if self.error:
            return f"ERROR: {self.error}"
        parts = [f"search ({self.search})"] if self.search else []
        if self.tests:
            shown = ", ".join(f"`{t}`" for t in self.tests[:3])
            more = f" and {len(self.tests) - 3} more" if len(self.tests) > 3 else ""
            parts.append(f"tests: {shown}{more}")
        return "; ".join(parts) or "**nothing**"


def copy_tree(into: Path) -> None:
    """The parts of the checkout the policy's tests need."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    shutil.copytree(ROOT / "extproc", into / "extproc", ignore=skip)
    shutil.copytree(ROOT / "tests" / "policy", into / "tests" / "policy", ignore=skip)
    (into / "pytest.ini").write_text(INI)


def apply(mutant: Mutant, into: Path) -> None:
    """Patch the copy; a patch that no longer matches exactly once is an error, not a pass."""
    path = into / "extproc" / "policy" / mutant.file
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise ValueError(f"{mutant.file}: the patch's text occurs {count} times")
    path.write_text(text.replace(mutant.old, mutant.new))


def pytest(into: Path, *args: str) -> str:
    """Run pytest in the copy (its extproc first on the path); its whole output."""
    env = dict(os.environ, PYTHONPATH=str(into), PYTHONDONTWRITEBYTECODE="1")
    env["MODELPOOL_EXPLORE_DEPTH"] = str(DEPTH[0])
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-rf", *args],
                          cwd=into, env=env, capture_output=True, text=True)
    return done.stdout + done.stderr


def failed(output: str) -> list[str]:
    """The failing tests named in pytest's short summary (-rf)."""
    return [m.group(1).split("/")[-1] for m in re.finditer(r"^FAILED (\S+)", output, re.M)]


def violation(output: str) -> str:
    """The first line of the search's Violation (or of whatever error ended it)."""
    found = re.search(r"^E\s+(?:explore\.)?Violation: (.+)$", output, re.M) or \
        re.search(r"^E\s+(.+)$", output, re.M)
    return found.group(1).strip()[:110] if found else "failed"


def run(mutant: Mutant | None) -> Row:
    """One mutant (None: the clean tree, which must pass everything)."""
    began = time.monotonic()
    row = Row(mutant or Mutant("(clean)", "", "", "", "no change"))
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        into = Path(tmp)
        copy_tree(into)
        try:
            if mutant is not None:
                apply(mutant, into)
        except ValueError as exc:
            row.error = str(exc)
            return row
        if str(into) not in subprocess.run(
                [sys.executable, "-c", "import extproc; print(extproc.__file__)"],
                cwd=into, env=dict(os.environ, PYTHONPATH=str(into)),
                capture_output=True, text=True).stdout:
            row.error = "the copy's extproc is not the one imported"
            return row
        # (the row-coverage check measures the scenarios, not the machine: left out)
        out = pytest(into, "-x", SEARCH, "--deselect", COVERAGE)
        names = failed(out)
        if names:
            scenario = re.search(r"\[([^\]]+)\]", names[0])
            row.search = f"{scenario.group(1) if scenario else names[0]}: {violation(out)}"
        others = sorted(str(p.relative_to(into)) for p in (into / "tests" / "policy").glob(
            "test_*.py") if p.name not in NOT_BEHAVIOUR)
        # (a mutant that makes the machine wait for ever hangs a test: a clean run of all
        # of them takes seconds, so OTHERS_TIMEOUT each is a catch, not a slow machine)
        row.tests = tuple(failed(pytest(into, "--hypothesis-seed=0",
                                        f"--timeout={OTHERS_TIMEOUT}", *others)))
    row.seconds = time.monotonic() - began
    return row


def table(rows: list[Row]) -> str:
    """The markdown table of docs/mutants.md."""
    lines = ["| mutant | what it breaks | caught by |", "|---|---|---|"]
    lines += [f"| `{r.mutant.name}` | {r.mutant.why} | {r.caught_by().replace('|', '/')} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    """Run the mutants named (all by default), print and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once")
    parser.add_argument("--out", default="/tmp/mutants_table.md", help="write the table here")
    parser.add_argument("--clean", action="store_true", help="run the clean tree first")
    parser.add_argument("--depth", type=int, default=0,
                        help="added to each scenario's depth (the table says which)")
    args = parser.parse_args()
    DEPTH[0] = args.depth
    known = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"no such mutants: {unknown}")
    chosen: list[Mutant | None] = [known[n] for n in args.names] if args.names else list(MUTANTS)
    if args.clean:
        chosen.insert(0, None)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = []
        for row in pool.map(run, chosen):
            print(f"{row.mutant.name:28} {row.seconds:6.0f}s  {row.caught_by()}", flush=True)
            rows.append(row)
    text = f"search depth: each scenario's own {args.depth:+d}\n\n" + table(rows)
    Path(args.out).write_text(text)
    print(f"\n{text}\nwritten to {args.out}")
    clean = [r for r in rows if r.mutant.name == "(clean)"]
    missed = [r for r in rows if r.caught_by() == "**nothing**" and r.mutant.name != "(clean)"]
    if clean and clean[0].caught_by() != "**nothing**":
        print("the clean tree fails: the table means nothing until it passes")
        return 2
    return 1 if missed or any(r.error for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
