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
# place only when complete, under a lock (as hack/build-helm.sh does).
#
# Environment: GOFLAGS, GOCACHE, GOMODCACHE, GOPROXY... are honoured as usual.
# GOTOOLCHAIN defaults to "local", CGO_ENABLED to 0.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MOD="$HACK_DIR/kstatus"
MIN_GO_MINOR=26 # hack/kstatus/go.mod says "go 1.26.0"

log() { printf 'build-kstatus: %s\n' "$*" >&2; }
die() {
    printf 'build-kstatus: error: %s\n' "$*" >&2
    exit 1
}

mod_version() { sed -nE "s#^[[:space:]]*(require[[:space:]]+)?${1//./\\.}[[:space:]]+(v[^[:space:]]+).*#\\2#p" "$MOD/go.mod" | head -n1; }
CLI_UTILS_VERSION=$(mod_version sigs.k8s.io/cli-utils)
[[ $CLI_UTILS_VERSION =~ ^v0\.[0-9]+\.[0-9]+$ ]] || die "hack/kstatus/go.mod: no sigs.k8s.io/cli-utils vX.Y.Z require line"

# --- build recipe (part of the stamp) -------------------------------------------
cgo=${CGO_ENABLED:-0}
recipe="v1 -buildvcs=false -trimpath -ldflags=-s-w CGO_ENABLED=$cgo kstatus:. argocd-health:./argocd-health"
stamp_value=$(
    {
        printf '%s\n' "$recipe"
        for f in "$MOD"/go.mod "$MOD"/go.sum "$MOD"/main.go "$MOD"/argocd-health/main.go; do
            printf '== %s\n' "${f#"$HACK_DIR"/}"
            cat "$f"
        done
    } | sha256sum | cut -d' ' -f1
)

# --- cache layout ---------------------------------------------------------------
cache_root="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}"
dest="$cache_root/kstatus-$CLI_UTILS_VERSION"
bin_dir="$dest/bin"

is_current() { [[ -f $dest/stamp && $(<"$dest/stamp") == "$stamp_value" && -x $bin_dir/kstatus && -x $bin_dir/argocd-health ]]; }

mkdir -p "$cache_root"
if is_current; then
    log "kstatus (cli-utils $CLI_UTILS_VERSION) up to date (stamp ${stamp_value:0:12}): nothing to build"
    printf '%s\n' "$bin_dir"
    exit 0
fi

# Go is only needed when there is something to build.
command -v go >/dev/null 2>&1 || die "go not found: install Go >= 1.${MIN_GO_MINOR} to build hack/kstatus (see README)"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED="$cgo"
go_version=$(go env GOVERSION) || die "'go env GOVERSION' failed"
go_minor=$(sed -nE 's/^go1\.([0-9]+).*/\1/p' <<<"$go_version")
if [[ -z $go_minor || $go_minor -lt $MIN_GO_MINOR ]]; then
    die "$go_version is too old: install Go >= 1.${MIN_GO_MINOR} to build hack/kstatus"
fi

# Serialize concurrent builds of the same entry; re-check after the lock.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$dest.lock"
    if ! flock -n 9; then
        log "another build holds $dest.lock; waiting"
        flock 9
    fi
    if is_current; then
        log "kstatus (cli-utils $CLI_UTILS_VERSION) up to date (built by a concurrent run): nothing to build"
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

log "building kstatus (cli-utils $CLI_UTILS_VERSION) and argocd-health with $go_version (GOFLAGS=${GOFLAGS:-}) into $dest"
start=$SECONDS
(
    cd "$MOD"
    go build -mod=readonly -buildvcs=false -trimpath -ldflags "-s -w" -o "$tmp/bin/kstatus" .
    go build -mod=readonly -buildvcs=false -trimpath -ldflags "-s -w" -o "$tmp/bin/argocd-health" ./argocd-health
) || die "building hack/kstatus failed (see above)"
printf '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}' | "$tmp/bin/kstatus" >/dev/null ||
    die "the built kstatus does not run"

printf '%s\n' "$stamp_value" >"$tmp/stamp"
if [[ -e $dest ]]; then
    old=$(mktemp -d "$dest.old.XXXXXX")
    mv "$dest" "$old/"
fi
mv "$tmp" "$dest"
log "installed into $bin_dir in $((SECONDS - start))s"
printf '%s\n' "$bin_dir"
