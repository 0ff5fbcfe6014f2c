"""Idle probes for every runtime against real HTTP servers on 127.0.0.1 that answer in each
runtime's own format: vLLM's Prometheus /metrics, a custom image's metric and health path."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from kube_helpers import serving_answers

from extproc.platform.kube.idle import IdleProbe, choose_probe, run_probe
from extproc.platform.kube.idle.prometheus import metric_sum

MODEL = "Qwen/Qwen2.5-7B-Instruct"


def vllm_metrics(running: float, waiting: float, *, engines: int = 1) -> str:
    """A /metrics page as vLLM's OpenAI server serves it (V1 engine), trimmed to a few families."""
    lines = ["# HELP python_gc_objects_collected_total Objects collected during gc",
             "# TYPE python_gc_objects_collected_total counter",
             'python_gc_objects_collected_total{generation="0"} 11873.0',
             "# HELP vllm:num_requests_running Number of requests in model execution batches.",
             "# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="{e}",model_name="{MODEL}"}} {running / engines}'
              for e in range(engines)]
    lines += ["# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
              "# TYPE vllm:num_requests_waiting gauge"]
    lines += [f'vllm:num_requests_waiting{{engine="{e}",model_name="{MODEL}"}} {waiting / engines}'
              for e in range(engines)]
    lines += ["# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
              "# TYPE vllm:kv_cache_usage_perc gauge",
              f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.42',
              "# HELP vllm:num_requests_running_total A longer name sharing the prefix.",
              "# TYPE vllm:num_requests_running_total counter",
              f'vllm:num_requests_running_total{{engine="0",model_name="{MODEL}"}} 77.0',
              "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency.",
              "# TYPE vllm:e2e_request_latency_seconds histogram",
              f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="0.3",model_name="{MODEL}"}} 3.0',
              f'vllm:e2e_request_latency_seconds_count{{engine="0",model_name="{MODEL}"}} 9.0']
    return "\n".join(lines) + "\n"


PAGES: dict[str, tuple[int, str]] = {
    "idle": (200, vllm_metrics(0, 0)),
    "running": (200, vllm_metrics(2, 0)),
    "waiting": (200, vllm_metrics(0, 1)),
    "two-engines-idle": (200, vllm_metrics(0, 0, engines=2)),
    "two-engines-busy": (200, vllm_metrics(1, 0, engines=2)),
    "no-waiting": (200, vllm_metrics(0, 0).replace("vllm:num_requests_waiting", "other")),
    "nan": (200, vllm_metrics(0, 0).replace("} 0.0\n# HELP vllm:num_requests_waiting",
                                            "} NaN\n# HELP vllm:num_requests_waiting")),
    "error": (503, "engine dead"),
    "custom-3": (200, "# TYPE queue_depth gauge\nqueue_depth{worker=\"a\"} 1\n"
                      "queue_depth{worker=\"b\"} 2\n"),
    "health-ok": (204, ""),
    "health-busy": (429, "busy"),
}


@pytest.fixture
async def runtime_server() -> AsyncIterator[str]:
    """Serve each page at /<case>/<anything> on a free loopback port; yields the base URL."""
    async with serving_answers("/{case}/{tail:.*}", PAGES,
                               "text/plain; version=0.0.4") as base:
        yield base


async def _ask(base: str, probe: IdleProbe, case: str) -> bool | None:
    # the member's probe URL template names a path; the probe puts its own on that host:port
    probe = IdleProbe(probe.kind, f"/{case}{probe.path}", probe.metrics, probe.threshold)
    async with aiohttp.ClientSession() as session:
        return await run_probe(session, probe, f"{base}/ignored/slots", 2.0)


@pytest.mark.parametrize("case, expected", [
    ("idle", True), ("running", False), ("waiting", False), ("two-engines-idle", True),
    ("two-engines-busy", False), ("no-waiting", None), ("nan", None), ("error", None),
])
async def test_vllm_probe(runtime_server: str, case: str, expected: bool | None) -> None:
    probe = choose_probe({}, "vllm")
    assert probe is not None and probe.path == "/metrics"
    assert await _ask(runtime_server, probe, case) is expected


@pytest.mark.parametrize("threshold, case, expected", [
    ("", "custom-3", False), ("3", "custom-3", True), ("2.5", "custom-3", False),
    ("not-a-number", "custom-3", False), ("5", "idle", None), ("5", "error", None),
])
async def test_metric_annotation_probe(runtime_server: str, threshold: str, case: str,
                                       expected: bool | None) -> None:
    annotations = {"inference.llmkube.dev/idle-metric": "queue_depth",
                   "inference.llmkube.dev/idle-metric-path": "/stats/prom"}
    if threshold:
        annotations["inference.llmkube.dev/idle-metric-threshold"] = threshold
    probe = choose_probe(annotations, "generic")
    assert probe is not None and probe.path == "/stats/prom"
    assert await _ask(runtime_server, probe, case) is expected


async def test_metric_annotation_reads_vllm_gauge_by_name(runtime_server: str) -> None:
    probe = choose_probe({"inference.llmkube.dev/idle-metric": "vllm:num_requests_running"},
                         "generic")
    assert probe is not None and probe.path == "/metrics"
    assert await _ask(runtime_server, probe, "idle") is True
    assert await _ask(runtime_server, probe, "running") is False
    # only the running gauge is named: a waiting request does not count for this probe
    assert await _ask(runtime_server, probe, "waiting") is True


@pytest.mark.parametrize("case, expected", [("health-ok", True), ("health-busy", False)])
async def test_endpoint_annotation_probe(runtime_server: str, case: str, expected: bool) -> None:
    probe = choose_probe({"inference.llmkube.dev/idle-endpoint": "/healthz"}, "generic")
    assert probe is not None and probe.path == "/healthz"
    assert await _ask(runtime_server, probe, case) is expected


async def test_endpoint_on_a_closed_port_is_unknown() -> None:
    probe = choose_probe({"inference.llmkube.dev/idle-endpoint": "/healthz"}, "generic")
    assert probe is not None
    async with aiohttp.ClientSession() as session:
        assert await run_probe(session, probe, "http://127.0.0.1:9/x", 2.0) is None


def test_choice_of_probe() -> None:
    metric = {"inference.llmkube.dev/idle-metric": "queue_depth"}
    endpoint = {"inference.llmkube.dev/idle-endpoint": "/healthz"}
    assert choose_probe({}, "").kind == choose_probe({}, "llamacpp").kind == "llama.cpp-slots"
    assert choose_probe({}, "vllm").metrics == ("vllm:num_requests_running",
                                               "vllm:num_requests_waiting")
    # the metric annotation wins, on any runtime
    assert choose_probe({**metric, **endpoint}, "vllm").kind == "metric"
    # a health check never replaces a native probe
    assert choose_probe(endpoint, "vllm").kind == "vllm-metrics"
    assert choose_probe(endpoint, "llamacpp").kind == "llama.cpp-slots"
    assert choose_probe(endpoint, "sglang").kind == "endpoint"
    # nothing to ask: the caller fails closed
    assert choose_probe({}, "generic") is None and choose_probe({}, "tgi") is None


def test_metric_sum_reads_labels_with_quotes_braces_and_timestamps() -> None:
    text = ('# TYPE m gauge\nm{a="x \\"}\\" y",b="{"} 2 1700000000000\nm 0.5\n'
            'm_total 9\nmm 4\n')
    assert metric_sum(text, "m") == 2.5
    assert metric_sum(text, "absent") is None
    assert metric_sum("m{a=\"1\"} +Inf\n", "m") is None
    assert metric_sum("m{broken 1\n", "m") is None
