"""The limits of the AgentRun API (lengths and counts that keep objects far below etcd's
object limit and CEL costs bounded), the annotations set at admission and the patterns
fields are checked against.

Part of :mod:`agentrun.api.models`, which re-exports every name here.
"""

from __future__ import annotations

from agentrun.api.names import GROUP

# Limits that keep objects far below etcd's 1.5 MiB object limit and CEL costs bounded.
MAX_GOAL = 4096
"""Longest spec.goal (characters); a follow-up question is one."""


# MAX_STEPS and MAX_DEPENDENCIES are set by the API server's cost budget for the CEL rule that
# checks every dependsOn entry names a step (its estimated cost grows as steps^2 * deps):
# 128 x 16 fits, 500 x 32 is refused as 26x over budget.
MAX_STEPS = 128


MAX_DEPENDENCIES = 16


MAX_INPUTS = 32


MAX_APPROVALS = 64


MAX_HISTORY = 50


MAX_HISTORY_HARD = 1000
"""History keeps entries the audit record has not stored yet, up to this many."""


MAX_INLINE_RESULT = 4096
"""Longest result kept in status (spec.carriedResults[].result has the same bound)."""


MAX_SUMMARY = 1024


MAX_MESSAGE = 1024


MAX_REASON = 128


MAX_TOKENS = 2**53 - 1
"""Token counts in status are clamped to this (exact in any JSON reader, within int64)."""


ANNOTATION_CREATED_BY = f"{GROUP}/created-by"
"""Set at admission (MutatingAdmissionPolicy) to the user who created the run."""


ANNOTATION_CREATED_BY_GROUPS = f"{GROUP}/created-by-groups"
"""Set at admission with created-by: the creating user's groups, a JSON array of strings."""


ANNOTATION_MODIFIED_BY = f"{GROUP}/last-modified-by"
"""Set at admission to the user who last changed the run's spec."""


DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


ARGS_HASH_PATTERN = r"^[a-f0-9]{64}$"
