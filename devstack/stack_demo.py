"""`python -m devstack demo`: the sample pool on loopback, what to try, and a live line per swap."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from devstack import stack_manifests as manifests
from devstack.procs import PROJECT_ROOT
from devstack.stack import LocalStack, StackError
from devstack.stack_ports import Ports
from devstack.stack_swaps import LogTail, describe

NAMESPACE = "demo"
POOL = "shared-gpu"
# One line per swap: its outcome. SwapStarted is left out (the outcome line names both ends).
SHOWN = ("SwapCompleted", "SwapFailed", "SwapDeferred", "MemberLost")
STREAM = ', "stream": true'
SMOKE_TIMEOUT = 60.0  # per request: a cold load plus a swap, with room for a slow machine


def build(workdir: Path, load_delay: float, unload_delay: float,
          listen: int | None = None, actuation: str = "own") -> LocalStack:
    """The demo stack: the sample manifests on the demo's ports."""
    docs = manifests.load_sample()
    members = [m for _, m in manifests.members_of(docs)]
    return LocalStack(workdir, docs, Ports.demo(members, listen), load_delay=load_delay,
                      unload_delay=unload_delay, actuation=actuation)


def mode_line(stack: LocalStack) -> str:
    """Which actuation mode the demo runs, and who moves the slot in it."""
    if stack.actuation == "llmkube":
        return ("Mode: llmkube. The ext_proc only triggers swaps (scales the target 0 -> 1); the "
                "LLMKube stand-in\n      (devstack.reconciler) drains, unloads, loads and writes "
                "the pool status.")
    return ("Mode: own. The ext_proc drains, unloads, loads and writes the pool status "
            "(no other ModelPool controller).")


def instructions(stack: LocalStack) -> str:
    """What to try, with this stack's real addresses."""
    kubeconfig = _short(stack.kubeconfig)
    k = f"KUBECONFIG={kubeconfig} kubectl"
    chat = (f"curl -s {stack.url}/v1/chat/completions -H 'content-type: application/json' "
            "-d '{\"model\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]%s}'")
    lines = [
        f"The demo is up: one OpenAI-compatible endpoint at {stack.url}",
        mode_line(stack),
        f"ModelPool {NAMESPACE}/{POOL}: members judge (default), coder, writer share one slot;"
        f" each loads in ~{stack.load_delay:g}s.",
        "",
        "Try (a request for a member that is not resident is held while the slot swaps):",
        f"  curl -s {stack.url}/v1/models",
        *(f"  {chat % (m, '')}" for m in ("judge", "coder", "writer")),
        f"  {chat % ('judge', STREAM)}      # SSE, token by token",
        "",
        "Watch the pool:",
        f"  {k} get mpool -n {NAMESPACE}            # Policy, Resident, Phase",
        f"  {k} describe mpool {POOL} -n {NAMESPACE}  # conditions, events",
        f"  {k} get isvc,pods -n {NAMESPACE}",
        "",
        "Make a member misbehave (annotations on its InferenceService, live):",
        f"  {k} annotate isvc writer -n {NAMESPACE} sim.llmkube.dev/load-delay=20s --overwrite",
        f"  {k} annotate isvc writer -n {NAMESPACE} sim.llmkube.dev/fail=true --overwrite"
        "      # fails to start",
        f"  {k} annotate isvc writer -n {NAMESPACE} sim.llmkube.dev/fail-          # heal it",
        f"  {k} annotate isvc judge -n {NAMESPACE} sim.llmkube.dev/kill-pod=$(date +%s) "
        "--overwrite  # kill the pod",
        "",
        f"Metrics: {stack.metrics_url}   Pool views: {stack.debug_url}",
        f"Logs:    {_short(stack.log_dir)}/   Walkthrough: docs/demo.md",
        "",
        "Swaps as they happen (Ctrl-C stops everything):",
    ]
    return "\n".join(lines)


