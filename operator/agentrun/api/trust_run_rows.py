"""The rows of the trust table (:mod:`agentrun.api.trust`) about the AgentRun itself: its
type and metadata, its spec (the plan, the policy, approvals, the agent and its tools) and its
status."""

from __future__ import annotations

from agentrun.api.trust_terms import (
    FIXED,
    GAP_FIRST_PASS,
    GAP_RIGHTS,
    NEW_RUNS,
    REGATED,
    RUN_STATUS,
    RUNS,
    SAME,
    STARTED,
    STATUS,
    UNAFFECTED,
    Check,
    Entry,
    Expect,
    Frozen,
    Origin,
    Outcome,
    Writer,
    by_phase,
    every,
)

RUN_ROWS: tuple[Entry, ...] = (
    # -- the run: its type and metadata -----------------------------------------------------------
    Entry(
        id="run-type",
        object="AgentRun",
        path="apiVersion, kind",
        decides="which object is a run",
        resource=RUNS,
        writers=(Writer.API_SERVER,),
        frozen=Frozen.CREATION,
        checks=(Check.NOT_USED,),
        proven=(Origin.API_SERVER,),
        mimic_is="apiVersion and kind as the API server keeps them",
        outcomes=every(
            Expect(Outcome.UNAFFECTED, "the API server keeps an object's apiVersion and kind")
        ),
        fields=("apiVersion", "kind"),
    ),
    Entry(
        id="run-metadata",
        object="AgentRun",
        path="metadata (name, namespace, uid, generation, resourceVersion)",
        decides="which run a step belongs to: Job names, owners and proofs bind the run's uid",
        resource=RUNS,
        writers=(Writer.API_SERVER,),
        frozen=Frozen.CREATION,
        checks=(Check.OWNER_UID, Check.PROOF),
        proven=(Origin.API_SERVER,),
        mimic_is="name, namespace and uid as the API server wrote them",
        mimic=every(SAME),
        outcomes=every(Expect(Outcome.REFUSED_API, "name, namespace and uid cannot change")),
        fields=("metadata.**",),
    ),
    Entry(
        id="run-identity",
        object="AgentRun",
        path="metadata.annotations[agentrun.dev/created-by, created-by-groups, last-modified-by]",
        decides="whose rights a step's references are checked against",
        resource=RUNS,
        writers=(Writer.API_SERVER,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER,),
        mimic_is="the annotations as the admission recorded them (the creator's own name)",
        mimic=every(SAME),
        outcomes=every(Expect(Outcome.REFUSED_API, "agentrun.dev/created-by cannot be changed")),
    ),
    Entry(
        id="run-labels",
        object="AgentRun",
        path="metadata.labels, metadata.annotations (others, kopf's bookkeeping)",
        decides="nothing: the operator derives every pass from spec and status",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR, Writer.OPERATOR),
        frozen=Frozen.NEVER,
        checks=(Check.NOT_USED,),
        proven=(Origin.NOT_USED,),
        mimic_is="the labels and annotations as they are",
        outcomes=every(UNAFFECTED),
    ),
    Entry(
        id="run-shard-label",
        object="AgentRun",
        path="metadata.labels[agentrun.dev/shard]",
        decides=(
            "nothing a pass decides: with shards (AGENTRUN_SHARDS), which replica's watch "
            "delivers the run's events; a run labelled with another shard is labelled again by "
            "the replica that finds it, one labelled with none is watched by every replica"
        ),
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR, Writer.OPERATOR),
        frozen=Frozen.NEVER,
        checks=(Check.NOT_USED,),
        proven=(Origin.NOT_USED,),
        mimic_is="the shard label the operator would write, written before it",
        outcomes=every(UNAFFECTED),
    ),
    Entry(
        id="run-owners",
        object="AgentRun",
        path="metadata.ownerReferences, metadata.finalizers",
        decides="nothing a step does: when the run's objects are garbage-collected",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR, Writer.OPERATOR),
        frozen=Frozen.NEVER,
        checks=(Check.NOT_USED,),
        proven=(Origin.NOT_USED,),
        mimic_is="the owner references and finalizers as they are",
        outcomes=every(UNAFFECTED),
    ),
    # -- the run's spec ---------------------------------------------------------------------------
    Entry(
        id="run-goal",
        object="AgentRun",
        path="spec.goal, spec.actor",
        decides="what an agent run's first context says (plan steps never receive it)",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.FIRST_PASS,
        checks=(Check.DIGEST,),
        proven=(Origin.EDITORS, Origin.COMMITTED_DIGEST),
        mimic_is="the creator's goal and actor, as written",
        mimic=every(SAME),
        outcomes=by_phase(
            Expect(Outcome.UNAFFECTED, "taken into the first context, chained by digest"),
            pending=Expect(
                Outcome.APPLIES,
                "an agent run's first context is assembled after the plan's steps, from the "
                "spec then; plan steps never receive it",
            ),
        ),
        fields=("spec", "spec.goal", "spec.actor"),
    ),
    Entry(
        id="step-container",
        object="AgentRun",
        path="spec.plan.steps[].container, spec.plan.steps[].inputs[]",
        decides="what a plan step runs and receives",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.LAUNCH,
        checks=(Check.ARGS_HASH, Check.CREATOR_RIGHTS),
        proven=(Origin.EDITORS, Origin.API_SERVER),
        mimic_is="the creator's plan, as written",
        mimic=every(SAME),
        gap=GAP_RIGHTS,
        outcomes=by_phase(
            REGATED,
            launching=STARTED,
            running=STARTED,
            finished=Expect(Outcome.UNAFFECTED, "a finished step never runs again"),
        ),
        fields=(
            "spec.plan",
            "spec.plan.steps",
            "spec.plan.steps[]",
            "spec.plan.steps[].container.**",
            "spec.plan.steps[].inputs.**",
        ),
    ),
    Entry(
        id="step-references",
        object="AgentRun",
        path=(
            "spec.plan.steps[] added or changed, using a Secret or ConfigMap "
            "(container.env[].valueFrom) or the run's ServiceAccount"
        ),
        decides="with whose rights a step reads a Secret or ConfigMap, or acts as the account",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.FIRST_PASS,
        checks=(Check.ADMISSION, Check.FROZEN_STEPS, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="the creator's step that reads the Secret and the ConfigMap, as written",
        mimic=every(SAME),
        outcomes=every(
            Expect(
                Outcome.REFUSED_API,
                "only the run's creator may add or change a step that uses a Secret, a "
                "ConfigMap or the run's ServiceAccount (without the policy: the step fails, "
                "Forbidden)",
            )
        ),
        fields=("spec.plan.steps[].container.env[].valueFrom.**",),
        gap=GAP_RIGHTS,
    ),
    Entry(
        id="step-gate",
        object="AgentRun",
        path="spec.plan.steps[].approval, spec.plan.steps[].risk",
        decides="whether a step waits for a person",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION,),
        proven=(Origin.API_SERVER,),
        mimic_is="the step's approval and risk, as written",
        mimic=every(SAME),
        outcomes=every(Expect(Outcome.REFUSED_API, "approval of a plan step cannot be lowered")),
        fields=("spec.plan.steps[].approval", "spec.plan.steps[].risk"),
    ),
    Entry(
        id="step-shape",
        object="AgentRun",
        path="spec.plan.steps[].name, dependsOn, description, onRejection",
        decides="which steps exist and in which order (removing a step stops it)",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.LIVE,),
        proven=(Origin.EDITORS,),
        mimic_is="the plan's steps, as written",
        mimic=every(SAME),
        outcomes=by_phase(
            Expect(
                Outcome.FAILED_CLOSED,
                "RemovedFromPlan: a step removed from the plan is cancelled, its Job stopped",
            ),
            finished=Expect(Outcome.UNAFFECTED, "a finished step is forgotten, never rerun"),
        ),
        gap=GAP_RIGHTS,
        fields=(
            "spec.plan.steps[].name",
            "spec.plan.steps[].dependsOn.**",
            "spec.plan.steps[].description",
            "spec.plan.steps[].onRejection",
        ),
    ),
    Entry(
        id="step-limits",
        object="AgentRun",
        path="spec.plan.steps[].retry, spec.plan.steps[].timeoutSeconds",
        decides="how often and how long the same approved step may run",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.LIVE,),
        proven=(Origin.EDITORS,),
        mimic_is="the step's retry and timeout, as written",
        mimic=every(SAME),
        outcomes=every(
            Expect(Outcome.APPLIES, "attempts keep the approved argsHash and idempotency key")
        ),
        fields=("spec.plan.steps[].retry.**", "spec.plan.steps[].timeoutSeconds"),
    ),
    Entry(
        id="step-template",
        object="AgentRun",
        path="spec.stepTemplate",
        decides="as whom and with which security settings every step runs",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.ARGS_HASH, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER,),
        mimic_is="spec.stepTemplate as the creator wrote it",
        mimic=every(SAME),
        outcomes=every(Expect(Outcome.REFUSED_API, "spec.stepTemplate " + FIXED)),
        fields=("spec.stepTemplate.**",),
    ),
    Entry(
        id="run-policy",
        object="AgentRun",
        path="spec.policy",
        decides="which steps need approval, by whom, which images may run",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION,),
        proven=(Origin.API_SERVER,),
        mimic_is="spec.policy as the creator wrote it",
        mimic=every(SAME),
        outcomes=every(Expect(Outcome.REFUSED_API, "spec.policy " + FIXED)),
        fields=("spec.policy.**",),
    ),
    Entry(
        id="run-approvals",
        object="AgentRun",
        path="spec.approvals[]",
        decides="which gated step runs, bound to its argsHash",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.ADMISSION, Check.ARGS_HASH),
        proven=(Origin.API_SERVER,),
        mimic_is=(
            "the approval the approver would write: the waiting step, its argsHash from status, "
            "signed with the approver's name"
        ),
        outcomes=every(
            Expect(
                Outcome.REFUSED_API,
                "a decision outside spec.policy.approverGroups, signed by another user, or an "
                "edit of an earlier one, is refused",
            )
        ),
        fields=("spec.approvals.**",),
    ),
    Entry(
        id="run-carried",
        object="AgentRun",
        path="spec.carriedResults[]",
        decides="results a fork takes instead of running a step again",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.ARGS_HASH, Check.DIGEST),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="spec.carriedResults as the creator wrote it",
        mimic=every(SAME),
        outcomes=every(Expect(Outcome.REFUSED_API, "spec.carriedResults " + FIXED)),
        fields=("spec.carriedResults.**",),
    ),
    Entry(
        id="run-controls",
        object="AgentRun",
        path="spec.suspend, spec.cancel, spec.budget, spec.retention",
        decides="whether more steps launch, and how long the run's objects stay",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.LIVE,),
        proven=(Origin.EDITORS,),
        mimic_is="suspend, cancel, budget and retention as written",
        mimic=every(SAME),
        outcomes=every(
            Expect(
                Outcome.APPLIES,
                "it only stops or allows launches of approved steps (cancel: Cancelled)",
            )
        ),
        fields=("spec.suspend", "spec.cancel", "spec.budget.**", "spec.retention.**"),
    ),
    # -- the run's spec.agent ---------------------------------------------------------------------
    Entry(
        id="agent-model",
        object="AgentRun",
        path=(
            "spec.agent.model (baseURL, name, apiKeySecretRef, settings, and fallbacks[]: each "
            "one's baseURL, name, apiKeySecretRef and temperature), spec.agent presence"
        ),
        decides="where a model turn sends the API key, and which model it asks",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.FROZEN_STATUS, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agent.model as the creator wrote it",
        mimic=every(SAME),
        outcomes=every(Expect(Outcome.REFUSED_API, "spec.agent.model." + "baseURL: " + FIXED)),
        fields=("spec.agent", "spec.agent.model.**"),
        agent=True,
        gap=GAP_FIRST_PASS,
    ),
    Entry(
        id="agent-tools",
        object="AgentRun",
        path="spec.agent.tools[]",
        decides="which tools a model turn is offered and what a call runs",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.FROZEN_STATUS, Check.ARGS_HASH),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agent.tools as the creator wrote them",
        mimic=every(SAME),
        outcomes=every(Expect(Outcome.REFUSED_API, "spec.agent.tools: " + FIXED)),
        fields=("spec.agent.tools.**",),
        agent=True,
        gap=GAP_FIRST_PASS,
    ),
    Entry(
        id="agent-http-tools",
        object="AgentRun",
        path="spec.agent.tools[].http (method, url, headers and their Secret references, body, "
        "allowedHosts, maxResponseBytes)",
        decides="where an HTTP tool's call sends its request, with which header Secrets and "
        "what body, and which hosts it may reach",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.FROZEN_STATUS, Check.ARGS_HASH, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="the HTTP tool as the creator wrote it",
        mimic=every(SAME),
        outcomes=every(
            Expect(
                Outcome.REFUSED_API,
                "spec.agent.tools[lookup]: " + FIXED + " (without the policy: AgentSpecChanged, "
                "before any further call; a call is also checked against allowedHosts by the "
                "operator and again by the pod that sends it)",
            )
        ),
        fields=("spec.agent.tools[].http.**",),
        agent=True,
        gap=GAP_FIRST_PASS,
    ),
    Entry(
        id="agent-tool-choice",
        object="AgentRun",
        path="spec.agent.toolChoice",
        decides="whether a model turn may, must or must not call a tool, or which one",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.FROZEN_STATUS),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agent.toolChoice as the creator wrote it",
        mimic=every(SAME),
        outcomes=every(Expect(Outcome.REFUSED_API, "spec.agent.toolChoice: " + FIXED)),
        fields=("spec.agent.toolChoice",),
        agent=True,
        gap=GAP_FIRST_PASS,
    ),
    Entry(
        id="agent-mcp-servers",
        object="AgentRun",
        path="spec.agent.mcpServers[] (url, header Secrets, allowed tools, risk, approval)",
        decides="where discovery and calls connect, which header Secrets they send, which tools "
        "a model turn is offered and which calls wait for approval",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.FROZEN_STATUS, Check.ARGS_HASH, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agent.mcpServers as the creator wrote them",
        mimic=every(SAME),
        outcomes=every(Expect(Outcome.REFUSED_API, "spec.agent.mcpServers: " + FIXED)),
        fields=("spec.agent.mcpServers.**",),
        agent=True,
        gap=GAP_FIRST_PASS,
    ),
    Entry(
        id="child-run",
        object="AgentRun (a sub-agent's child)",
        path="a new run naming the run as its controller (ownerReferences, label "
        "agentrun.dev/parent-uid, annotations agentrun.dev/call and agentrun.dev/proof)",
        decides="a sub-agent call's result, the tokens it counts, whose rights its steps use",
        resource=NEW_RUNS,
        writers=(Writer.OPERATOR, Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.COMMIT,
        checks=(Check.PROOF, Check.OWNER_UID, Check.DIGEST, Check.CREATOR_RIGHTS),
        proven=(Origin.HMAC, Origin.COMMITTED_UID, Origin.API_SERVER),
        outcomes=every(
            Expect(
                Outcome.UNAFFECTED,
                "a run under another name is no call's child: a call's child is only the run "
                "under the name the call's key gives, carrying the operator's proof; its "
                "outcome and tokens are read from the uid committed at adoption, and its steps "
                "act for the parent's creator only through that name",
            )
        ),
        mimic_is=(
            "the call's exact child: under the name committed with the call, the spec the call "
            "makes and the run as controller (its proof it cannot make), before the operator "
            "creates it"
        ),
        mimic=by_phase(
            Expect(Outcome.REFUSED_API, "AlreadyExists: the call's child holds the name"),
            pending=Expect(
                Outcome.NOT_APPLICABLE, "the call, and so its child's name, comes with a turn"
            ),
            waiting=Expect(
                Outcome.FAILED_CLOSED,
                "ChildNameTaken: made while the gated call waits (its child's name is "
                "committed), it carries no proof of the operator's: the call fails once "
                "approved, nothing of it runs, the forged child's answer is never the result",
            ),
            launching=Expect(
                Outcome.FAILED_CLOSED,
                "ChildNameTaken: made before the operator's create, it is not adopted; after "
                "it, the name is taken",
                alternative=Outcome.REFUSED_API,
            ),
        ),
        agent=True,
    ),
    Entry(
        id="agent-instructions",
        object="AgentRun",
        path="spec.agent.instructions",
        decides="the system message of the first context",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.FIRST_PASS,
        checks=(Check.DIGEST,),
        proven=(Origin.EDITORS, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agent.instructions as the creator wrote them",
        mimic=every(SAME),
        outcomes=by_phase(
            Expect(Outcome.UNAFFECTED, "taken into the first context, chained by digest"),
            pending=Expect(
                Outcome.APPLIES,
                "the first context is assembled after the plan's steps, from the spec then",
            ),
        ),
        fields=("spec.agent.instructions",),
        agent=True,
    ),
    Entry(
        id="agent-limits",
        object="AgentRun",
        path="spec.agent.maxTurns, maxToolCallsPerTurn, contextBytes",
        decides="how many turns and calls, and how much context, the model gets",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.LIVE,),
        proven=(Origin.EDITORS,),
        mimic_is="the agent's limits as written",
        mimic=every(SAME),
        outcomes=every(
            Expect(Outcome.APPLIES, "turns go to the frozen endpoint; calls are still gated")
        ),
        fields=(
            "spec.agent.maxTurns",
            "spec.agent.maxToolCallsPerTurn",
            "spec.agent.contextBytes",
        ),
        agent=True,
    ),
    Entry(
        id="agent-resume",
        object="AgentRun",
        path="spec.agent.resumeFrom",
        decides="which conversation a fork continues",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.CRD_RULE, Check.OWNER_UID, Check.DIGEST, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER, Origin.COMMITTED_UID, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agent.resumeFrom as the creator wrote it",
        mimic=every(SAME),
        outcomes=every(
            Expect(
                Outcome.REFUSED_API,
                "spec.agent.resumeFrom can only be set when the run is created (else the "
                "conversation it names is verified, or the run fails ResumeRefused)",
            )
        ),
        fields=("spec.agent.resumeFrom.**",),
        agent=True,
    ),
    Entry(
        id="agent-ref",
        object="AgentRun",
        path="spec.agentRef (the Agent's name, overrides, resumeFrom)",
        decides="which Agent (and through it which ModelConfig, model endpoint, API key, tools "
        "and limits) a run of an Agent uses",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.CRD_RULE, Check.FROZEN_STATUS, Check.DIGEST, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER, Origin.COMMITTED_UID, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agentRef as the creator would write it at creation",
        mimic=every(
            Expect(
                Outcome.REFUSED_API,
                "spec.agentRef can only be set when the run is created, and a run has "
                "spec.agent or spec.agentRef, not both",
            )
        ),
        outcomes=every(
            Expect(
                Outcome.REFUSED_API,
                "spec.agentRef can only be set when the run is created (without the rule: "
                "AgentSpecChanged, its digest is committed with status.agent.definition, and "
                "the Agent is read once, with the creator's rights, by the uid and "
                "generation recorded there)",
            )
        ),
        fields=("spec.agentRef.**",),
        agent=True,
    ),
    # -- the run's status -------------------------------------------------------------------------
    Entry(
        id="status-steps",
        object="AgentRun",
        path="status.steps[] (phase, attempt, jobName, argsHash, result, resultRef, resultDigest)",
        decides="what is committed as a step's result, and which Job is an attempt's",
        resource=RUN_STATUS,
        writers=(Writer.OPERATOR,),
        frozen=Frozen.COMMIT,
        checks=(Check.STATUS_ONLY,),
        proven=(Origin.RBAC,),
        mimic_is="the status as the operator wrote it",
        outcomes=every(STATUS),
        fields=("status", "status.steps.**", "status.usage.**"),
    ),
    Entry(
        id="status-agent",
        object="AgentRun",
        path="status.agent (frozen model, tools and MCP servers digests, pinned MCP tools, "
        "context digest, turn image, calls)",
        decides="what a model turn calls and reads, and which calls run",
        resource=RUN_STATUS,
        writers=(Writer.OPERATOR,),
        frozen=Frozen.FIRST_PASS,
        checks=(Check.STATUS_ONLY,),
        proven=(Origin.RBAC,),
        mimic_is="the status as the operator wrote it",
        outcomes=every(STATUS),
        fields=("status.agent.**",),
        agent=True,
    ),
    Entry(
        id="status-audit",
        object="AgentRun",
        path="status.audit, status.history[], status.historySeq",
        decides="the anchor of the audit chain",
        resource=RUN_STATUS,
        writers=(Writer.OPERATOR,),
        frozen=Frozen.COMMIT,
        checks=(Check.STATUS_ONLY,),
        proven=(Origin.RBAC,),
        mimic_is="the status as the operator wrote it",
        outcomes=every(STATUS),
        fields=("status.audit.**", "status.history.**", "status.historySeq"),
    ),
    Entry(
        id="status-run",
        object="AgentRun",
        path="status (phase, conditions, message, progress, times, observedGeneration)",
        decides="what the run reports",
        resource=RUN_STATUS,
        writers=(Writer.OPERATOR,),
        frozen=Frozen.COMMIT,
        checks=(Check.STATUS_ONLY,),
        proven=(Origin.RBAC,),
        mimic_is="the status as the operator wrote it",
        outcomes=every(STATUS),
        fields=(
            "status.observedGeneration",
            "status.phase",
            "status.conditions.**",
            "status.message",
            "status.progress",
            "status.currentStep",
            "status.startedAt",
            "status.completedAt",
        ),
    ),
)
