"""The AgentRun API: :mod:`agentrun.api.models` (with the agent loop's models from
:mod:`agentrun.api.agent`, both built on :mod:`agentrun.api.base`), the CRD generated from
them (:mod:`agentrun.api.crd`) and the names that need no models (:mod:`agentrun.api.names`).

Nothing is imported here, so that a program that needs only the names (a step's pod) does not
load the models."""
