#!/usr/bin/env bash
# The approval walkthrough of docs/approvals.md, end to end, on a local cluster of its own:
#
#   1. `agentrun devcluster up` in the background; its `export KUBECONFIG=... PATH=...` line
#      sets up this shell (kubectl, agentrun, kubectl-agentrun);
#   2. the CRD and the admission policies, namespace demo, the operator watching it;
#   3. examples/approval-gate.yaml, which waits for approval of restart-service;
#   4. `kubectl agentrun approve`, `kubectl agentrun wait` (exit 0 only if the run Succeeded),
#      `kubectl agentrun history --verify`;
#   5. the run deleted, the operator and the cluster stopped (also on failure or Ctrl-C).
#
# Every command of the walkthrough is printed (`$ ...`) before it runs. Exit 0 when the run
# Succeeded and its audit record is intact. Usage: hack/walkthrough-approvals.sh (or `make
# walkthrough`). The control-plane binaries are built first when missing (a long build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

NAMESPACE=demo
RUN=remediate-checkout
STEP=restart-service
TIMEOUT=${WALKTHROUGH_TIMEOUT_SECONDS:-180}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/agentrun-walkthrough.XXXXXX")
CLUSTER_PID=
OPERATOR_PID=

say() { printf '\n# %s\n' "$*"; }
# Print a command as it would be typed, then run it.
run() {
    printf '$ %s\n' "${*@Q}" | sed "s/'\([A-Za-z0-9_./=:-]*\)'/\1/g"
    "$@"
}
fail() {
    printf 'walkthrough: %s\n' "$*" >&2
    for log in "$WORK"/cluster.log "$WORK"/operator.log; do
        [[ -s $log ]] && { printf '\n--- tail of %s\n' "$log" >&2; tail -n 40 "$log" >&2; }
    done
    exit 1
}
# Stop a process this script started, by its pid, and wait for it (at most 60 s).
stop() {
    local pid=$1
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 600); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
teardown() {
    local status=$?
    trap - EXIT INT TERM
    say "tear down: the run (while the operator still runs), the operator, the cluster"
    if [[ -n $OPERATOR_PID ]] && kill -0 "$OPERATOR_PID" 2>/dev/null; then
        run kubectl -n "$NAMESPACE" delete agentrun "$RUN" --ignore-not-found --timeout=60s ||
            true
    fi
    stop "$OPERATOR_PID"
    stop "$CLUSTER_PID"
    rm -rf "$WORK"
    exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT TERM

UV=$(hack/ensure-uv.sh)
hack/build-controlplane.sh >/dev/null

say "a local cluster (make cluster does the same in the foreground)"
printf '$ uv run agentrun devcluster up &\n'
"$UV" run --locked agentrun devcluster up >"$WORK/cluster.log" 2>&1 &
CLUSTER_PID=$!
for _ in $(seq 1800); do
    grep -q '^export KUBECONFIG=' "$WORK/cluster.log" && break
    kill -0 "$CLUSTER_PID" 2>/dev/null || fail "the cluster did not start"
    sleep 0.1
done
ENVIRONMENT=$(grep -m1 '^export KUBECONFIG=' "$WORK/cluster.log") ||
    fail "the cluster printed no environment within 180 s"
printf '$ %s\n' "$ENVIRONMENT"
eval "$ENVIRONMENT"
command -v kubectl-agentrun >/dev/null || fail "kubectl-agentrun is not on the PATH it printed"

say "the API, the admission policies, a namespace, and the operator watching it"
run kubectl apply -f crds/ -f manifests/admission/
run kubectl wait --for=condition=Established crd/agentruns.agentrun.dev --timeout=60s
run kubectl create namespace "$NAMESPACE"
printf '$ agentrun run -n %s --liveness-port 0 --metrics-port 0 &\n' "$NAMESPACE"
agentrun run -n "$NAMESPACE" --liveness-port 0 --metrics-port 0 >"$WORK/operator.log" 2>&1 &
OPERATOR_PID=$!
# Admission policies act a moment after they are created: a dry run shows when the API server
# records who creates a run.
for _ in $(seq 600); do
    recorded=$(kubectl -n "$NAMESPACE" create --dry-run=server -f examples/approval-gate.yaml \
        -o jsonpath='{.metadata.annotations.agentrun\.dev/created-by}' 2>/dev/null || true)
    [[ -n $recorded ]] && break
    sleep 0.1
done
[[ -n ${recorded:-} ]] || fail "the admission policies did not start acting within 60 s"
kill -0 "$OPERATOR_PID" 2>/dev/null || fail "the operator exited"

say "a run with a step that needs approval"
run kubectl apply -n "$NAMESPACE" -f examples/approval-gate.yaml
run kubectl wait -n "$NAMESPACE" agentrun/"$RUN" --for=jsonpath='{.status.phase}'=WaitingForApproval \
    --timeout="${TIMEOUT}s" || fail "the run never waited for approval"
run kubectl get agentruns -n "$NAMESPACE"
run kubectl agentrun -n "$NAMESPACE" status "$RUN"

say "approve, wait, and read the audit trail"
run kubectl agentrun -n "$NAMESPACE" approve "$RUN" "$STEP" --reason "health check failing for 12 minutes"
run kubectl agentrun -n "$NAMESPACE" wait "$RUN" --timeout "${TIMEOUT}s"
run kubectl agentrun -n "$NAMESPACE" history "$RUN" --verify
say "walkthrough done: $RUN Succeeded"
