#!/usr/bin/env bash
# The argoexec image of the benchmark's peer leg: argoexec built by hack/build-argo.sh on the
# local busybox:1.36 base image (hack/build-base-images.sh), in the local Docker engine
# (hack/docker-up.sh). No registry is needed or used: the local node's docker runtime runs it
# with imagePullPolicy Never.
#
# Usage: IMAGE=$(hack/build-argoexec-image.sh)
#
# stdout: exactly one line, the image (agentrun-bench/argoexec:<version>). Everything else
#         goes to stderr. Exit 3 when no Docker engine can be had here (as hack/docker-up.sh).
#
# Like upstream's argoexec image (its Dockerfile's `argoexec` target) it runs as user 8737
# with argoexec as its entrypoint; upstream's base is distroless/static, not reachable here,
# so busybox's is used (argoexec is static and needs nothing of it). Docker's layer cache
# makes a rebuild with the same binary a no-op.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=argo/versions.env
source "$HACK_DIR/argo/versions.env"
TAG=agentrun-bench/argoexec:$ARGO_WORKFLOWS_VERSION

log() { printf 'build-argoexec-image: %s\n' "$*" >&2; }

BIN=$("$HACK_DIR/build-argo.sh")
rc=0
"$HACK_DIR/docker-up.sh" || rc=$?
((rc == 0)) || exit "$rc"
"$HACK_DIR/build-base-images.sh"

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$BIN/argoexec" "$context/argoexec"
cat >"$context/Dockerfile" <<'DOCKERFILE'
FROM busybox:1.36
COPY argoexec /bin/argoexec
USER 8737
ENTRYPOINT ["argoexec"]
DOCKERFILE
start=$SECONDS
docker build -t "$TAG" "$context" >&2
log "built $TAG in $((SECONDS - start))s"
echo "$TAG"
