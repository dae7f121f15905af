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
# place only when complete, under a lock (as hack/build-controlplane.sh does).
#
# Environment: GOFLAGS, GOCACHE, GOMODCACHE, GOPROXY... are honoured as usual.
# GOTOOLCHAIN defaults to "local", CGO_ENABLED to 0 (as upstream's releases).
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MOD="$HACK_DIR/helm"
MIN_GO_MINOR=26 # hack/helm/go.mod says "go 1.26.0" (helm v3.22 needs it)

log() { printf 'build-helm: %s\n' "$*" >&2; }
die() {
    printf 'build-helm: error: %s\n' "$*" >&2
    exit 1
}

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
stamp_value=$(
    {
        printf '%s\n' "$recipe"
        for f in "$MOD"/go.mod "$MOD"/go.sum; do
            printf '== %s\n' "${f#"$HACK_DIR"/}"
            cat "$f"
        done
    } | sha256sum | cut -d' ' -f1
)

# --- cache layout ---------------------------------------------------------------
cache_root="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}"
dest="$cache_root/helm-$HELM_VERSION"
bin_dir="$dest/bin"

is_current() { [[ -f $dest/stamp && $(<"$dest/stamp") == "$stamp_value" && -x $bin_dir/helm ]]; }

mkdir -p "$cache_root"
if is_current; then
    log "helm $HELM_VERSION up to date (stamp ${stamp_value:0:12}): nothing to build"
    printf '%s\n' "$bin_dir"
    exit 0
fi

# Go is only needed when there is something to build.
command -v go >/dev/null 2>&1 || die "go not found: install Go >= 1.${MIN_GO_MINOR} to build helm $HELM_VERSION (see README)"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED="$cgo"
go_version=$(go env GOVERSION) || die "'go env GOVERSION' failed"
go_minor=$(sed -nE 's/^go1\.([0-9]+).*/\1/p' <<<"$go_version")
if [[ -z $go_minor || $go_minor -lt $MIN_GO_MINOR ]]; then
    die "$go_version is too old: install Go >= 1.${MIN_GO_MINOR} to build helm $HELM_VERSION"
fi

# Serialize concurrent builds of the same entry; re-check after the lock.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$dest.lock"
    if ! flock -n 9; then
        log "another build holds $dest.lock; waiting"
        flock 9
    fi
    if is_current; then
        log "helm $HELM_VERSION up to date (built by a concurrent run): nothing to build"
        printf '%s\n' "$bin_dir"
        exit 0
    fi
    rm -rf "$dest".tmp.* "$dest".old.* # leftovers of killed builds (we hold the lock)
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

log "building helm $HELM_VERSION (Kubernetes client 1.$k8s_minor) with $go_version (GOFLAGS=${GOFLAGS:-}) into $dest"
start=$SECONDS
(
    cd "$MOD"
    go build -mod=readonly -buildvcs=false -trimpath -ldflags "$ldflags" \
        -o "$tmp/bin/helm" helm.sh/helm/v3/cmd/helm
) || die "building helm from hack/helm failed (see above)"
"$tmp/bin/helm" version --short >&2 || die "the built helm does not run"

printf '%s\n' "$stamp_value" >"$tmp/stamp"
if [[ -e $dest ]]; then
    old=$(mktemp -d "$dest.old.XXXXXX")
    mv "$dest" "$old/"
fi
mv "$tmp" "$dest"
log "installed into $bin_dir in $((SECONDS - start))s"
printf '%s\n' "$bin_dir"
