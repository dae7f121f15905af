"""The AgentRun API: :mod:`agentrun.api.models` (with the agent loop's models from
:mod:`agentrun.api.agent`) and the CRD generated from them (:mod:`agentrun.api.crd`)."""

# models first: it imports agent at its end, and agent builds on models.
from agentrun.api import models as models
