#!/usr/bin/env bash
# Build kube-score (github.com/zegl/kube-score/cmd/kube-score) at KUBE_SCORE_VERSION of
# hack/versions.env from its Go module, into a cache outside the repo.
#
# Usage: BIN=$(hack/build-kube-score.sh) && "$BIN/kube-score" version
#
# stdout: exactly one line, the bin dir holding `kube-score`. Everything else goes to stderr.
#
# Cache: ${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/
#        kube-score-${KUBE_SCORE_VERSION}/{bin/kube-score,stamp}
# `go install MODULE@VERSION` builds with the module's own go.mod and go.sum (checked against
# the checksum database like any module download). A stamp (the version and the build recipe)
# makes re-runs a no-op; the build goes to a temp dir moved into place when complete, under a
# lock (hack/lib/gobuild.sh). A cold build takes about 2.5 minutes on 2 cores.
#
# Environment: GOFLAGS, GOCACHE, GOMODCACHE, GOPROXY... are honoured as usual.
# GOTOOLCHAIN defaults to "local", CGO_ENABLED to 0.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MIN_GO_MINOR=23 # kube-score v1.20.0's go.mod says "go 1.23"

# shellcheck source=lib/gobuild.sh
source "$HACK_DIR/lib/gobuild.sh" build-kube-score
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
[[ ${KUBE_SCORE_VERSION:-} =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "hack/versions.env: no KUBE_SCORE_VERSION=vX.Y.Z line"

# --- build recipe (part of the stamp) -------------------------------------------
cgo=${CGO_ENABLED:-0}
recipe="v1 github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION -trimpath -ldflags=-s-w CGO_ENABLED=$cgo"
stamp=$(printf '%s\n' "$recipe" | gobuild_stamp)

# --- cache entry ----------------------------------------------------------------
dest="$gobuild_cache_root/kube-score-$KUBE_SCORE_VERSION"
gobuild_reuse "kube-score $KUBE_SCORE_VERSION" "$dest" "$stamp" kube-score

gobuild_require_go "$MIN_GO_MINOR" "to build kube-score $KUBE_SCORE_VERSION"
gobuild_prepare

log "building kube-score $KUBE_SCORE_VERSION with $go_version into $dest"
GOBIN="$gobuild_tmp/bin" go install -trimpath -ldflags "-s -w" \
    "github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION" ||
    die "building kube-score $KUBE_SCORE_VERSION failed (see above)"
"$gobuild_tmp/bin/kube-score" version >&2 || die "the built kube-score does not run"

gobuild_publish
