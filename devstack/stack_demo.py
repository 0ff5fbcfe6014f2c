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
from devstack.procs import PROJECT_ROOT, StackError
from devstack.stack import START_TIMEOUT, LocalStack
from devstack.stack_ports import Ports
from devstack.stack_replicas import Replica
from devstack.stack_swaps import LogTail, describe, swap_notices

NAMESPACE = "demo"
POOL = "shared-gpu"
# One line per swap: its outcome. SwapStarted is left out (the outcome line names both ends).
SHOWN = ("SwapCompleted", "SwapFailed", "SwapDeferred", "MemberLost", "ReplicasWritten",
         "MemberAutoscaled", "ActuationChanged", "Reclaimed")
STREAM = ', "stream": true'
# an HPA aimed at the writer member, for the instructions (one line of JSON for a here-string)
HPA_SAMPLE = ('{"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": '
              '{"name": "writer"}, "spec": {"scaleTargetRef": {"apiVersion": '
              '"inference.llmkube.dev/v1alpha1", "kind": "InferenceService", "name": "writer"}, '
              '"maxReplicas": 2}}')
# Pool settings the instructions offer to patch live: (merge patch, what it does).
POOL_PATCHES = (
    ('{"spec": {"swapDelay": "20s"}}', "a resident holds 20 s"),
    ('{"spec": {"swapPolicy": "reclaim-down", "reclaimAfter": "20s"}}',
     "idle 20 s: the pool goes cold"),
)
SMOKE_TIMEOUT = 60.0  # per request: a cold load plus a swap, with room for a slow machine
REPLICAS_ENV = "MODELPOOL_DEMO_REPLICAS"
# A replica that exits is started again (same name, same ports) after this long, as its
# Deployment would; meanwhile the others serve, which is what the demo lets you see.
RESTART_AFTER = 5.0


def build(workdir: Path, load_delay: float, unload_delay: float,
          listen: int | None = None, actuation: str = "own", replicas: int = 1,
          endpoint_picker: bool = False, runtime: str = "fake") -> LocalStack:
    """The demo stack: the sample manifests on the demo's ports."""
    docs = manifests.load_sample()
    members = [m for _, m in manifests.members_of(docs)]
    return LocalStack(workdir, docs, Ports.demo(members, listen, replicas),
                      load_delay=load_delay, unload_delay=unload_delay, actuation=actuation,
                      replicas=replicas, endpoint_picker=endpoint_picker, runtime=runtime)


def mode_line(stack: LocalStack) -> str:
    """Which actuation mode the demo runs, and who moves the slot in it."""
    if stack.actuation == "llmkube":
        line = ("Mode: llmkube. The ext_proc only triggers swaps (scales the target 0 -> 1); the "
                "LLMKube stand-in\n      (devstack.reconciler) drains, unloads, loads and writes "
                "the pool status.")
    else:
        line = ("Mode: own. The ext_proc drains, unloads, loads and writes the pool status "
                "(no other ModelPool controller).")
    if stack.runtime == "llama.cpp":
        line += ("\nMembers: llama.cpp's own llama-server on a generated tiny model, one process "
                 "per loaded member\n         (logs: llama-<member>.log under the logs' members/).")
    return line + picker_line(stack)


def picker_line(stack: LocalStack) -> str:
    """Behind an endpoint picker: where the members' pods are ("" otherwise)."""
    if not stack.endpoint_picker:
        return ""
    pods = ", ".join(f"{m} {stack.member_address(m)}" for _, m in stack.members)
    return ("\nGateway: InferencePool style. The ext_proc is the endpoint picker (--endpoint-"
            f"picker); Envoy goes to the pod it names: {pods}.")


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
        f"  {k} get leases -n {stack.lease_namespace}          # replicas, pool leaders",
        "",
        "Make a member misbehave (annotations on its InferenceService, live):",
        f"  {k} annotate isvc writer -n {NAMESPACE} sim.llmkube.dev/load-delay=20s --overwrite",
        f"  {k} annotate isvc writer -n {NAMESPACE} sim.llmkube.dev/fail=true --overwrite"
        "      # fails to start",
        f"  {k} annotate isvc writer -n {NAMESPACE} sim.llmkube.dev/fail-          # heal it",
        f"  {k} annotate isvc judge -n {NAMESPACE} sim.llmkube.dev/kill-pod=$(date +%s) "
        "--overwrite  # kill the pod",
        "",
        "Other writers and pool settings:",
        f"  {k} scale isvc writer -n {NAMESPACE} --replicas=1   # reported, naming kubectl",
        f"  {k} create -n {NAMESPACE} -f - <<< '{HPA_SAMPLE}'"
        "   # writer refused while it exists",
        f"  {k} delete hpa writer -n {NAMESPACE}",
        *(f"  {k} patch mpool {POOL} -n {NAMESPACE} --type=merge -p '{patch}'   # {what}"
          for patch, what in POOL_PATCHES),
        "",
        *replicas_note(stack),
        f"Metrics: {stack.metrics_url}   Pool views: {stack.debug_url}",
        f"Logs:    {_short(stack.log_dir)}/   Walkthrough: docs/demo.md",
        "",
        "Swaps as they happen (Ctrl-C stops everything):",
    ]
    return "\n".join(lines)


