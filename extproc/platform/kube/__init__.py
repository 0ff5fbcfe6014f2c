"""Kubernetes side of the platform layer: watch pools and members, scale, publish status, events.

Layering: this package may import ``extproc.policy`` (value types, events), ``extproc.platform
.contract`` and ``.hostport``, ``extproc.settings``, ``extproc.backoff``, ``extproc.metrics`` and
``extproc.logs`` only; the runtime drives it, never the other way round. ``platform.KubePlatform`` is the one
entry point; every API call goes through ``_calls.counted`` so ``KUBE_REQUESTS`` sees all of them.
"""
