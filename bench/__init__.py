"""Benchmarks of the ext_proc service through a real Envoy (``make bench`` runs ``bench.run``)."""
