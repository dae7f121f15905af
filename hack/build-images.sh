#!/usr/bin/env bash
# Build the operator image from Debian packages and PyPI alone (no image registry needed):
# a Docker engine (hack/docker-up.sh), the base images (hack/build-base-images.sh), then
# `docker build` of the Dockerfile on agentrun/debian:bookworm-slim.
#
# Usage: IMAGE=$(hack/build-images.sh [TAG])     (TAG default: agentrun-operator:dev)
#
# stdout: exactly one line, the image built. Everything else goes to stderr.
# Exit codes: 0 built; 3 no Docker engine can be had here (hack/docker-up.sh said why);
#             anything else: the build failed (its output is above).
#
# Cache: the base images carry a stamp and are rebuilt only when their recipe changes; the
# operator image is cached by Docker's layer cache (the dependency layer changes only with
# uv.lock and pyproject.toml), all in the engine's data root. Measured on a 2-core machine with
# the overlay2 storage driver: cold (docker.io not installed, nothing cached) 1.5 minutes, of
# which `docker build` about 1; warm (nothing changed) under a second; after a change under
# operator/ about 25 seconds. With the vfs driver (where overlayfs cannot be mounted) every
# build step copies the whole image: the cold `docker build` takes about 7 minutes.
#
# Environment:
#   AGENTRUN_DOCKER_NETWORK   network of the build's RUN steps (passed as --network), e.g. "host"
#                             where the engine's default network cannot reach the Debian mirror
#                             and PyPI. Default: the engine's default.
#   AGENTRUN_EXTRA_CA_CERTS   PEM file(s) of certificate authorities the build trusts for its
#                             HTTPS downloads (default: /usr/local/share/ca-certificates/**/*.crt,
#                             the ones added to this machine's trust store).
#   DOCKER_BUILD_ARGS         extra arguments for `docker build` (word-split), e.g. "--no-cache".
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HACK_DIR/.." && pwd)
TAG=${1:-agentrun-operator:dev}
BASE_IMAGE=agentrun/debian:bookworm-slim

log() { printf 'build-images: %s\n' "$*" >&2; }

rc=0
"$HACK_DIR/docker-up.sh" || rc=$?
((rc == 0)) || exit "$rc"
"$HACK_DIR/build-base-images.sh"

args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$TAG")
# The certificate authorities this machine added to its trust store (an intercepting proxy's,
# a company's): the build's downloads from PyPI go through the same network.
shopt -s nullglob globstar
# shellcheck disable=SC2206 # a glob, or the user's list of files
ca_files=(${AGENTRUN_EXTRA_CA_CERTS:-/usr/local/share/ca-certificates/**/*.crt})
shopt -u nullglob globstar
if ((${#ca_files[@]})); then
    log "trusting, for the build's downloads, the CAs in ${ca_files[*]}"
    args+=(--build-arg "EXTRA_CA_CERTS=$(cat "${ca_files[@]}")")
fi
[[ -z ${AGENTRUN_DOCKER_NETWORK:-} ]] || args+=(--network "$AGENTRUN_DOCKER_NETWORK")
# shellcheck disable=SC2206 # word-split on purpose
[[ -z ${DOCKER_BUILD_ARGS:-} ]] || args+=($DOCKER_BUILD_ARGS)
log "docker build -t $TAG --build-arg BASE_IMAGE=$BASE_IMAGE ${AGENTRUN_DOCKER_NETWORK:+--network $AGENTRUN_DOCKER_NETWORK }${DOCKER_BUILD_ARGS:-}${DOCKER_BUILD_ARGS:+ }$ROOT"
start=$SECONDS
previous=$(docker image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)
docker build "${args[@]}" "$ROOT" >&2
log "built $TAG in $((SECONDS - start))s"
# The image this build replaced: remove it (and its own layers) unless something still uses it,
# so rebuilds do not fill the engine's data root. The layer cache of the steps is kept.
if [[ -n $previous && $previous != "$(docker image inspect -f '{{.Id}}' "$TAG")" ]]; then
    docker image rm "$previous" >/dev/null 2>&1 || true
fi
echo "$TAG"
