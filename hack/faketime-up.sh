#!/usr/bin/env bash
# Make sure libfaketime is here, for the clock-skew tests; print the path of its library.
#
# Usage: hack/faketime-up.sh      (idempotent: a no-op when the library is installed)
#
# 1. Debian's libfaketime is installed: print the path of libfaketimeMT.so.1 and exit 0.
# 2. Otherwise, as root on a machine with apt: install Debian's `faketime` (hack/lib/apt.sh:
#    waits for any other apt-get or dpkg to finish), then as 1.
# 3. Otherwise: print one line, "libfaketime is not available: REASON", on stderr and exit 3.
#
# A process started with LD_PRELOAD=<that path> and FAKETIME="+4m" (or "-4m") reads the wall
# clock four minutes ahead (behind); FAKETIME_DONT_FAKE_MONOTONIC=1 leaves its monotonic clock
# alone.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { printf 'faketime-up: %s\n' "$*" >&2; }
# shellcheck source=lib/apt.sh
source "$HACK_DIR/lib/apt.sh"
unavailable() {
    printf 'libfaketime is not available: %s\n' "$*" >&2
    exit 3
}
library() {
    local path
    for path in /usr/lib/*/faketime/libfaketimeMT.so.1 /usr/lib/faketime/libfaketimeMT.so.1; do
        if [ -f "$path" ]; then
            printf '%s\n' "$path"
            return 0
        fi
    done
    return 1
}

library && exit 0
[ "$(id -u)" = 0 ] || unavailable "it is not installed, and installing it needs root"
command -v apt-get >/dev/null 2>&1 || unavailable "it is not installed, and there is no apt-get"
apt_install faketime || unavailable "\`apt-get install faketime\` failed (see above)"
library || unavailable "\`apt-get install faketime\` left no libfaketimeMT.so.1 under /usr/lib"