def run(args: Any) -> int:
    """Start the demo, then follow swaps until Ctrl-C (or run the smoke check and exit)."""
    workdir = demo_workdir(args.workdir)
    try:
        stack = build(workdir, args.load_delay, args.unload_delay, args.port, args.actuation)
    except RuntimeError as exc:  # the listener port is taken
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    _stop_on_signals()
    print(f"Starting the demo stack ({stack.actuation} mode) in {_short(workdir)} ...",
          flush=True)
    try:
        stack.start()
        print(instructions(stack), flush=True)
        tail = LogTail(stack.log_path("extproc"), from_start=True)
        if args.smoke:
            return smoke(stack, tail)
        follow(stack, tail)
        return 0
    except KeyboardInterrupt:
        return 0
    except (StackError, FileNotFoundError) as exc:  # a piece did not start (log tail inside)
        print(f"demo: could not start: {exc}", file=sys.stderr)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        print("\nStopping the demo ...", flush=True)
        stack.stop()
        print("Stopped; nothing left running.", flush=True)


def follow(stack: LocalStack, tail: LogTail) -> None:
    """Print a line per swap from the ext_proc's log until interrupted."""
    while True:
        _print_swaps(tail)
        gone = stack.exited()
        if gone:
            print(f"{', '.join(gone)} exited unexpectedly; see the logs in "
                  f"{_short(stack.workdir)}", flush=True)
            return
        time.sleep(0.2)


def smoke(stack: LocalStack, tail: LogTail) -> int:
    """One request per member and one SSE stream; print what came back and the swap lines."""
    failures = 0
    for model, stream in (("judge", False), ("coder", False), ("writer", False),
                          ("judge", True)):
        began = time.monotonic()
        status, served_by, detail = request(stack.url, model, stream)
        ok = status == 200 and served_by == model
        failures += not ok
        print(f"  {'ok ' if ok else 'BAD'} {model:<7} stream={str(stream).lower():<5} -> "
              f"{status} served by {served_by or '-'} in {time.monotonic() - began:.1f}s"
              f"{'' if ok else ': ' + detail}", flush=True)
        _print_swaps(tail)
    time.sleep(0.3)  # the last notices reach the log just after the answers
    _print_swaps(tail)
    print(stack.kubectl("get", "mpool", "-n", NAMESPACE).stdout, end="", flush=True)
    return 1 if failures else 0


def request(base: str, model: str, stream: bool) -> tuple[int, str, str]:
    """POST a chat completion; (status, x-served-by, a short note on the body)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}],
            "stream": stream}
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=SMOKE_TIMEOUT) as resp:
            text = resp.read().decode()
            note = f"{text.count('data: ')} events" if stream else text[:120]
            if stream and "data: [DONE]" not in text:
                return resp.status, resp.headers.get("x-served-by", ""), "stream incomplete"
            return resp.status, resp.headers.get("x-served-by", ""), note
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, "", exc.read().decode()[:200]
    except OSError as exc:
        return 0, "", repr(exc)


def _print_swaps(tail: LogTail) -> None:
    for entry in tail.read():
        if entry.get("event") in SHOWN:
            print("  " + describe(entry), flush=True)


def _stop_on_signals() -> None:
    """SIGTERM and SIGHUP end the demo like Ctrl-C, so the finally block stops everything."""
    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    # Started in the background by a shell, Python inherits SIGINT ignored; Ctrl-C (or
    # `kill -INT`) must still stop the demo.
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _short(path: Path) -> str:
    """A path relative to the current directory when it is below it (shorter to copy)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def default_actuation() -> str:
    """$MODELPOOL_DEMO_ACTUATION, else own."""
    return os.environ.get("MODELPOOL_DEMO_ACTUATION") or "own"


def default_workdir() -> Path:
    """`.demo` in the project root (where the Makefile runs)."""
    return Path(os.environ.get("MODELPOOL_DEMO_DIR") or PROJECT_ROOT / ".demo")


def demo_workdir(path: Path | str = PROJECT_ROOT / ".demo") -> Path:
    """The demo's directory, emptied of an earlier run's logs and records."""
    workdir = Path(path)
    for stale in ("logs", "envoy", "timeline.jsonl"):
        target = workdir / stale
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir
