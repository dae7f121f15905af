#!/usr/bin/env bash
# Build the status tools of hack/kstatus (kstatus: sigs.k8s.io/cli-utils' kstatus over one
# object; argocd-health: an Argo CD Lua health check run in gopher-lua) from the module
# versions pinned in hack/kstatus/go.mod, into a cache outside the repo.
#
# Usage: BIN=$(hack/build-kstatus.sh) && "$BIN/kstatus" < run.yaml
#
# stdout: exactly one line, the bin dir holding `kstatus` and `argocd-health`. Everything
#         else goes to stderr.
#
# Cache: ${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/
#        kstatus-${CLI_UTILS_VERSION}/{bin/kstatus,bin/argocd-health,stamp}
# A stamp (hash of hack/kstatus's go.mod, go.sum, sources and the build recipe) makes
# re-runs a no-op. The build goes to a temp dir beside the cache entry and is moved into
# place only when complete, under a lock (hack/lib/gobuild.sh).
#
# Environment: GOFLAGS, GOCACHE, GOMODCACHE, GOPROXY... are honoured as usual.
# GOTOOLCHAIN defaults to "local", CGO_ENABLED to 0.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MOD="$HACK_DIR/kstatus"
MIN_GO_MINOR=26 # hack/kstatus/go.mod says "go 1.26.0"

# shellcheck source=lib/gobuild.sh
source "$HACK_DIR/lib/gobuild.sh" build-kstatus

mod_version() { sed -nE "s#^[[:space:]]*(require[[:space:]]+)?${1//./\\.}[[:space:]]+(v[^[:space:]]+).*#\\2#p" "$MOD/go.mod" | head -n1; }
CLI_UTILS_VERSION=$(mod_version sigs.k8s.io/cli-utils)
[[ $CLI_UTILS_VERSION =~ ^v0\.[0-9]+\.[0-9]+$ ]] || die "hack/kstatus/go.mod: no sigs.k8s.io/cli-utils vX.Y.Z require line"

# --- build recipe (part of the stamp) -------------------------------------------
cgo=${CGO_ENABLED:-0}
recipe="v1 -buildvcs=false -trimpath -ldflags=-s-w CGO_ENABLED=$cgo kstatus:. argocd-health:./argocd-health"
stamp=$(printf '%s\n' "$recipe" | gobuild_stamp "$MOD"/go.mod "$MOD"/go.sum "$MOD"/main.go "$MOD"/argocd-health/main.go)

# --- cache entry ----------------------------------------------------------------
dest="$gobuild_cache_root/kstatus-$CLI_UTILS_VERSION"
gobuild_reuse "kstatus (cli-utils $CLI_UTILS_VERSION)" "$dest" "$stamp" kstatus argocd-health

# Go is only needed when there is something to build.
gobuild_require_go "$MIN_GO_MINOR" "to build hack/kstatus"
gobuild_prepare

log "building kstatus (cli-utils $CLI_UTILS_VERSION) and argocd-health with $go_version (GOFLAGS=${GOFLAGS:-}) into $dest"
(
    cd "$MOD"
    go build -mod=readonly -buildvcs=false -trimpath -ldflags "-s -w" -o "$gobuild_tmp/bin/kstatus" .
    go build -mod=readonly -buildvcs=false -trimpath -ldflags "-s -w" -o "$gobuild_tmp/bin/argocd-health" ./argocd-health
) || die "building hack/kstatus failed (see above)"
printf '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}' | "$gobuild_tmp/bin/kstatus" >/dev/null ||
    die "the built kstatus does not run"

gobuild_publish
