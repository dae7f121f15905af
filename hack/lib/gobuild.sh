# shellcheck shell=bash
# What the hack/build-*.sh scripts share: each builds Go programs from pinned modules into a
# cache entry outside the repo, reuses the entry when its stamp matches, and builds into a temp
# dir beside it that is moved into place only when complete, under a lock, so an interrupted or
# concurrent run never leaves a half-populated entry.
#
# Sourced, after `set -euo pipefail` and with HACK_DIR set (the stamp names files relative to
# it), as
#     source "$HACK_DIR/lib/gobuild.sh" NAME
# NAME (build-helm) begins every stderr line of log and die. Then, in order:
#
#   stamp=$(printf '%s\n' "$recipe" | gobuild_stamp FILE...)
#       the hash of the build recipe (stdin) and of each FILE under its name
#   gobuild_reuse WHAT DEST STAMP TOOL...
#       DEST (a dir below $gobuild_cache_root) with DEST/stamp == STAMP and every TOOL in
#       DEST/bin: say "WHAT up to date", print DEST/bin and exit 0. Otherwise remember the entry
#       for what follows. WHAT may be empty.
#   gobuild_require_go MIN_MINOR [PURPOSE]
#       Go >= 1.MIN_MINOR or die ("install Go ... PURPOSE"); exports GOTOOLCHAIN (default local)
#       and CGO_ENABLED (default 0), sets go_version (go1.26.0)
#   gobuild_prepare
#       take the entry's lock (waiting for a concurrent build, and exiting as gobuild_reuse
#       when that build made the entry), make the temp entry $gobuild_tmp with bin/ (removed on
#       exit), set gobuild_start to $SECONDS
#   gobuild_publish
#       write the stamp into $gobuild_tmp, put it in place of DEST, print DEST/bin
#
# gobuild_require_go may come before gobuild_reuse instead, when Go is needed either way.

gobuild_name=$1
# shellcheck disable=SC2034 # read by the build scripts
gobuild_cache_root="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}"

log() { printf '%s: %s\n' "$gobuild_name" "$*" >&2; }
die() {
    printf '%s: error: %s\n' "$gobuild_name" "$*" >&2
    exit 1
}

gobuild_stamp() {
    local f
    {
        cat
        for f in "$@"; do
            printf '== %s\n' "${f#"$HACK_DIR"/}"
            cat "$f"
        done
    } | sha256sum | cut -d' ' -f1
}

gobuild_is_current() {
    [[ -f $gobuild_dest/stamp && $(<"$gobuild_dest/stamp") == "$gobuild_stamp_value" ]] || return 1
    local t
    for t in "${gobuild_tools[@]}"; do [[ -x $gobuild_dest/bin/$t ]] || return 1; done
}

gobuild_reuse() {
    gobuild_what=$1 gobuild_dest=$2 gobuild_stamp_value=$3
    shift 3
    gobuild_tools=("$@")
    mkdir -p "${gobuild_dest%/*}"
    if gobuild_is_current; then
        log "${gobuild_what:+$gobuild_what }up to date (stamp ${gobuild_stamp_value:0:12}): nothing to build"
        printf '%s\n' "$gobuild_dest/bin"
        exit 0
    fi
}

gobuild_require_go() {
    local min_minor=$1 purpose=${2:+ $2} go_minor
    command -v go >/dev/null 2>&1 || die "go not found: install Go >= 1.${min_minor}${purpose} (see README)"
    export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
    export CGO_ENABLED="${CGO_ENABLED:-0}"
    go_version=$(go env GOVERSION) || die "'go env GOVERSION' failed"
    go_minor=$(sed -nE 's/^go1\.([0-9]+).*/\1/p' <<<"$go_version")
    if [[ -z $go_minor || $go_minor -lt $min_minor ]]; then
        die "$go_version is too old: install Go >= 1.${min_minor}${purpose} (see README)"
    fi
}

gobuild_cleanup() {
    rm -rf "$gobuild_tmp"
    if [[ -n $gobuild_old ]]; then rm -rf "$gobuild_old"; fi
}

gobuild_prepare() {
    local dest=$gobuild_dest
    # Serialize concurrent builds of the same entry; re-check after the lock.
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$dest.lock"
        if ! flock -n 9; then
            log "another build holds $dest.lock; waiting"
            flock 9
        fi
        if gobuild_is_current; then
            log "${gobuild_what:+$gobuild_what }up to date (built by a concurrent run): nothing to build"
            printf '%s\n' "$dest/bin"
            exit 0
        fi
        rm -rf "$dest".tmp.* "$dest".old.* # leftovers of killed builds (we hold the lock)
    fi
    gobuild_tmp=$(mktemp -d "$dest.tmp.XXXXXX")
    chmod 755 "$gobuild_tmp"
    gobuild_old=""
    trap gobuild_cleanup EXIT
    trap 'exit 130' INT TERM HUP
    mkdir -p "$gobuild_tmp/bin"
    gobuild_start=$SECONDS
}

gobuild_publish() {
    local dest=$gobuild_dest
    printf '%s\n' "$gobuild_stamp_value" >"$gobuild_tmp/stamp"
    if [[ -e $dest ]]; then
        gobuild_old=$(mktemp -d "$dest.old.XXXXXX")
        mv "$dest" "$gobuild_old/"
    fi
    mv "$gobuild_tmp" "$dest"
    log "installed into $dest/bin in $((SECONDS - gobuild_start))s"
    printf '%s\n' "$dest/bin"
}
