"""llama.cpp's ``/metrics`` for the fake member: the counters and gauges its server keeps
(server_metrics), with llama.cpp's names, help texts and types (``llamacpp:*``), counted over
the fake's own requests. The idle probe's metric mode reads them (``requests_processing``,
``requests_deferred``), as it reads llama.cpp's."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web


@dataclass
class Metrics:
    """What llama.cpp's ``/metrics`` counts (server_metrics), for the fake's own requests."""

    prompt_tokens: int = 0
    prompt_cached: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
    n_decode: int = 0
    n_busy_slots: int = 0
    n_tokens_max: int = 0
    # since the last scrape: llama.cpp averages its throughput gauges over that window
    bucket_prompt: tuple[int, float] = (0, 0.0)
    bucket_predicted: tuple[int, float] = (0, 0.0)


_COUNTERS = [
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding "
                       "and multimodal decoding"),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total",
     "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
]
_GAUGES = [
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call"),
]


def exposition(m: Metrics, busy: int, deferred: int) -> web.Response:
    """The Prometheus text of ``m``, ``busy`` slots processing and ``deferred`` tasks waiting;
    a scrape starts the throughput gauges' next window, as llama.cpp's does."""
    decodes = max(m.n_decode, 1)
    counters = [m.prompt_tokens, m.prompt_cached, m.prompt_seconds, m.predicted_tokens,
                m.predicted_seconds, m.n_decode, m.n_tokens_max, 0, 0, 0]
    (pn, ps), (gn, gs) = m.bucket_prompt, m.bucket_predicted
    gauges = [pn / ps if ps else 0, gn / gs if gs else 0,
              busy, deferred, m.n_busy_slots / decodes]
    m.bucket_prompt = m.bucket_predicted = (0, 0.0)  # a scrape starts the next window
    lines = []
    for kind, items, values in (("counter", _COUNTERS, counters),
                                ("gauge", _GAUGES, gauges)):
        for (name, help_text), value in zip(items, values):
            lines += [f"# HELP llamacpp:{name} {help_text}",
                      f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value:g}"]
    return web.Response(body=("\n".join(lines) + "\n").encode(),
                        headers={"Content-Type": "text/plain; version=0.0.4"})