def replicas_note(stack: LocalStack) -> list[str]:
    """With several replicas: what to kill, and what happens then."""
    if len(stack.replicas) == 1:
        return []
    return [f"{len(stack.replicas)} ext_proc replicas behind the one Envoy (lines above). Kill "
            "any (kill -9 <pid>): the others serve;",
            f"it starts again {RESTART_AFTER:g}s later with the same name and ports. Metrics "
            "and pool views below are replica-0's.", ""]


def run(args: Any) -> int:
    """Start the demo, then follow swaps until Ctrl-C (or run the smoke check and exit)."""
    workdir = demo_workdir(args.workdir)
    try:
        load_delay = args.load_delay
        if load_delay is None:  # real llama.cpp members load for real: nothing simulated on top
            load_delay = 0.0 if args.runtime == "llama.cpp" else 3.0
        stack = build(workdir, load_delay, args.unload_delay, args.port, args.actuation,
                      args.replicas, args.endpoint_picker, args.runtime)
    except (RuntimeError, ValueError, FileNotFoundError) as exc:  # port taken, bad options
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    _stop_on_signals()
    print(f"Starting the demo stack ({stack.actuation} mode) in {_short(workdir)} ...",
          flush=True)
    try:
        stack.start()
        for replica in stack.replicas:
            print(replica.line(), flush=True)
        print(instructions(stack), flush=True)
        tails = SwapLines(stack.replicas)
        if args.smoke:
            return smoke(stack, tails)
        follow(stack, tails)
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


class SwapLines:
    """The swap notices every replica logs, printed as they come (named by replica when
    there are several: whichever leads a pool logs its swaps)."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.tails = [(r, LogTail(r.log_path, from_start=True)) for r in replicas]

    def print_new(self) -> None:
        """Print the notices logged since the last call."""
        for replica, tail in self.tails:
            for entry in swap_notices(tail.read()):  # a follower's echo of its leader's swap: no
                if entry["event"] in SHOWN:
                    who = f"  [{replica.name}]" if len(self.tails) > 1 else ""
                    print(f"  {describe(entry)}{who}", flush=True)


def follow(stack: LocalStack, lines: SwapLines) -> None:
    """Print a line per swap until interrupted; restart a replica that exits (when there are
    several), end when any other piece does."""
    exited_at: dict[str, float] = {}  # replica name -> when it was seen gone
    while True:  # until Ctrl-C, or a piece other than a replica exits
        lines.print_new()
        replicas = {r.piece: r for r in stack.replicas} if len(stack.replicas) > 1 else {}
        gone = stack.exited()
        others = [name for name in gone if name not in replicas]
        if others:
            print(f"{', '.join(others)} exited unexpectedly; see the logs in "
                  f"{_short(stack.workdir)}", flush=True)
            return
        for replica in (replicas[name] for name in gone):
            _restart_when_due(replica, exited_at)
        time.sleep(0.2)


def _restart_when_due(replica: Replica, exited_at: dict[str, float]) -> None:
    """Say that a replica exited; RESTART_AFTER later, start it again and print its line."""
    now = time.monotonic()
    if replica.name not in exited_at:
        exited_at[replica.name] = now
        print(f"  replica {replica.name} (pid {replica.pid}) exited with code "
              f"{replica.exit_code}; the others serve. It starts again in {RESTART_AFTER:g}s.",
              flush=True)
    elif now - exited_at[replica.name] >= RESTART_AFTER:
        del exited_at[replica.name]
        replica.start(START_TIMEOUT)
        print(replica.line(), flush=True)


def smoke(stack: LocalStack, lines: SwapLines) -> int:
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
        lines.print_new()
    time.sleep(0.3)  # the last notices reach the log just after the answers
    lines.print_new()
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
            served_by = resp.headers.get("x-served-by", "") or answering_model(text, stream)
            if stream and "data: [DONE]" not in text:
                return resp.status, served_by, "stream incomplete"
            return resp.status, served_by, note
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, "", exc.read().decode()[:200]
    except OSError as exc:
        return 0, "", repr(exc)


def answering_model(text: str, stream: bool) -> str:
    """The model an answer names (llama-server names its --alias: the member) ("" if none)."""
    try:
        if stream:
            text = next(line[6:] for line in text.splitlines() if line.startswith("data: {"))
        return str(json.loads(text).get("model") or "")
    except (StopIteration, ValueError, AttributeError):
        return ""


def default_runtime() -> str:
    """$MODELPOOL_DEMO_RUNTIME, else fake (the simulator's own upstream)."""
    return os.environ.get("MODELPOOL_DEMO_RUNTIME") or "fake"


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


def default_replicas() -> str:
    """$MODELPOOL_DEMO_REPLICAS, else 1 (checked by the command line)."""
    return os.environ.get(REPLICAS_ENV) or "1"


def default_endpoint_picker() -> bool:
    """$MODELPOOL_DEMO_ENDPOINT_PICKER (1, true, yes), else off."""
    return (os.environ.get("MODELPOOL_DEMO_ENDPOINT_PICKER") or "").lower() in ("1", "true",
                                                                             "yes")


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
