"""The AgentRun API: :mod:`agentrun.api.models` (its spec and run, with the enums of
:mod:`agentrun.api.phases`, the limits of :mod:`agentrun.api.limits`, the step pods' defaults of
:mod:`agentrun.api.step_template` and the status of :mod:`agentrun.api.run_status`; the agent
loop's models from :mod:`agentrun.api.agent` and :mod:`agentrun.api.agent_status`; all built on
:mod:`agentrun.api.base`), the CRD generated from them (:mod:`agentrun.api.crd`) and the names
that need no models (:mod:`agentrun.api.names`).

Nothing is imported here, so that a program that needs only the names (a step's pod) does not
load the models."""
