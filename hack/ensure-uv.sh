#!/usr/bin/env bash
# Print the path of a uv executable, installing the pinned uv from PyPI into a cache
# outside the repo when none of that version is there yet.
#
# Usage: UV=$(hack/ensure-uv.sh)
set -euo pipefail

UV_VERSION=0.13.8
TOOLS="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/tools/uv-$UV_VERSION"

log() { printf 'ensure-uv: %s\n' "$*" >&2; }

if command -v uv >/dev/null 2>&1 && [[ $(uv --version 2>/dev/null) == "uv $UV_VERSION"* ]]; then
    command -v uv
    exit 0
fi
if [[ -x $TOOLS/bin/uv && -f $TOOLS/.complete ]]; then
    echo "$TOOLS/bin/uv"
    exit 0
fi
PYTHON=${PYTHON:-$(command -v python3 || true)}
[[ -n $PYTHON ]] || { log "python3 not found: install Python >= 3.11"; exit 1; }
log "installing uv $UV_VERSION from PyPI into $TOOLS"
rm -rf "$TOOLS"
mkdir -p "$(dirname "$TOOLS")"
"$PYTHON" -m venv "$TOOLS"
"$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION" >&2
touch "$TOOLS/.complete"
echo "$TOOLS/bin/uv"
