"""Part 7 (``--only warm``): warm swaps, prompt-cache carry-over and paced release.

Both on the cluster-mode stack (``bench.cluster``), with either kind of member (``Members``):
the member simulator playing llama.cpp (a prefill cost of ``PREFILL_MS`` per prompt token the
slot's cache lacks, and its slot API), or llama.cpp's own ``llama-server`` (part 2c, ``--only
llama``) on generated models: its own prefill, slot files and ``timings``.

* Carry-over. A conversation of ``LONG_PROMPT`` tokens goes to ``a``; a short request to ``b``
  swaps a -> b (its time to first token is that swap, the save included); the conversation
  comes back to ``a`` with one more turn (b -> a, the restore included, then its prefill).
  ``ROUNDS`` rounds with the members' carry annotation on, as many with it off, on one stack.
* Paced release. ``HERD`` streamed requests for the member that is not resident, all at once,
  onto members with ``SLOTS`` slots; time to first token of each, with ``--paced-release``
  (capacity annotation ``SLOTS``) and without, on two stacks.

Every wait is bounded (request timeouts, a fixed number of rounds).
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from devstack import tinymodel
from devstack.llamacpp import ANN_MODEL_FILE, ANN_PARALLEL
from devstack.stack import LLAMA_MODELS
from devstack.fakemember_slots import PREFILL_ENV, SLOTS_ENV
from extproc.names import CAPACITY_ANNOTATION, CARRY_ANNOTATION

from .cluster import ClusterStack

PREFILL_MS = 1.0  # simulated prefill per uncached prompt token
LONG_PROMPT = 6000  # tokens of the returning conversation: 6 s of prefill cold
ROUNDS = 3
LOAD_DELAY, UNLOAD_DELAY = 0.2, 0.1
SLOTS, HERD, HERD_PROMPT = 4, 32, 200
TIMEOUT = 60.0


@dataclass(frozen=True)
class Members:
    """What the pool's members are, and the sizes that suit them."""

    runtime: str  # "fake": the simulator; "llama.cpp": llama-server
    load_delay: float
    unload_delay: float
    conversation_words: int  # the returning conversation's length
    carry_annotations: dict[str, str] = field(default_factory=dict)
    carry_env: dict[str, str] = field(default_factory=dict)
    paced_annotations: dict[str, str] = field(default_factory=dict)
    paced_env: dict[str, str] = field(default_factory=dict)
    herd_words: int = HERD_PROMPT


SIMULATED = Members("fake", LOAD_DELAY, UNLOAD_DELAY, LONG_PROMPT,
                    carry_env={PREFILL_ENV: str(PREFILL_MS), SLOTS_ENV: "1"},
                    paced_env={PREFILL_ENV: str(PREFILL_MS), SLOTS_ENV: str(SLOTS)})


def llama_members() -> Members:
    """llama-server members: the conversation on the ``large`` model (its prefill takes
    seconds on one thread: what carry-over saves), within one 512-token slot; the herd on the
    ``tiny`` one at ``SLOTS`` slots (``-np``)."""
    large = tinymodel.ensure(LLAMA_MODELS, "large")
    return Members("llama.cpp", 0.0, 0.0, 60,
                   carry_annotations={ANN_MODEL_FILE: str(large), ANN_PARALLEL: "1"},
                   paced_annotations={ANN_PARALLEL: str(SLOTS)}, herd_words=40)


def _stream(url: str, member: str, prompt: str, tokens: int = 4) -> dict[str, Any]:
    """One streamed chat request: seconds to its first token, and llama.cpp's timings."""
    parts = urlsplit(url)
    body = json.dumps({"model": member, "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": prompt}]})
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT)
    began = time.monotonic()
    try:
        conn.request("POST", parts.path, body, {"content-type": "application/json"})
        resp = conn.getresponse()
        first, timings = None, {}
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            first = first if first is not None else time.monotonic() - began
            timings = json.loads(line[6:]).get("timings", timings)
        return {"status": resp.status, "ttft_s": first, "timings": timings}
    finally:
        conn.close()


