#!/usr/bin/env bash
# The end-to-end suite on a real cluster made by kind: build the operator image, load it into a
# fresh kind cluster, install the Helm chart, check the installed operator runs an example
# (`helm test`, then examples/incident-investigation.yaml), then run the e2e tests against the
# cluster (AGENTRUN_TEST_KUBECONFIG), and delete the cluster.
#
# Usage: hack/e2e-kind.sh [PYTEST ARGS...]     (default: tests/e2e -m e2e)
#
# Without a Docker engine (`docker info` fails) it prints
#   docker is not available: skipping the kind e2e suite
# and exits 0: the same e2e tests run in `make test` against the local control plane.
#
# kind is built from its upstream Go module, pinned in hack/kind/go.mod, into
# ${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/kind-<version>/bin/kind
# (stamped, like hack/build-helm.sh does for helm); helm comes from hack/build-helm.sh.
#
# Environment: KIND_CLUSTER_NAME (default agentrun-e2e-<pid>), KIND_NODE_IMAGE (default: kind's
# own), AGENTRUN_KIND_KEEP=1 keeps the cluster (and prints how to delete it).
#
# The installed operator watches only the namespace agentrun-kind-smoke: the e2e tests start
# operators of their own for their namespaces, and two operators on the same runs would make
# their counts meaningless.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HACK_DIR/.." && pwd)
KIND_MOD="$HACK_DIR/kind"
RELEASE=agentrun-operator
RELEASE_NS=agentrun-system
SMOKE_NS=agentrun-kind-smoke
IMAGE_REPO=agentrun-operator
IMAGE_TAG=kind-e2e

log() { printf 'e2e-kind: %s\n' "$*" >&2; }
die() {
    printf 'e2e-kind: error: %s\n' "$*" >&2
    exit 1
}

if ! docker info >/dev/null 2>&1; then
    echo "docker is not available: skipping the kind e2e suite"
    exit 0
fi

# --- kind, from hack/kind/go.mod ------------------------------------------------
build_kind() {
    local version stamp dest tmp
    version=$(sed -nE 's#^[[:space:]]*(require[[:space:]]+)?sigs\.k8s\.io/kind[[:space:]]+(v[^[:space:]]+).*#\2#p' "$KIND_MOD/go.mod" | head -n1)
    [[ -n $version ]] || die "hack/kind/go.mod: no sigs.k8s.io/kind require line"
    stamp=$(cat "$KIND_MOD/go.mod" "$KIND_MOD/go.sum" <(echo "v1 -trimpath -s -w CGO_ENABLED=0") | sha256sum | cut -d' ' -f1)
    dest="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/kind-$version"
    if [[ -f $dest/stamp && $(<"$dest/stamp") == "$stamp" && -x $dest/bin/kind ]]; then
        printf '%s\n' "$dest/bin"
        return
    fi
    command -v go >/dev/null 2>&1 || die "go not found: install Go >= 1.26 to build kind $version"
    mkdir -p "$(dirname "$dest")"
    tmp=$(mktemp -d "$dest.tmp.XXXXXX")
    log "building kind $version into $dest"
    (cd "$KIND_MOD" && GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=0 go build -mod=readonly \
        -buildvcs=false -trimpath -ldflags "-s -w" -o "$tmp/bin/kind" sigs.k8s.io/kind) ||
        { rm -rf "$tmp"; die "building kind from hack/kind failed (see above)"; }
    printf '%s\n' "$stamp" >"$tmp/stamp"
    rm -rf "$dest"
    mv "$tmp" "$dest"
    printf '%s\n' "$dest/bin"
}

KIND="$(build_kind)/kind"
HELM="$("$HACK_DIR/build-helm.sh")/helm"
if command -v kubectl >/dev/null 2>&1; then
    KUBECTL=$(command -v kubectl)
else
    cp_bin=$("$HACK_DIR/build-controlplane.sh")
    KUBECTL="$cp_bin/kubectl"
    export AGENTRUN_CONTROLPLANE_BIN="$cp_bin" # the tests' kubectl
fi
UV=$("$HACK_DIR/ensure-uv.sh")

# --- cluster --------------------------------------------------------------------
CLUSTER=${KIND_CLUSTER_NAME:-agentrun-e2e-$$}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/agentrun-kind.XXXXXX")
KUBECONFIG_FILE="$WORK/kubeconfig"
cleanup() {
    local rc=$?
    if [[ ${AGENTRUN_KIND_KEEP:-0} == 1 ]]; then
        log "keeping cluster $CLUSTER (kubeconfig $KUBECONFIG_FILE); delete it with: $KIND delete cluster --name $CLUSTER"
    else
        "$KIND" delete cluster --name "$CLUSTER" >&2 || true
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

log "creating kind cluster $CLUSTER"
"$KIND" create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE" --wait 180s \
    ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} >&2
export KUBECONFIG="$KUBECONFIG_FILE"

log "building the images (hack/build-images.sh, no registry needed) and loading them"
"$HACK_DIR/build-images.sh" "$IMAGE_REPO:$IMAGE_TAG" >/dev/null
# The examples' steps run busybox:1.36, built locally from Debian's busybox-static.
"$KIND" load docker-image "$IMAGE_REPO:$IMAGE_TAG" busybox:1.36 --name "$CLUSTER" >&2

# --- the chart, as a user installs it --------------------------------------------
log "installing the chart (operator watching $SMOKE_NS)"
"$KUBECTL" create namespace "$SMOKE_NS" >&2
"$HELM" install "$RELEASE" "$ROOT/charts/agentrun-operator" \
    --namespace "$RELEASE_NS" --create-namespace \
    --set image.repository="$IMAGE_REPO" --set image.tag="$IMAGE_TAG" --set image.pullPolicy=Never \
    --set "watchNamespaces={$SMOKE_NS}" \
    --wait --timeout 5m >&2
"$KUBECTL" -n "$RELEASE_NS" rollout status "deployment/$RELEASE" --timeout=120s >&2

log "helm test"
"$HELM" test "$RELEASE" --namespace "$RELEASE_NS" --timeout 5m --logs >&2

log "an example run through the installed operator"
"$KUBECTL" -n "$SMOKE_NS" apply -f "$ROOT/examples/incident-investigation.yaml" >&2
if ! "$KUBECTL" -n "$SMOKE_NS" wait --for=condition=Succeeded agentrun/investigate-latency --timeout=300s >&2; then
    "$KUBECTL" -n "$SMOKE_NS" get agentruns,jobs,pods -o wide >&2 || true
    "$KUBECTL" -n "$RELEASE_NS" logs "deployment/$RELEASE" --tail=100 >&2 || true
    die "the example run did not succeed"
fi
"$KUBECTL" -n "$SMOKE_NS" get agentruns >&2
"$KUBECTL" -n "$SMOKE_NS" delete agentrun investigate-latency --timeout=120s >&2

# --- the e2e suite against this cluster --------------------------------------------
if [[ $# -eq 0 ]]; then
    set -- tests/e2e -m e2e
fi
log "pytest $* (AGENTRUN_TEST_KUBECONFIG=$KUBECONFIG_FILE)"
cd "$ROOT"
AGENTRUN_TEST_KUBECONFIG="$KUBECONFIG_FILE" "$UV" run --locked pytest "$@"
