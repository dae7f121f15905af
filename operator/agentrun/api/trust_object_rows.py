"""The rows of the trust table (:mod:`agentrun.api.trust`) about the objects around a run: the
step Jobs, their pods, the ConfigMaps and Secrets steps and the operator write or read, and
what only cluster admins hold."""

from __future__ import annotations

from agentrun.api.names import GROUP
from agentrun.api.trust_terms import (
    CONFIGMAPS,
    CRDS,
    EVENTS,
    GAP_JOB_PODS,
    GAP_POD_DOORS,
    GAP_POD_GATE,
    GAP_PROOF,
    GAP_REFERENCED,
    GAP_TRANSCRIPT,
    JOBS,
    NAMESPACES,
    NO_JOB,
    NO_POD,
    POD_DOORS,
    POD_STATUS,
    PODS,
    SAME,
    SECRETS,
    SHARD_LEASES,
    SIGNING_KEY,
    TAKEN,
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

OBJECT_ROWS: tuple[Entry, ...] = (
    # -- step Jobs --------------------------------------------------------------------------------
    Entry(
        id="job-create",
        object="Job",
        path="a Job under an attempt's name, made by someone else (before or after the launch)",
        decides="whose Job counts as the attempt",
        resource=JOBS,
        writers=(Writer.EDITOR,),
        frozen=Frozen.CREATE,
        checks=(Check.PROOF, Check.DRY_RUN),
        proven=(Origin.HMAC,),
        outcomes=by_phase(
            Expect(
                Outcome.FAILED_CLOSED,
                "JobNameTaken: the attempt fails, its retry runs under a new name",
            ),
            launching=Expect(
                Outcome.FAILED_CLOSED,
                "JobNameTaken: made before the operator's create, the attempt fails; after it, "
                "the name is taken",
                alternative=Outcome.REFUSED_API,
            ),
            running=TAKEN,
            finished=TAKEN,
        ),
        mimic_is=(
            "the operator's exact Job for the approved attempt (the core's own decision, "
            "jobs.build_job), made before the operator creates it: all but the proof"
        ),
        mimic=by_phase(
            Expect(
                Outcome.FAILED_CLOSED,
                "JobNameTaken: it carries no proof of the operator's; the attempt fails, its "
                "retry runs under a new name",
            ),
            pending=Expect(
                Outcome.NOT_APPLICABLE,
                "the exact Job binds the input the earlier step has not committed yet",
            ),
            launching=Expect(
                Outcome.FAILED_CLOSED,
                "JobNameTaken: made before the operator's create, the attempt fails; after it, "
                "the name is taken",
                alternative=Outcome.REFUSED_API,
            ),
            running=TAKEN,
            finished=TAKEN,
        ),
        gap=GAP_PROOF,
    ),
    Entry(
        id="job-proof",
        object="Job",
        path="metadata.annotations[agentrun.dev/proof]",
        decides="whether a Job found under an attempt's name is the operator's",
        resource=JOBS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.CREATE,
        checks=(Check.JOB_UID, Check.PROOF),
        proven=(Origin.HMAC,),
        mimic_is="the operator's own proof, written again",
        outcomes=by_phase(UNAFFECTED, pending=NO_JOB, waiting=NO_JOB, launching=NO_JOB),
        gap=GAP_PROOF,
    ),
    Entry(
        id="job-labels",
        object="Job",
        path=(
            "metadata.labels[agentrun.dev/run-uid, step, attempt, shard], metadata.ownerReferences"
        ),
        decides=(
            "nothing: a Job this process created is its attempt's by uid (the shard label only "
            "which replica's watch delivers it; read directly when a watch loses it)"
        ),
        resource=JOBS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.JOB_UID,),
        proven=(Origin.HMAC,),
        mimic_is="the operator's own labels and owner references, written again",
        outcomes=by_phase(UNAFFECTED, pending=NO_JOB, waiting=NO_JOB, launching=NO_JOB),
        gap=GAP_PROOF,
    ),
    Entry(
        id="job-spec",
        object="Job",
        path="spec (parallelism, activeDeadlineSeconds, suspend; the template is immutable)",
        decides="how many pods run the step, and for how long",
        resource=JOBS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.CREATE,
        checks=(Check.JOB_UID, Check.DRY_RUN, Check.POD_TEMPLATE, Check.ONE_POD),
        proven=(Origin.HMAC,),
        mimic_is="the operator's own parallelism, written again",
        outcomes=by_phase(
            Expect(Outcome.UNAFFECTED, "a finished Job starts no pod"),
            running=Expect(
                Outcome.UNAFFECTED,
                "parallelism raised: the Job controller's second pod of the attempt is held by "
                "the operator's scheduling gate and never starts; the approved command runs once",
            ),
            pending=NO_JOB,
            waiting=NO_JOB,
            launching=NO_JOB,
        ),
    ),
    Entry(
        id="job-finalizer",
        object="Job",
        path="metadata.finalizers[agentrun.dev/outcome], deletion",
        decides="whether an attempt's outcome is seen before its Job goes",
        resource=JOBS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.JOB_UID,),
        proven=(Origin.HMAC,),
        outcomes=by_phase(
            Expect(
                Outcome.FAILED_CLOSED,
                "JobLost: a deleted attempt counts as lost, its retry is a new attempt",
            ),
            pending=NO_JOB,
            waiting=NO_JOB,
            launching=NO_JOB,
            finished=Expect(Outcome.UNAFFECTED, "the outcome is committed"),
        ),
        mimic_is=(
            "the attempt's Job deleted (its outcome finalizer removed) and made again exactly, "
            "its proof copied"
        ),
        mimic=by_phase(
            Expect(
                Outcome.KNOWN_GAP,
                "a proof binds the name, not the uid: while the operator that created or "
                "verified the attempt's Job runs, it knows that Job's uid and the copy holds "
                "the name in vain (JobNameTaken), or the deletion is seen first (JobLost); an "
                "operator restarted in between takes the copy as the same attempt, which may "
                "run the approved command again with the same idempotency key",
            ),
            pending=NO_JOB,
            waiting=NO_JOB,
            launching=NO_JOB,
            finished=Expect(Outcome.UNAFFECTED, "the outcome is committed"),
        ),
        gap=GAP_PROOF,
    ),
    # -- step pods --------------------------------------------------------------------------------
    Entry(
        id="pod-create",
        object="Pod",
        path="a pod carrying a step Job's selector label (batch.kubernetes.io/controller-uid)",
        decides="which pod's end is the attempt's outcome",
        resource=PODS,
        writers=(Writer.JOB_CONTROLLER, Writer.EDITOR),
        frozen=Frozen.CREATE,
        checks=(Check.ADMISSION, Check.POD_TEMPLATE),
        proven=(Origin.API_SERVER,),
        mimic_is=(
            "the Job controller's pod: the Job's template, its selector labels and the Job as "
            "controller"
        ),
        outcomes=by_phase(
            Expect(
                Outcome.REFUSED_API,
                "only the Job controller may create a pod with a Job's selector label",
            ),
            pending=NO_POD,
            waiting=NO_POD,
            launching=NO_POD,
        ),
        gap=GAP_JOB_PODS,
    ),
    Entry(
        id="pod-spec",
        object="Pod",
        path="Pod spec.containers (image), metadata.labels, deletion",
        decides="what the step's pod runs",
        resource=PODS,
        writers=(Writer.JOB_CONTROLLER, Writer.EDITOR),
        frozen=Frozen.CREATE,
        checks=(Check.POD_TEMPLATE,),
        proven=(Origin.API_SERVER,),
        mimic_is="the pod's labels as the Job controller wrote them",
        mimic=by_phase(SAME, pending=NO_POD, waiting=NO_POD, launching=NO_POD),
        outcomes=by_phase(
            Expect(
                Outcome.FAILED_CLOSED,
                "RetryScheduled: the attempt whose pod is gone fails, the step's retry policy "
                "applies (a pod that does not run its Job's template never counts); a command "
                "that ends within its pod's grace period was the approved one, run once, and "
                "its result counts",
                alternative=Outcome.UNAFFECTED,
            ),
            pending=NO_POD,
            waiting=NO_POD,
            launching=NO_POD,
            finished=Expect(Outcome.UNAFFECTED, "the outcome is committed"),
        ),
        gap=GAP_JOB_PODS,
    ),
    Entry(
        id="pod-gate",
        object="Pod",
        path="Pod spec.schedulingGates[agentrun.dev/start]",
        decides="which pod of an attempt runs its command",
        resource=PODS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.ONE_POD,),
        proven=(Origin.API_SERVER,),
        mimic_is="the operator's own write: the gate removed from the attempt's pods (the change)",
        outcomes=by_phase(
            Expect(Outcome.NOT_APPLICABLE, "a finished Job makes no second pod"),
            running=Expect(
                Outcome.UNAFFECTED,
                "the attempt's one pod was let start already, and an editor cannot make the Job "
                "start another (completions 1; the job-pods policy refuses pods with its label): "
                "a held second pod exists only when the Job controller made one",
            ),
            pending=NO_POD,
            waiting=NO_POD,
            launching=NO_POD,
            finished=Expect(Outcome.NOT_APPLICABLE, "a finished Job makes no second pod"),
        ),
        gap=GAP_POD_GATE,
    ),
    Entry(
        id="pod-status",
        object="Pod",
        path="status (container states, termination message: the step's envelope)",
        decides="a step's outcome and result",
        resource=POD_STATUS,
        writers=(Writer.NODE, Writer.STEP_POD),
        frozen=Frozen.COMMIT,
        checks=(Check.RBAC, Check.POD_TEMPLATE),
        proven=(Origin.NODE, Origin.RBAC),
        mimic_is=(
            "the kubelet's status: the step's container terminated, exit 0, its genuine envelope"
        ),
        outcomes=by_phase(
            Expect(Outcome.REFUSED_RBAC, "namespace users may not write pods/status"),
            pending=NO_POD,
            waiting=NO_POD,
            launching=NO_POD,
        ),
    ),
    Entry(
        id="pod-refusals",
        object="Event",
        path="the Job controller's FailedCreate Events about a step Job",
        decides="whether an attempt failed because its pod was refused",
        resource=EVENTS,
        writers=(Writer.JOB_CONTROLLER, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.JOB_UID,),
        proven=(Origin.EDITORS,),
        mimic_is="the Job controller's own FailedCreate Event about the Job's uid (the change)",
        outcomes=by_phase(
            Expect(Outcome.UNAFFECTED, "a refusal counts only while the Job has no pod"),
            pending=NO_JOB,
            waiting=NO_JOB,
            launching=Expect(
                Outcome.FAILED_CLOSED,
                "PodRefused: an Event about the Job's uid while it has no pod fails the attempt "
                "and deletes its Job (as a deletion would): at once, or, for a refusal that may "
                "pass (a ServiceAccount not made yet, an exceeded quota, an overloaded API "
                "server), once AGENTRUN_REFUSAL_GRACE_SECONDS after its intent if the Job "
                "still has no pod; the step's retry policy applies",
                alternative=Outcome.UNAFFECTED,
            ),
            finished=Expect(Outcome.UNAFFECTED, "the outcome is committed"),
        ),
    ),
    Entry(
        id="pod-doors",
        object="Pod",
        path=(
            "subresources exec, attach, portforward, proxy, ephemeralcontainers of step and "
            "executor pods"
        ),
        decides="what runs inside a step's or an executor's pod besides its command, and so the "
        "result it reports (its termination message, the executor's answer)",
        resource=POD_DOORS,
        writers=(Writer.EDITOR, Writer.CLUSTER_ADMIN),
        frozen=Frozen.NEVER,
        checks=(Check.ADMISSION,),
        proven=(Origin.API_SERVER,),
        outcomes=by_phase(
            NO_POD,
            running=Expect(
                Outcome.REFUSED_API,
                "the agentrun-pod-doors admission policy refuses exec, attach, port-forward, "
                "proxy and ephemeral containers into step and executor pods for all but "
                "cluster admins (without the policy, an exec can rewrite the result before the "
                "pod ends)",
            ),
            finished=Expect(Outcome.NOT_APPLICABLE, "the step's pod has ended: nothing runs in it"),
        ),
        mimic_is="the same doors: the step's own process is the only writer of its result",
        gap=GAP_POD_DOORS,
    ),
    # -- ConfigMaps and Secrets -------------------------------------------------------------------
    Entry(
        id="result-object",
        object="ConfigMap (result)",
        path="data.result of a step's result object",
        decides="a large result, and the input of the steps that read it",
        resource=CONFIGMAPS,
        writers=(Writer.OPERATOR, Writer.STEP_POD, Writer.EDITOR),
        frozen=Frozen.COMMIT,
        checks=(Check.OWNER_UID, Check.DIGEST, Check.PROOF, Check.ARGS_HASH),
        proven=(Origin.COMMITTED_DIGEST, Origin.HMAC, Origin.NODE),
        outcomes=by_phase(
            Expect(
                Outcome.FAILED_CLOSED,
                "ResultTampered: a result object made or changed by someone else is not used; "
                "the step reading it fails before its Job exists",
            ),
            launching=Expect(
                Outcome.FAILED_CLOSED,
                "ResultTampered: changed before the reading step's Job is built, it is not "
                "used; after, the Job holds the verified bytes",
                alternative=Outcome.UNAFFECTED,
            ),
            running=Expect(Outcome.UNAFFECTED, "the reading step's Job holds the verified bytes"),
            finished=Expect(Outcome.UNAFFECTED, "the reading step's Job held the verified bytes"),
        ),
        mimic_is=(
            "the step runner's exact result object for the attempt of a step whose result is "
            "over 3 KiB (its name, labels, `agentrun.dev/complete`, immutable, the run as "
            "controller), its content forged, made before the runner stores it"
        ),
        mimic=by_phase(
            Expect(
                Outcome.FAILED_CLOSED,
                "ResultTampered: the runner never takes an object found under the attempt's "
                "name as an earlier attempt's (no replay): the step's command runs, and its "
                "store meets a name it did not take, so the attempt fails and nothing is "
                "referenced",
            ),
            finished=Expect(
                Outcome.UNAFFECTED,
                "the result and its digest are committed; an object made again under the name "
                "is never read as it",
            ),
        ),
    ),
    Entry(
        id="executor-result",
        object="ConfigMap (executor result)",
        path="data.result of a model turn's or an MCP call's result object, written by the "
        "run's executor under the attempt's result object name (an output over 3 KiB)",
        decides="a model turn's output (its message and tool calls) or an MCP call's result",
        resource=CONFIGMAPS,
        writers=(Writer.EXECUTOR, Writer.EDITOR),
        frozen=Frozen.COMMIT,
        checks=(Check.DIGEST, Check.OWNER_UID),
        proven=(Origin.COMMITTED_DIGEST, Origin.NODE),
        outcomes=by_phase(
            Expect(
                Outcome.UNAFFECTED,
                "turn 1's outcome is committed (by its digest when by reference): an object "
                "made or changed under its name after is never read as it",
            ),
            pending=Expect(
                Outcome.FAILED_CLOSED,
                "ResultTampered: made before the executor stores the turn's output (the mimic), "
                "or changed after it stored it and before the operator read it: the executor's "
                "answer carries the digest of what it stored, the executor never takes an "
                "object it did not create, and the attempt fails; the forged output is never "
                "committed",
            ),
        ),
        mimic_is=(
            "the executor's exact result object for turn 1 (name, labels, `agentrun.dev/"
            "complete`, immutable, the run as controller), its content forged, before the "
            "executor stores it (the change)"
        ),
        agent=True,
    ),
    Entry(
        id="agent-context",
        object="ConfigMap (context)",
        path="data.part-N of an agent run's context document",
        decides="what the next model turn is sent",
        resource=CONFIGMAPS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.COMMIT,
        checks=(Check.DIGEST,),
        proven=(Origin.COMMITTED_DIGEST,),
        mimic_is="the context document as the operator wrote it, its messages the attacker's",
        outcomes=by_phase(
            Expect(
                Outcome.FAILED_CLOSED,
                "the changed context is never sent: the operator that wrote it sends and "
                "continues from its own copy while it keeps it; one that reads it (restarted) "
                "finds it changed, and the next turn's context says the earlier one could not "
                "be read (a model turn checks its own against the digest)",
            ),
            pending=Expect(
                Outcome.NOT_APPLICABLE,
                "a turn's context is made when the turn starts, under a name its content decides",
            ),
            finished=Expect(
                Outcome.UNAFFECTED,
                "read again by forks only, checked against the chain of digests",
            ),
        ),
        agent=True,
    ),
    Entry(
        id="agent-transcript",
        object="ConfigMap (transcript)",
        path="data.turn of an agent run's transcript record",
        decides="nothing the operator does: what `kubectl agentrun transcript` shows",
        resource=CONFIGMAPS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.NOT_USED,),
        proven=(Origin.NOT_USED,),
        mimic_is="the turn's record under its name, as the operator writes one (the change)",
        outcomes=every(UNAFFECTED),
        agent=True,
        gap=GAP_TRANSCRIPT,
    ),
    Entry(
        id="audit-record",
        object="ConfigMap (audit)",
        path="data of a run's audit record chunks",
        decides="nothing a step does: the record `history --verify` checks",
        resource=CONFIGMAPS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.COMMIT,
        checks=(Check.DIGEST,),
        proven=(Origin.COMMITTED_DIGEST,),
        mimic_is=(
            "the chunk as the operator wrote it, written again (before there is one: a chunk "
            "in its shape, made first)"
        ),
        mimic=every(
            Expect(
                Outcome.UNAFFECTED,
                "the same content: the chain still verifies (one made first is no chunk of the "
                "record: ignored and reported)",
            )
        ),
        outcomes=every(
            Expect(Outcome.UNAFFECTED, "the run goes on; `history --verify` reports the change")
        ),
    ),
    Entry(
        id="referenced-configmap",
        object="ConfigMap (referenced)",
        path="a ConfigMap a step's env references (configMapKeyRef)",
        decides="what the step's program receives",
        resource=CONFIGMAPS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.CREATOR_RIGHTS,),
        proven=(Origin.EDITORS,),
        mimic_is="the ConfigMap's content as the creator wrote it",
        mimic=every(SAME),
        outcomes=every(
            Expect(Outcome.APPLIES, "the argsHash binds the reference, the pod reads the content")
        ),
        gap=GAP_REFERENCED,
    ),
    Entry(
        id="referenced-secret",
        object="Secret (referenced)",
        path="a Secret a step's env, spec.agent.model.apiKeySecretRef, an MCP server's or an "
        "HTTP tool's header references",
        decides="what the step's program receives, which key a model turn sends",
        resource=SECRETS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.CREATOR_RIGHTS, Check.FROZEN_STATUS),
        proven=(Origin.EDITORS,),
        mimic_is="the Secret's content as the creator wrote it",
        mimic=every(SAME),
        outcomes=every(
            Expect(
                Outcome.APPLIES,
                "the argsHash binds the reference; the key goes only to the frozen endpoint",
            )
        ),
        gap=GAP_REFERENCED,
    ),
    Entry(
        id="signing-key",
        object="Secret agentrun-job-signing",
        path="data.key, in the operator's namespace",
        decides="which Jobs carry a valid proof",
        resource=SIGNING_KEY,
        writers=(Writer.OPERATOR, Writer.CLUSTER_ADMIN),
        frozen=Frozen.CREATION,
        checks=(Check.RBAC,),
        proven=(Origin.RBAC,),
        mimic_is="the key as the operator made it",
        outcomes=every(
            Expect(Outcome.REFUSED_RBAC, "it lives in the operator's namespace, not the run's")
        ),
    ),
    Entry(
        id="shard-leases",
        object="Lease agentrun-shard-N, agentrun-member-ID",
        path="spec.holderIdentity, in the operator's namespace",
        decides="which replica decides a shard's runs (never what a step runs: a run decided "
        "by a stale holder is fenced by its resourceVersion, a Job by its name)",
        resource=SHARD_LEASES,
        writers=(Writer.OPERATOR, Writer.CLUSTER_ADMIN),
        frozen=Frozen.NEVER,
        checks=(Check.RBAC,),
        proven=(Origin.RBAC,),
        mimic_is="the holder as the operator wrote it",
        outcomes=every(
            Expect(Outcome.REFUSED_RBAC, "it lives in the operator's namespace, not the run's")
        ),
    ),
    *(
        Entry(
            id=f"{plural}",
            object=kind,
            path=f"spec ({what}), in the run's namespace",
            decides="what a run of an Agent (spec.agentRef) runs: its model, key, tools and "
            "limits, taken once on the run's first pass into status.agent.definition",
            resource=(GROUP, plural),
            writers=(Writer.NAMESPACE_ADMIN, Writer.CLUSTER_ADMIN),
            frozen=Frozen.FIRST_PASS,
            checks=(Check.RBAC, Check.CREATOR_RIGHTS, Check.FROZEN_STATUS),
            proven=(Origin.RBAC, Origin.COMMITTED_UID, Origin.COMMITTED_DIGEST),
            mimic_is=f"the {kind} as the namespace's admins would define it, written before them",
            outcomes=every(
                Expect(
                    Outcome.REFUSED_RBAC,
                    "agentrun-define aggregates into admin only; an admin's change reaches "
                    "only runs that start after it",
                )
            ),
        )
        for kind, plural, what in (
            (
                "Agent",
                "agents",
                "instructions, tools, MCP servers, tool choice, limits, allowOverrides, "
                "modelConfigRef",
            ),
            ("ModelConfig", "modelconfigs", "endpoint, API key Secret, settings, fallbacks"),
        )
    ),
    Entry(
        id="crd",
        object="CustomResourceDefinition",
        path="agentruns.agentrun.dev (schema, validation)",
        decides="which runs the API server accepts",
        resource=CRDS,
        writers=(Writer.CLUSTER_ADMIN,),
        frozen=Frozen.NEVER,
        checks=(Check.RBAC,),
        proven=(Origin.RBAC,),
        mimic_is="the CRD as installed",
        outcomes=every(Expect(Outcome.REFUSED_RBAC, "cluster-scoped")),
    ),
    Entry(
        id="namespaces",
        object="Namespace",
        path="the watched namespaces (the chart's kopf discovery)",
        decides="which runs the operator serves",
        resource=NAMESPACES,
        writers=(Writer.CLUSTER_ADMIN,),
        frozen=Frozen.NEVER,
        checks=(Check.RBAC,),
        proven=(Origin.RBAC,),
        mimic_is="the namespace as it is",
        outcomes=every(Expect(Outcome.REFUSED_RBAC, "cluster-scoped")),
    ),
)
