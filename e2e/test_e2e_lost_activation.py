"""A lost activation in llmkube mode, one replica: both reproductions end served.

LLMKube's reconciler sometimes drops our trigger and settles back on the resident; the service
must notice and trigger again (scenarios in lost_activation.py). Until it does, these fail:
the target's request and its retries get 503 while nothing swaps, and the resident's request
is held for the whole budget.
"""

from __future__ import annotations

from lost_activation import docs, scenario_tests

STACK_OPTIONS = {"actuation": "llmkube"}
STACK_DOCS = docs("")
(test_an_activation_lost_by_a_stale_pass_ends_served,
 test_an_activation_undone_while_the_reconciler_is_paused_ends_served) = scenario_tests("")
