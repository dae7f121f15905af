"""The AgentRun API: :mod:`agentrun.api.models` (with the agent loop's models from
:mod:`agentrun.api.agent`, both built on :mod:`agentrun.api.base`) and the CRD generated from
them (:mod:`agentrun.api.crd`)."""

from agentrun.api import models as models
