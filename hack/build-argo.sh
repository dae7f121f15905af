#!/usr/bin/env bash
# Build Argo Workflows' workflow-controller and argoexec from the Go module pinned in
# hack/argo/versions.env, into a cache outside the repo, with the release's CRDs beside them.
# Only `make bench`'s peer leg uses them (agentrun_devcluster.argo).
#
# Usage: BIN=$(hack/build-argo.sh)
#
# stdout: exactly one line, the bin dir holding `workflow-controller` and `argoexec`; the
#         CRDs are in its sibling `crds/` (upstream's manifests/base/crds/minimal). Everything
#         else goes to stderr.
#
# Cache: ${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/
#        argo-workflows-${ARGO_WORKFLOWS_VERSION}/{bin/,crds/,stamp}
# The module is built as released: from its own go.mod and go.sum (a copy of the module
# source, since the module cache is read-only), with upstream's version variables and
# static, CGO-free flags (its Makefile's recipe), so that its dependencies are the ones the
# release pins. One symbolic link of upstream's tree, which module zips cannot hold, is put
# back (see below). A stamp (hash of the version file and the recipe) makes re-runs a no-op;
# the build goes to a temp dir moved into place only when complete, under a lock
# (hack/lib/gobuild.sh). A cold build downloads the module's dependencies (cloud storage
# SDKs among them) and compiles for several minutes on two cores.
#
# Environment: GOFLAGS, GOCACHE, GOMODCACHE, GOPROXY... are honoured as usual.
# GOTOOLCHAIN defaults to "local", CGO_ENABLED to 0.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MIN_GO_MINOR=25 # the module's go.mod says "go 1.25.7"

# shellcheck source=lib/gobuild.sh
source "$HACK_DIR/lib/gobuild.sh" build-argo
# shellcheck source=argo/versions.env
source "$HACK_DIR/argo/versions.env"
: "${ARGO_WORKFLOWS_VERSION:?ARGO_WORKFLOWS_VERSION not set in hack/argo/versions.env}"
[[ $ARGO_WORKFLOWS_VERSION =~ ^v4\.[0-9]+\.[0-9]+$ ]] ||
    die "ARGO_WORKFLOWS_VERSION=$ARGO_WORKFLOWS_VERSION: expected v4.MINOR.PATCH (the module path is .../v4)"
MODULE=github.com/argoproj/argo-workflows/v4

# --- build recipe (part of the stamp) -----------------------------------------
pkg=$MODULE
version_ldflags="-X $pkg.version=$ARGO_WORKFLOWS_VERSION -X $pkg.gitTag=$ARGO_WORKFLOWS_VERSION"
version_ldflags+=" -X $pkg.gitCommit=unknown -X $pkg.gitTreeState=clean"
recipe="v1 -buildvcs=false -trimpath -s -w -extldflags=-static $version_ldflags"
recipe+=" workflow-controller:./cmd/workflow-controller argoexec:./cmd/argoexec crds:manifests/base/crds/minimal"
recipe+=" symlink:workflow/executor/osspecific/signal_linux.go->signal_darwin.go"
stamp=$(printf '%s\n' "$recipe" | gobuild_stamp "$HACK_DIR/argo/versions.env")

# --- cache entry ----------------------------------------------------------------
dest="$gobuild_cache_root/argo-workflows-$ARGO_WORKFLOWS_VERSION"
gobuild_reuse "Argo Workflows $ARGO_WORKFLOWS_VERSION" "$dest" "$stamp" workflow-controller argoexec

gobuild_require_go "$MIN_GO_MINOR" "to build Argo Workflows"
gobuild_prepare

log "building Argo Workflows $ARGO_WORKFLOWS_VERSION with $go_version (GOFLAGS=${GOFLAGS:-}) into $dest"
log "[1/3] fetching $MODULE@$ARGO_WORKFLOWS_VERSION"
src_dir=$(cd "$gobuild_tmp" && GOFLAGS=-mod=mod go mod download -json "$MODULE@$ARGO_WORKFLOWS_VERSION" |
    sed -nE 's/^[[:space:]]*"Dir": "(.*)",?$/\1/p') || die "go mod download $MODULE@$ARGO_WORKFLOWS_VERSION failed"
[[ -n $src_dir && -f $src_dir/go.mod ]] || die "go mod download gave no source directory for $MODULE@$ARGO_WORKFLOWS_VERSION"
cp -R "$src_dir" "$gobuild_tmp/src"
chmod -R u+w "$gobuild_tmp/src"
# A module zip holds no symbolic links, and upstream's tree has one that Linux builds need:
# workflow/executor/osspecific/signal_linux.go -> signal_darwin.go (Kill, Setpgid, Wait...:
# the same POSIX calls on both). Without it argoexec does not compile ("undefined: Setpgid").
# Put it back as upstream has it.
osspecific="$gobuild_tmp/src/workflow/executor/osspecific"
[[ -e $osspecific/signal_linux.go ]] || ln -s signal_darwin.go "$osspecific/signal_linux.go"

log "[2/3] workflow-controller and argoexec (the long part: its dependencies)"
build_date=$(date -u ${SOURCE_DATE_EPOCH:+--date=@$SOURCE_DATE_EPOCH} +%Y-%m-%dT%H:%M:%SZ)
(
    cd "$gobuild_tmp/src"
    for cmd in workflow-controller argoexec; do
        go build -mod=readonly -buildvcs=false -trimpath \
            -ldflags "-s -w -extldflags -static $version_ldflags -X $pkg.buildDate=$build_date" \
            -o "$gobuild_tmp/bin/$cmd" "./cmd/$cmd"
        log "      $cmd done after $((SECONDS - gobuild_start))s"
    done
) || die "building Argo Workflows failed (see above)"

log "[3/3] the CRDs"
mkdir -p "$gobuild_tmp/crds"
cp "$gobuild_tmp/src/manifests/base/crds/minimal/"argoproj.io_*.yaml "$gobuild_tmp/crds/"
rm -rf "$gobuild_tmp/src"

"$gobuild_tmp/bin/workflow-controller" version >&2 || die "the built workflow-controller does not run"
"$gobuild_tmp/bin/argoexec" version >&2 || die "the built argoexec does not run"

gobuild_publish
