"""The swap policy: pure, deterministic, checked exhaustively (tests/policy).

Rules of this package
---------------------
* Everything that decides who owns the pool's GPU slot, and when a request may pass, lives
  in ``extproc/policy``. Nothing here awaits, sleeps, reads a clock, or talks to gRPC or
  Kubernetes: callers feed events (with the current time) in and carry the returned
  commands out.
* ``machine.py`` composes the pool's concerns and is the one place where they meet: it routes each
  event to the concern it belongs to, and it alone assigns the machine's own state (the spec,
  what the cluster showed, the resident, the swap under way, failures, deferral, wishes).
  Each concern owns its state in a dataclass next to its rules: ``modes.Hands`` (who actuates,
  the fight detector, hands-off spells), ``replicas.Fleet`` (the other replicas, the admission
  and leader Leases, the drain announcement), ``reclaim.PolicyMemory`` (the resident's idle
  clock), ``requests.RequestBook`` (every request), ``forecast.SwapHistory`` (durations).
  Concerns read the machine through ``pool.PoolReader``; the edges of the transition table
  (``swap.py``, the only place a stage changes) change it through ``pool.PoolWriter``.
* An event that cannot happen in the current state (an unknown request id, a member that is
  not in the pool) is a caller bug and raises ``PolicyError``. The machine is then *broken*:
  every later call raises too, so no caller can go on with a half-changed machine whose
  commands were lost. The runtime answers the pool's held requests and closes it.
"""
