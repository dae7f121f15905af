# shellcheck shell=bash
# Installing Debian packages from the project's scripts, safely beside any other apt-get or
# dpkg on the machine. hack/docker-up.sh installs docker.io and hack/build-base-images.sh
# debootstrap; the test suites may run both at the same moment (two pytest-xdist workers), and
# a machine may run apt on its own (unattended upgrades). Two apt-gets at once fail at once:
# "Could not get lock /var/lib/dpkg/lock-frontend".
#
# Sourced, after `set -euo pipefail` and after the script's own log function `log MESSAGE`
# (stderr), as
#     source "$HACK_DIR/lib/apt.sh"
# then
#     apt_install PKG...
#         install PKG... (--no-install-recommends, non-interactive). If the install fails (on a
#         new machine the package lists are missing or stale, so the package is not found),
#         `apt-get update` once and install again. Output goes to a log file whose last lines
#         are printed on failure. Returns apt-get's status.
#
# Waiting, bounded by AGENTRUN_APT_WAIT seconds (default 900), each wait said on stderr:
#   1. for the project's own lock, $AGENTRUN_APT_LOCK (default /run/lock/agentrun-apt.lock),
#      held around every apt-get of these scripts: one of the project's installs at a time;
#   2. for apt's and dpkg's own locks, held by any other process: `-o DPkg::Lock::Timeout` for
#      the dpkg lock, and for the package lists' lock (which `apt-get update` does not wait for
#      by itself) a retry every 2 s while apt says "Could not get lock".

apt_wait=${AGENTRUN_APT_WAIT:-900}
apt_lock=${AGENTRUN_APT_LOCK:-/run/lock/agentrun-apt.lock}

# apt-get ARGS under the project's lock, waiting for apt's locks; output appended to $apt_log.
apt_get_waiting() {
    local deadline=$((SECONDS + apt_wait)) fd said="" held
    mkdir -p "$(dirname "$apt_lock")"
    exec {fd}>>"$apt_lock"
    if ! flock -n "$fd"; then
        log "waiting (up to ${apt_wait}s) for another apt-get of this project to finish (lock $apt_lock)"
        if ! flock -w "$apt_wait" "$fd"; then
            exec {fd}>&-
            log "gave up after ${apt_wait}s: $apt_lock is still held"
            return 1
        fi
    fi
    while :; do
        if DEBIAN_FRONTEND=noninteractive apt-get -o "DPkg::Lock::Timeout=$apt_wait" "$@" \
            >>"$apt_log" 2>&1 {fd}>&-; then
            exec {fd}>&-
            return 0
        fi
        held=$(grep -o 'Could not get lock .*' "$apt_log" | tail -n 1 || true)
        if [[ -z $held ]] || ((SECONDS >= deadline)); then
            exec {fd}>&-
            return 1
        fi
        [[ $held == "$said" ]] || log "apt-get $1: waiting (up to ${apt_wait}s): $held"
        said=$held
        : >"$apt_log"
        sleep 2
    done
}

apt_install() {
    local rc=0
    apt_log=$(mktemp "${TMPDIR:-/tmp}/agentrun-apt.XXXXXX")
    log "installing Debian's $* (apt-get, waits for any other apt-get or dpkg to finish)"
    if ! apt_get_waiting install -y -q --no-install-recommends "$@"; then
        log "installing $* failed; updating the package lists (once) and trying again"
        apt_get_waiting update -q && apt_get_waiting install -y -q --no-install-recommends "$@" || rc=$?
    fi
    if ((rc != 0)); then
        tail -n 20 "$apt_log" >&2
        log "\`apt-get install $*\` failed (last lines above)"
    fi
    rm -f "$apt_log"
    return "$rc"
}
