"""Read one metric out of a Prometheus text exposition (format 0.0.4), as runtimes serve it."""

from __future__ import annotations

import math
import re

# name, optional {labels}, value, optional timestamp. Label values may hold spaces, braces and
# escaped quotes, so the label block is matched as quoted strings, not up to the first "}".
_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)'
                     r'(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?'
                     r'\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$')


def metric_sum(text: str, name: str) -> float | None:
    """The sum of every sample of ``name`` over its label sets; None when it has none.

    A gauge like ``vllm:num_requests_running`` has one sample per model (``model_name=...``),
    so the member's total is the sum. A sample that is not a finite number (NaN, +Inf, an
    unparsable line for ``name``) makes the whole answer None: an idle decision must never
    rest on a reading we could not make.
    """
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            if re.match(re.escape(name) + r"[\s{]", line):
                return None  # it is our metric, but not a sample we can read
            continue
        if match["name"] != name:
            continue  # a longer name with our prefix (vllm:num_requests_running_total, ...)
        try:
            value = float(match["value"])
        except ValueError:
            return None
        if not math.isfinite(value):
            return None
        total, found = total + value, True
    return total if found else None
