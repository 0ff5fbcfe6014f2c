"""A lost activation in llmkube mode, three replicas: both reproductions end served.

The same scenarios as test_e2e_lost_activation.py (lost_activation.py) behind three ext_proc
replicas: any of them may have triggered, any may hold the target's request or its retry, and
the one that gets the resident's request must admit it.
"""

from __future__ import annotations

from lost_activation import docs, scenario_tests

STACK_OPTIONS = {"actuation": "llmkube", "replicas": 3}
STACK_DOCS = docs("3")
(test_an_activation_lost_by_a_stale_pass_ends_served,
 test_an_activation_undone_while_the_reconciler_is_paused_ends_served) = scenario_tests("3")
