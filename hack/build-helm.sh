#!/usr/bin/env bash
# Build Helm from its upstream Go module (helm.sh/helm/v3 cmd/helm), at the
# version pinned in hack/helm/go.mod, into a cache outside the repo.
#
# Usage: BIN=$(hack/build-helm.sh) && "$BIN/helm" version
#
# stdout: exactly one line, the bin dir holding `helm`. Everything else goes to
#         stderr.
#
# Cache: ${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/
#        helm-${HELM_VERSION}/{bin/helm,stamp}
# A stamp (hash of hack/helm/go.mod, go.sum and the build recipe) makes re-runs
# a no-op. The build goes to a temp dir beside the cache entry and is moved into
# place only when complete, under a lock (hack/lib/gobuild.sh).
#
# Environment: GOFLAGS, GOCACHE, GOMODCACHE, GOPROXY... are honoured as usual.
# GOTOOLCHAIN defaults to "local", CGO_ENABLED to 0 (as upstream's releases).
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MOD="$HACK_DIR/helm"
MIN_GO_MINOR=26 # hack/helm/go.mod says "go 1.26.0" (helm v3.22 needs it)

# shellcheck source=lib/gobuild.sh
source "$HACK_DIR/lib/gobuild.sh" build-helm

# The pinned versions, read from go.mod (the single place they are written).
mod_version() { sed -nE "s#^[[:space:]]*(require[[:space:]]+)?${1//./\\.}[[:space:]]+(v[^[:space:]]+).*#\\2#p" "$MOD/go.mod" | head -n1; }
HELM_VERSION=$(mod_version helm.sh/helm/v3)
CLIENT_GO_VERSION=$(mod_version k8s.io/client-go)
[[ $HELM_VERSION =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "hack/helm/go.mod: no helm.sh/helm/v3 vX.Y.Z require line"
# Helm's Makefile derives the Kubernetes version it assumes (helm lint,
# .Capabilities.KubeVersion in helm template) from client-go v0.MINOR.x.
[[ $CLIENT_GO_VERSION =~ ^v0\.([0-9]+)\.[0-9]+$ ]] || die "hack/helm/go.mod: no k8s.io/client-go v0.MINOR.PATCH line"
k8s_minor=${BASH_REMATCH[1]}

# --- build recipe (part of the stamp) -------------------------------------------
# As upstream's Makefile for a release tag: version set, metadata empty, no git
# commit (the module zip has no git metadata).
ldflags="-s -w"
ldflags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
ldflags+=" -X helm.sh/helm/v3/internal/version.metadata="
ldflags+=" -X helm.sh/helm/v3/internal/version.gitCommit="
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
cgo=${CGO_ENABLED:-0}
recipe="v1 -buildvcs=false -trimpath CGO_ENABLED=$cgo $ldflags"
stamp=$(printf '%s\n' "$recipe" | gobuild_stamp "$MOD"/go.mod "$MOD"/go.sum)

# --- cache entry ----------------------------------------------------------------
dest="$gobuild_cache_root/helm-$HELM_VERSION"
gobuild_reuse "helm $HELM_VERSION" "$dest" "$stamp" helm

# Go is only needed when there is something to build.
gobuild_require_go "$MIN_GO_MINOR" "to build helm $HELM_VERSION"
gobuild_prepare

log "building helm $HELM_VERSION (Kubernetes client 1.$k8s_minor) with $go_version (GOFLAGS=${GOFLAGS:-}) into $dest"
(
    cd "$MOD"
    go build -mod=readonly -buildvcs=false -trimpath -ldflags "$ldflags" \
        -o "$gobuild_tmp/bin/helm" helm.sh/helm/v3/cmd/helm
) || die "building helm from hack/helm failed (see above)"
"$gobuild_tmp/bin/helm" version --short >&2 || die "the built helm does not run"

gobuild_publish
