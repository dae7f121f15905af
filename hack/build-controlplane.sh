#!/usr/bin/env bash
# Build a real Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager, kubectl) from the upstream Go modules pinned in
# hack/versions.env, into a cache outside the repo.
#
# Usage: BIN=$(hack/build-controlplane.sh)
#
# stdout: exactly one line, the bin dir holding etcd, kube-apiserver,
#         kube-controller-manager and kubectl. Everything else goes to stderr.
#
# Cache: ${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/controlplane/
#        k8s-${KUBERNETES_VERSION}-etcd-${ETCD_VERSION}/{bin/,stamp}
# A stamp (hash of versions.env, the two Go modules' go.mod/go.sum/main.go and
# the build recipe) makes re-runs a no-op. Builds go to a temp dir beside the
# cache entry and are moved into place only when complete, under a lock, so
# an interrupted or concurrent run never leaves a half-populated cache
# (hack/lib/gobuild.sh).
#
# Environment: GOFLAGS, GOCACHE, GOMODCACHE, GOPROXY... are honoured as usual.
# GOTOOLCHAIN defaults to "local", CGO_ENABLED to 0 (as upstream's static
# builds). SOURCE_DATE_EPOCH, if set, fixes the embedded build date.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CP_MOD="$HACK_DIR/controlplane"
ETCD_MOD="$HACK_DIR/etcd"
MIN_GO_MINOR=26 # go.mod files say "go 1.26.0"

# shellcheck source=lib/gobuild.sh
source "$HACK_DIR/lib/gobuild.sh" build-controlplane

# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
: "${KUBERNETES_VERSION:?KUBERNETES_VERSION not set in hack/versions.env}"
: "${ETCD_VERSION:?ETCD_VERSION not set in hack/versions.env}"

gobuild_require_go "$MIN_GO_MINOR"

# --- versions.env must agree with the go.mod files ---------------------------
if [[ ! $KUBERNETES_VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]]; then
    die "KUBERNETES_VERSION=$KUBERNETES_VERSION: expected v1.MINOR.PATCH"
fi
k8s_major=1
k8s_minor=${BASH_REMATCH[1]}
staging_version="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
grep -qE "^(require)?[[:space:]]+k8s\.io/kubernetes ${KUBERNETES_VERSION//./\\.}( |\$)" "$CP_MOD/go.mod" ||
    die "hack/controlplane/go.mod does not require k8s.io/kubernetes $KUBERNETES_VERSION (versions.env)"
if bad=$(grep -E '^\s+k8s\.io/\S+ => ' "$CP_MOD/go.mod" | grep -vE " => k8s\.io/\S+ ${staging_version//./\\.}\$"); then
    die "hack/controlplane/go.mod has replace lines not at $staging_version: $bad"
fi
grep -qE "^(require)?[[:space:]]+go\.etcd\.io/etcd/server/v3 ${ETCD_VERSION//./\\.}( |\$)" "$ETCD_MOD/go.mod" ||
    die "hack/etcd/go.mod does not require go.etcd.io/etcd/server/v3 $ETCD_VERSION (versions.env)"

# --- build recipe (part of the stamp) -----------------------------------------
build_date=$(date -u ${SOURCE_DATE_EPOCH:+--date=@$SOURCE_DATE_EPOCH} +%Y-%m-%dT%H:%M:%SZ)
# Like upstream hack/lib/golang.sh: same tags; version vars set in both
# k8s.io/component-base/version and k8s.io/client-go/pkg/version. The
# apiserver derives its binary/emulation version (feature gates, API
# compatibility) from gitVersion, so it must be the real release version.
# gitCommit is blanked (the module zip carries no git metadata; the default
# would be the literal "$Format:%H$").
k8s_tags="selinux,notest,grpcnotrace"
version_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitCommit="
    version_ldflags+=" -X $pkg.gitMajor=$k8s_major -X $pkg.gitMinor=$k8s_minor"
    version_ldflags+=" -X $pkg.gitTreeState=clean"
done
recipe="v1 -buildvcs=false CGO_ENABLED=$CGO_ENABLED tags=$k8s_tags -trimpath -s -w $version_ldflags"

stamp=$(
    {
        printf '%s\n' "$recipe"
        cat "$HACK_DIR/versions.env"
    } | gobuild_stamp "$CP_MOD"/{go.mod,go.sum,main.go} "$ETCD_MOD"/{go.mod,go.sum,main.go}
)

# --- cache entry ----------------------------------------------------------------
dest="$gobuild_cache_root/controlplane/k8s-${KUBERNETES_VERSION}-etcd-${ETCD_VERSION}"
gobuild_reuse "" "$dest" "$stamp" etcd kube-apiserver kube-controller-manager kubectl
gobuild_prepare

log "building Kubernetes $KUBERNETES_VERSION + etcd $ETCD_VERSION with $go_version (GOFLAGS=${GOFLAGS:-}) into $dest"
log "[1/2] kube-apiserver, kube-controller-manager, kubectl (multi-call binary; the long part)"
(
    cd "$CP_MOD"
    go build -mod=readonly -buildvcs=false -trimpath -tags="$k8s_tags" \
        -ldflags "-s -w -X k8s.io/component-base/version.buildDate=$build_date -X k8s.io/client-go/pkg/version.buildDate=$build_date$version_ldflags" \
        -o "$gobuild_tmp/bin/kube-controlplane" .
) || die "building hack/controlplane failed (see above)"
for t in kube-apiserver kube-controller-manager kubectl; do
    ln -s kube-controlplane "$gobuild_tmp/bin/$t"
done
log "      done after $((SECONDS - gobuild_start))s"

log "[2/2] etcd"
(
    cd "$ETCD_MOD"
    go build -mod=readonly -buildvcs=false -trimpath -ldflags "-s -w" -o "$gobuild_tmp/bin/etcd" .
) || die "building hack/etcd failed (see above)"
log "      done after $((SECONDS - gobuild_start))s"

# Sanity check before publishing.
"$gobuild_tmp/bin/kube-apiserver" --version >&2 || die "built kube-apiserver does not run"
"$gobuild_tmp/bin/etcd" --version >/dev/null || die "built etcd does not run"

gobuild_publish
