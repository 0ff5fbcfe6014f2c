"""Idle probes: llama.cpp ``/slots``, vLLM ``/metrics``, LLMKube's idle annotations."""

from extproc.platform.kube.idle.probes import IdleProbe, choose_probe, probe_url, run_probe
from extproc.platform.kube.idle.slots import probe_idle

__all__ = ["IdleProbe", "choose_probe", "probe_idle", "probe_url", "run_probe"]
