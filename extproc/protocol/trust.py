"""What a client's own headers may decide: the trust the operator grants them.

The priority headers (``x-modelpool-priority``, ``x-gateway-inference-objective``) reach the
service from any client unless the gateway strips them; ``--client-priority`` says how far
they are believed (docs/operations.md, "Security: hostile clients").
"""

from __future__ import annotations

from collections.abc import Mapping


def granted(mode: str, objective: str, rank: int | None,
            priorities: Mapping[str, int]) -> tuple[str, int | None]:
    """The objective and priority a request keeps under ``--client-priority`` ``mode``: as
    sent (trust), none (ignore), or lowered only: what they name, capped at the default 0."""
    if mode == "trust":
        return objective, rank
    if mode == "ignore":
        return "", None
    return objective, min(rank if rank is not None else priorities.get(objective, 0), 0)
