"""What a pool's notices leave behind in this process: their metrics and their log line.

The driver hands each ``Notice`` of its machine here, then to the platform (Events), unless
this replica only follows the pool: the leader counts the pool's swaps and records its Events,
a follower logs its notices and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import metrics
from ..logs import get_logger
from ..policy.events import WARNING_NOTICES, Notice
from ..policy import writers
from ..policy.model import Actuation, PoolKey

# the pool driver's logger: notices kept its name when they moved here (log fields are an
# interface)
log = get_logger("extproc.runtime.driver")


def report(notice: Notice, key: PoolKey, actuation: Actuation, resident: str) -> bool:
    """Count and log one notice; False when this replica follows the pool (logged only)."""
    ns, pool = key.namespace, key.name
    if actuation is Actuation.FOLLOW and notice.kind != "ActuationChanged":
        log.info(notice.message, event=notice.kind, namespace=ns, pool=pool,
                 member=notice.target or notice.source, role="follower")
        return False
    metrics.notice(ns, pool, notice.kind)
    if notice.kind in ("SwapCompleted", "SwapFailed"):
        metrics.swap_finished(ns, pool, notice.source, notice.target,
                              notice.kind == "SwapCompleted", notice.duration)
    elif notice.kind == "SwapDeferred":
        metrics.swap_deferred(ns, pool, notice.source, resident)
    elif notice.kind == "ActuationChanged" and notice.target == Actuation.HANDS_OFF.value \
            or notice.kind == "ReplicasWritten" and actuation is Actuation.LLMKUBE:
        # (llmkube mode never hands off: the report is the conflict it counts)
        metrics.conflict(ns, pool, writers.label(notice.writer))
    elif notice.kind == "Reclaimed":
        metrics.reclaimed(ns, pool, notice.source, notice.target)
    elif notice.kind in ("StreamsCut", "IdleProbeMisread"):
        metrics.requests_cut(ns, pool, notice.source, notice.kind, notice.released)
    if notice.kind == "ActuationChanged" and notice.target == Actuation.HANDS_OFF.value:
        level: Callable[..., None] = log.error  # someone fights over this pool: an operator must act
    elif notice.kind in WARNING_NOTICES:
        level = log.warning
    else:
        level = log.info
    level(notice.message, event=notice.kind, namespace=ns, pool=pool,
          member=notice.target or notice.source, source=notice.source, target=notice.target,
          duration_s=round(notice.duration, 3), released=notice.released,
          writer=notice.writer)
    return True
