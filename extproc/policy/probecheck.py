"""The idle probe cross-checked by what we see: a member unloaded, or read idle, mid-stream.

LLMKube unloads an incumbent once its idle probe says idle; a probe that always reads idle
(LLMKube #1800 / #1830: a runtime whose metric or endpoint the probe annotations do not fit)
cuts generations mid-stream. Our own accounting knows better: the requests in flight on the
member here and on every live replica (their membership Leases). So:

* llmkube mode: when a member goes from scaled up to 0 replicas while that accounting shows
  requests in flight on it, the machine raises ``StreamsCut`` (a Warning Event on the pool,
  counted per member in ``modelpool_extproc_requests_cut_total`` with this replica's cut
  requests, alert ``ModelPoolStreamsCut``);
* own mode: when the idle probe answers idle while that accounting shows requests in flight
  on the probed member, it raises ``IdleProbeMisread`` the same way (the swap still drains:
  the answer only lets the probe stage pass, the drain edges count requests themselves).

Both name the member's probe annotations, the place to look. Rules of this file: it owns no
state and changes nothing; it reads the pool through ``pool.PoolReader`` and returns notices.
"""

from __future__ import annotations

from .events import Notice
from .ifidle import in_flight
from .model import Actuation, MemberObservation
from .pool import PoolReader
from ..names import PROBE_ANNOTATIONS

_LOOK = f"check its idle probe ({', '.join(PROBE_ANNOTATIONS)}, or its runtime's /slots)"


def scaled_down(m: PoolReader, before: MemberObservation | None,
                obs: MemberObservation) -> list[Notice]:
    """llmkube mode: ``StreamsCut`` when LLMKube scaled ``obs`` to 0 under streams we see."""
    if m.actuation is not Actuation.LLMKUBE or before is None or before.replicas == 0 \
            or obs.replicas > 0:
        return []
    seen = in_flight(m, obs.name)
    if not seen:
        return []
    here = m.requests.busy(obs.name)
    return [Notice("StreamsCut", f"LLMKube scaled {obs.name} down with {seen} request(s) in "
                  f"flight on it ({here} on this replica): its idle probe read idle while it "
                  f"served; {_LOOK}", source=obs.name, released=here)]


def probed_idle(m: PoolReader, member: str, idle: bool | None) -> list[Notice]:
    """Own mode: ``IdleProbeMisread`` when the probe says idle under streams we see."""
    if idle is not True or m.actuation is not Actuation.OWN:
        return []
    seen = in_flight(m, member)
    if not seen:
        return []
    return [Notice("IdleProbeMisread", f"the idle probe of {member} answered idle while "
                  f"{seen} request(s) are in flight on it; {_LOOK}", source=member,
                  released=m.requests.busy(member))]
