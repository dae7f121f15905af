{{/* The chart name, or nameOverride. */}}
{{- define "agentrun-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name prefix: fullnameOverride, else the release name if it already contains the
chart name, else <release>-<chart>. */}}
{{- define "agentrun-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "agentrun-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentrun-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "agentrun-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "agentrun-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentrun
{{- end }}

{{- define "agentrun-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentrun-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "agentrun-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* How many operator pods: `replicas`, else its older name `replicaCount`, else 1. A value of 0
is kept (0 stops the operator), so this tests for null rather than for emptiness. */}}
{{- define "agentrun-operator.replicas" -}}
{{- if not (kindIs "invalid" .Values.replicas) }}
{{- int .Values.replicas }}
{{- else if not (kindIs "invalid" .Values.replicaCount) }}
{{- int .Values.replicaCount }}
{{- else }}
{{- 1 }}
{{- end }}
{{- end }}

{{/* "true" when the replicas share the runs by shards (more than one replica), else empty. */}}
{{- define "agentrun-operator.sharded" -}}
{{- if gt (include "agentrun-operator.replicas" . | int) 1 }}true{{ end }}
{{- end }}

{{/* The namespace the helm test run goes to: one the operator watches. */}}
{{- define "agentrun-operator.testNamespace" -}}
{{- if .Values.watchNamespaces }}{{ first .Values.watchNamespaces }}{{ else }}{{ .Release.Namespace }}{{ end }}
{{- end }}

{{/*
The rules the operator needs in every namespace it watches. Each verb was found necessary by
running the operator with only that verb removed: each removal gave 403s in its log and lost
something (runs stalled, cleanup timed out, audit entries or Events went missing, or Job changes
were only noticed at the next resync). tests/e2e/test_rbac.py runs it with exactly these rules
and allows no 403.
*/}}
{{- define "agentrun-operator.namespacedRules" -}}
# AgentRuns: kopf lists and watches them (and, with peering, patches its bookkeeping
# annotations and daemon finalizer); the operator patches its own finalizer on and off; the
# ledger reads each run fresh (get); a finished run past its retention TTL
# is deleted. A sub-agent's call creates its child run, and the parent's cancel and suspend
# are patched onto its children.
- apiGroups: [agentrun.dev]
  resources: [agentruns]
  verbs: [get, list, watch, create, patch, delete]
# Status is written only by the ledger: a JSON patch carrying the resourceVersion it read.
- apiGroups: [agentrun.dev]
  resources: [agentruns/status]
  verbs: [patch]
# A run of an Agent (spec.agentRef): the Agent and its ModelConfig are read by name once,
# on the run's first pass, after its creator was found allowed to read them.
- apiGroups: [agentrun.dev]
  resources: [agents, modelconfigs]
  verbs: [get]
# Step Jobs and result ConfigMaps are owned by their run with blockOwnerDeletion, which
# clusters with the OwnerReferencesPermissionEnforcement admission plugin only allow to
# someone who may update the owner's finalizers.
- apiGroups: [agentrun.dev]
  resources: [agentruns/finalizers]
  verbs: [update]
# One Job per step attempt: created (and a dry run of it, to check a Job found under an
# attempt's name), watched, read, its outcome finalizer removed by a JSON patch, deleted
# after the grace period or on cleanup.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete, patch]
# Step pods are created by the Job controller, never by the operator: it reads them
# (watched: termination messages; read fresh before it lets one start), lets one pod per
# attempt start (a JSON patch removing its agentrun.dev/start scheduling gate) and removes
# those of a deleted run.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch, deletecollection]
# Result objects, the audit record and agent runs' records: created, appended to (update),
# read by label or by name (an agent run's context document), removed with their run.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, create, update, deletecollection]
# The operator's Events on runs, as events.k8s.io/v1 (microsecond times, the reporting pod;
# agentrun/events.py). kopf's own are core/v1.
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create]
# Events on runs (the operator's and kopf's own); the Job controller's FailedCreate Events
# are watched (the API refused a step's pod).
- apiGroups: [""]
  resources: [events]
  verbs: [create, list, watch]
# Whether a run's creator may use the Secrets, ConfigMaps and ServiceAccount its steps
# reference (operator/agentrun/authz.py): asked of the API server, never read.
- apiGroups: [authorization.k8s.io]
  resources: [localsubjectaccessreviews]
  verbs: [create]
{{- end }}

{{/* Annotations of the uninstall hook's objects; the argument is the hook weight. */}}
{{- define "agentrun-operator.releaseHook" -}}
helm.sh/hook: pre-delete
helm.sh/hook-weight: {{ . | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end }}

{{/*
What `agentrun release` (the uninstall hook) needs in each namespace it releases, and no more:
it lists and deletes runs and removes the operator's finalizer from them (a JSON patch); it
deletes their step Jobs and removes the Job finalizer (read, then a JSON patch); and it deletes
their pods and result ConfigMaps by label. It posts no Events and creates nothing.
*/}}
{{- define "agentrun-operator.releaseRules" -}}
- apiGroups: [agentrun.dev]
  resources: [agentruns]
  verbs: [get, list, delete, patch]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, delete, patch]
- apiGroups: [""]
  resources: [pods, configmaps]
  verbs: [deletecollection]
{{- end }}
