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
# an interrupted or concurrent run never leaves a half-populated cache.
#
# Environment: GOFLAGS, GOCACHE, GOMODCACHE, GOPROXY... are honoured as usual.
# GOTOOLCHAIN defaults to "local", CGO_ENABLED to 0 (as upstream's static
# builds). SOURCE_DATE_EPOCH, if set, fixes the embedded build date.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CP_MOD="$HACK_DIR/controlplane"
ETCD_MOD="$HACK_DIR/etcd"
MIN_GO_MINOR=26 # go.mod files say "go 1.26.0"

log() { printf 'build-controlplane: %s\n' "$*" >&2; }
die() { printf 'build-controlplane: error: %s\n' "$*" >&2; exit 1; }

# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
: "${KUBERNETES_VERSION:?KUBERNETES_VERSION not set in hack/versions.env}"
: "${ETCD_VERSION:?ETCD_VERSION not set in hack/versions.env}"

command -v go >/dev/null 2>&1 || die "go not found: install Go >= 1.${MIN_GO_MINOR} (see README)"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED="${CGO_ENABLED:-0}"
go_version=$(go env GOVERSION) || die "'go env GOVERSION' failed"
go_minor=$(sed -nE 's/^go1\.([0-9]+).*/\1/p' <<<"$go_version")
if [[ -z $go_minor || $go_minor -lt $MIN_GO_MINOR ]]; then
    die "$go_version is too old: install Go >= 1.${MIN_GO_MINOR} (see README)"
fi

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

stamp_value=$(
    {
        printf '%s\n' "$recipe"
        cat "$HACK_DIR/versions.env"
        for f in "$CP_MOD"/{go.mod,go.sum,main.go} "$ETCD_MOD"/{go.mod,go.sum,main.go}; do
            printf '== %s\n' "${f#"$HACK_DIR"/}"
            cat "$f"
        done
    } | sha256sum | cut -d' ' -f1
)

# --- cache layout ---------------------------------------------------------------
cache_root="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/controlplane"
dest="$cache_root/k8s-${KUBERNETES_VERSION}-etcd-${ETCD_VERSION}"
bin_dir="$dest/bin"
tools=(etcd kube-apiserver kube-controller-manager kubectl)

is_current() {
    [[ -f $dest/stamp && $(<"$dest/stamp") == "$stamp_value" ]] || return 1
    local t
    for t in "${tools[@]}"; do [[ -x $bin_dir/$t ]] || return 1; done
}

mkdir -p "$cache_root"
if is_current; then
    log "up to date (stamp ${stamp_value:0:12}): nothing to build"
    printf '%s\n' "$bin_dir"
    exit 0
fi

# Serialize concurrent builds of the same entry; re-check after the lock.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$dest.lock"
    have_lock=1
    if ! flock -n 9; then
        log "another build holds $dest.lock; waiting"
        flock 9
    fi
    if is_current; then
        log "up to date (built by a concurrent run): nothing to build"
        printf '%s\n' "$bin_dir"
        exit 0
    fi
fi

if [[ -n ${have_lock:-} ]]; then
    # Leftovers of killed builds (we hold the lock, so none is in use).
    rm -rf "$dest".tmp.* "$dest".old.*
fi
tmp=$(mktemp -d "$dest.tmp.XXXXXX")
chmod 755 "$tmp"
old=""
cleanup() {
    rm -rf "$tmp"
    if [[ -n $old ]]; then rm -rf "$old"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
mkdir -p "$tmp/bin"

log "building Kubernetes $KUBERNETES_VERSION + etcd $ETCD_VERSION with $go_version (GOFLAGS=${GOFLAGS:-}) into $dest"
start=$SECONDS

log "[1/2] kube-apiserver, kube-controller-manager, kubectl (multi-call binary; the long part)"
(
    cd "$CP_MOD"
    go build -mod=readonly -buildvcs=false -trimpath -tags="$k8s_tags" \
        -ldflags "-s -w -X k8s.io/component-base/version.buildDate=$build_date -X k8s.io/client-go/pkg/version.buildDate=$build_date$version_ldflags" \
        -o "$tmp/bin/kube-controlplane" .
) || die "building hack/controlplane failed (see above)"
for t in kube-apiserver kube-controller-manager kubectl; do
    ln -s kube-controlplane "$tmp/bin/$t"
done
log "      done after $((SECONDS - start))s"

log "[2/2] etcd"
(
    cd "$ETCD_MOD"
    go build -mod=readonly -buildvcs=false -trimpath -ldflags "-s -w" -o "$tmp/bin/etcd" .
) || die "building hack/etcd failed (see above)"
log "      done after $((SECONDS - start))s"

# Sanity check before publishing.
"$tmp/bin/kube-apiserver" --version >&2 || die "built kube-apiserver does not run"
"$tmp/bin/etcd" --version >/dev/null || die "built etcd does not run"

printf '%s\n' "$stamp_value" >"$tmp/stamp"
if [[ -e $dest ]]; then
    old=$(mktemp -d "$dest.old.XXXXXX")
    mv "$dest" "$old/"
fi
mv "$tmp" "$dest"
log "installed into $bin_dir in $((SECONDS - start))s"
printf '%s\n' "$bin_dir"