def _words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def _carry_rounds(stack: ClusterStack, carry: bool, words: int) -> list[dict[str, Any]]:
    rows = []
    for k in range(ROUNDS):
        conversation = _words(f"r{k}{'c' if carry else 'n'}w", words)
        cold = _stream(stack.url, "a", conversation)
        away = _stream(stack.url, "b", "a short question")  # swap a -> b: the save
        back = _stream(stack.url, "a", conversation + " and one more turn")  # b -> a
        rows.append({"cold_ttft_s": cold["ttft_s"], "swap_away_ttft_s": away["ttft_s"],
                     "return_ttft_s": back["ttft_s"],
                     "return_cache_n": back["timings"].get("cache_n"),
                     "return_prompt_ms": back["timings"].get("prompt_ms"),
                     "first_prompt_n": cold["timings"].get("prompt_n"),
                     "statuses": [cold["status"], away["status"], back["status"]]})
    return rows


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 3) if values else None


def carry_over(workdir: Path, members: Members = SIMULATED) -> dict[str, Any]:
    """Time to first token of a returning long conversation, with and without carry-over."""
    stack = ClusterStack(workdir, members.load_delay, members.unload_delay,
                         member_annotations={CARRY_ANNOTATION: "true",
                                             **members.carry_annotations},
                         member_env=members.carry_env, runtime=members.runtime)
    try:
        stack.start()
        with_carry = _carry_rounds(stack, True, members.conversation_words)
        for member in ("a", "b"):
            stack.annotate(member, CARRY_ANNOTATION, None)
        time.sleep(1.0)  # the watch delivers the annotation change
        without = _carry_rounds(stack, False, members.conversation_words)
    finally:
        stack.stop()
    keys = ("cold_ttft_s", "swap_away_ttft_s", "return_ttft_s", "return_cache_n",
            "return_prompt_ms")
    return {"prefill_ms_per_token": PREFILL_MS if members.runtime == "fake" else None,
            "prompt_tokens": with_carry[0]["first_prompt_n"] or members.conversation_words,
            "rounds": ROUNDS,
            "with": {k: _median(with_carry, k) for k in keys},
            "without": {k: _median(without, k) for k in keys},
            "runs": {"with": with_carry, "without": without}}


def _herd(stack: ClusterStack, words: int) -> list[dict[str, Any]]:
    results = []
    with ThreadPoolExecutor(HERD) as pool:
        for k, target in enumerate(("b", "a")):
            prompts = [_words(f"h{k}q{i}w", words) for i in range(HERD)]
            results += list(pool.map(lambda p, t=target: _stream(stack.url, t, p, 8), prompts))
    return results


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def paced_release(workdir: Path, members: Members = SIMULATED) -> dict[str, Any]:
    """p50 and p99 time to first token of a herd released onto a member with SLOTS slots."""
    out: dict[str, Any] = {"slots": SLOTS, "requests": HERD, "prompt_tokens": members.herd_words,
                           "prefill_ms_per_token": PREFILL_MS if members.runtime == "fake"
                           else None}
    for name, args in (("all_at_once", ()), ("paced", ("--paced-release",))):
        stack = ClusterStack(workdir / name, members.load_delay, members.unload_delay,
                             extproc_args=args, runtime=members.runtime,
                             member_annotations={CAPACITY_ANNOTATION: str(SLOTS),
                                                 **members.paced_annotations},
                             member_env=members.paced_env)
        try:
            stack.start()
            rows = _herd(stack, members.herd_words)
        finally:
            stack.stop()
        ttfts = [r["ttft_s"] for r in rows if r["status"] == 200 and r["ttft_s"] is not None]
        counted = [r["timings"]["prompt_n"] for r in rows if "prompt_n" in r["timings"]]
        if counted:  # (the server's own count of the prompt's tokens, where it gives one)
            out["prompt_tokens"] = statistics.median(counted)
        out[name] = {"ok": len(ttfts), "failed": len(rows) - len(ttfts),
                     "p50_ttft_s": _p(ttfts, 0.5), "p99_ttft_s": _p(ttfts, 0.99),
                     "max_ttft_s": round(max(ttfts), 3) if ttfts else None}
    return out


def run(workdir: Path, members: Members = SIMULATED) -> dict[str, Any]:
    """Both measurements."""
    result = {"carry_over": carry_over(workdir / "carry", members),
              "paced_release": paced_release(workdir / "paced", members)}
    print(f"  warm: {json.dumps(result)[:2000]}", flush=True)
    return result
