"""Part 1c (``--only ablation``): what each part of our Envoy config costs Envoy, by its absence.

Part 6's harness (one ext_proc and one Envoy per variant, interleaved rounds, CPU seconds of
each process per 1,000 requests), small body, c=32. Every variant still routes every request
to its member: a part that correctness needs in a mode is only taken out in the other mode
(the buffer filter, needed when the headers message is skipped, comes out in the two-message
mode, where the ext_proc holds the request itself). The route-cache clear goes with every
routing answer in either mode (Envoy must re-pick the route the answer decides), so it is not
a part to take out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import envoycfg, handoffs

SHIPPED = handoffs.Variant("one message (shipped)")
VARIANTS = (
    SHIPPED,
    handoffs.Variant("one, no response headers", changes="envoy:no-response-headers"),
    handoffs.Variant("one, no retry policy", changes="envoy:no-retry-policy"),
    handoffs.Variant("one, no access log", changes="envoy:no-access-log"),
    handoffs.Variant("two messages", mode="two"),
    handoffs.Variant("two, no request attributes", mode="two",
                     changes="envoy:no-request-attributes"),
    handoffs.Variant("two, no buffer filter", mode="two", changes="envoy:no-buffer-filter"),
    handoffs.Variant("two, bare", mode="two", changes=",".join(
        f"envoy:{name}" for name in envoycfg.EDITS)),
)


def run(workdir: Path, rounds: int = 3, seconds: int = 5) -> dict[str, Any]:
    """Every variant, interleaved, small body, c=32; part 6's medians plus the totals."""
    result = handoffs.run(workdir, rounds, seconds, concurrencies=(32,), variants=VARIANTS)
    for row in result["summary"]["c32"].values():
        if "extproc_cpu_s_per_1k" in row:
            row["total_cpu_s_per_1k"] = round(row["extproc_cpu_s_per_1k"]
                                              + row["envoy_cpu_s_per_1k"], 4)
    return result
