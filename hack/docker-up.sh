#!/usr/bin/env bash
# Make sure a Docker engine answers `docker info`, starting one if this machine can.
#
# Usage: hack/docker-up.sh            (idempotent: a no-op when `docker info` already works)
#
# 1. `docker info` works: done (whatever engine that is: Docker Desktop, a system service...).
# 2. Otherwise, as root on a machine with apt: install Debian's `docker.io` when `dockerd` is
#    missing (hack/lib/apt.sh: waits for any other apt-get or dpkg to finish), then start `dockerd` in the background and wait, bounded, until `docker info`
#    answers. The engine keeps running after this script exits.
#    Storage driver: overlay2 when an overlay mount works in the data root (a test mount says),
#    else vfs, which works on any filesystem but copies the whole image for every layer: with
#    vfs the operator image's cold build takes about 7 minutes and each build step tens of
#    seconds; with overlay2 a fraction of that.
# 3. Otherwise: print one line, "docker is not available: REASON", on stderr and exit 3.
#
# Exit codes: 0 an engine answers; 3 no engine can be had here (callers skip their container
# tests and show the reason); anything else is a bug in this script.
#
# State, outside the repository, in ${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/docker/:
#   dockerd.log   the engine's log (read it when the engine does not come up)
#   dockerd.pid   its pid file
#   data/         its --data-root: images and the build cache, so a second run is fast
#
# Environment: AGENTRUN_DOCKER_WAIT (seconds to wait for the engine, default 60),
#              AGENTRUN_DOCKER_STORAGE_DRIVER (overlay2 or vfs: skip the test mount).
set -euo pipefail

CACHE="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/docker"
LOG="$CACHE/dockerd.log"
PIDFILE="$CACHE/dockerd.pid"
WAIT=${AGENTRUN_DOCKER_WAIT:-60}

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { printf 'docker-up: %s\n' "$*" >&2; }
# shellcheck source=lib/apt.sh
source "$HACK_DIR/lib/apt.sh"
unavailable() {
    printf 'docker is not available: %s\n' "$*" >&2
    exit 3
}
answers() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }
# Can overlayfs be mounted over directories of the data root's filesystem?
overlay_works() {
    local dir rc=1
    dir=$(mktemp -d "$CACHE/overlay-test.XXXXXX")
    mkdir "$dir/lower" "$dir/upper" "$dir/work" "$dir/merged"
    if mount -t overlay overlay -o "lowerdir=$dir/lower,upperdir=$dir/upper,workdir=$dir/work" \
        "$dir/merged" 2>/dev/null; then
        rc=0
        umount "$dir/merged"
    fi
    rm -rf "$dir"
    return "$rc"
}

answers && exit 0

# One starter at a time: a second caller waits for the first one's engine instead of racing it.
mkdir -p "$CACHE"
exec 9>"$CACHE/docker-up.lock"
flock -w "$((WAIT * 2))" 9 || unavailable "another hack/docker-up.sh holds $CACHE/docker-up.lock"
answers && exit 0

# A previous run of this script may have started the engine and it is still coming up.
# (Checked by name: after a reboot the pid may belong to something else.)
if [[ -f $PIDFILE ]] && [[ $(cat "/proc/$(<"$PIDFILE")/comm" 2>/dev/null) == dockerd ]]; then
    mine=$(<"$PIDFILE")
else
    mine=""
fi

if [[ -z $mine ]]; then
    [[ $(id -u) == 0 ]] ||
        unavailable "no engine answers \`docker info\` and starting one needs root (run as root, or start Docker yourself)"
    if ! command -v dockerd >/dev/null 2>&1; then
        command -v apt-get >/dev/null 2>&1 ||
            unavailable "no engine answers \`docker info\`, dockerd is not installed and there is no apt-get to install it"
        # Waits for any other apt-get or dpkg (hack/lib/apt.sh).
        apt_install docker.io || unavailable "\`apt-get install docker.io\` failed (see above)"
        command -v dockerd >/dev/null 2>&1 || unavailable "docker.io is installed but dockerd is not on PATH"
    fi
    command -v docker >/dev/null 2>&1 || unavailable "dockerd is installed but the docker client is not on PATH"
    mkdir -p "$CACHE/data"
    driver=${AGENTRUN_DOCKER_STORAGE_DRIVER:-}
    if [[ -z $driver ]]; then
        driver=vfs
        overlay_works && driver=overlay2
    fi
    log "starting dockerd --storage-driver=$driver (log: $LOG)"
    # setsid: the engine outlives this script and is not killed with the caller's process group;
    # it does not inherit the lock (fd 9).
    setsid dockerd --storage-driver="$driver" --data-root="$CACHE/data" --pidfile="$PIDFILE" \
        </dev/null >>"$LOG" 2>&1 9>&- &
    mine=$!
fi

for ((i = 0; i < WAIT * 2; i++)); do
    answers && exit 0
    if ! kill -0 "$mine" 2>/dev/null; then
        tail -n 5 "$LOG" >&2 || true
        unavailable "dockerd exited while starting (last lines above; full log: $LOG)"
    fi
    sleep 0.5
done
tail -n 5 "$LOG" >&2 || true
unavailable "dockerd (pid $mine) did not answer \`docker info\` within ${WAIT}s (log: $LOG)"
