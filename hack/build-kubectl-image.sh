#!/usr/bin/env bash
# Build a kubectl image from the kubectl that hack/build-controlplane.sh builds, for machines
# that reach no image registry: the chart's `helm test` pod runs `kubectl wait` and by default
# uses registry.k8s.io/kubectl, which cannot be pulled there.
#
#   agentrun/kubectl:<KUBERNETES_VERSION>   (e.g. agentrun/kubectl:v1.37.1, the version of
#                                            hack/versions.env)
#
# Like registry.k8s.io/kubectl it holds kubectl and nothing else (no shell): /bin/kubectl (a
# symlink to the control plane's static multi-call binary, which runs as kubectl by its name),
# ENTRYPOINT ["kubectl"], USER 65532:65532. It has its own name so it never stands in for the
# registry's image: install the chart with
#   --set tests.image.repository=agentrun/kubectl --set tests.image.tag=v1.37.1
#
# Usage: IMAGE=$(hack/build-kubectl-image.sh)     stdout: exactly one line, the image.
# Exit codes: 0 built (or already current); 3 no Docker engine can be had here
#             (hack/docker-up.sh said why); anything else: the build failed.
#
# Cache: the image carries the label dev.agentrun.kubectl.stamp, a hash of the binary and of
# this script; an image whose label matches is kept (a second run takes about a second). Cold,
# on a 2-core machine with the control plane already built: about 10 seconds.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LABEL=dev.agentrun.kubectl.stamp

log() { printf 'build-kubectl-image: %s\n' "$*" >&2; }
die() {
    printf 'build-kubectl-image: error: %s\n' "$*" >&2
    exit 1
}

# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
IMAGE=agentrun/kubectl:${KUBERNETES_VERSION:?KUBERNETES_VERSION not set in hack/versions.env}

rc=0
"$HACK_DIR/docker-up.sh" || rc=$?
((rc == 0)) || exit "$rc"
BIN=$("$HACK_DIR/build-controlplane.sh") || die "hack/build-controlplane.sh failed"
BINARY=$(readlink -f "$BIN/kubectl")
[[ -x $BINARY ]] || die "$BIN/kubectl is not executable"

STAMP=$({
    sha256sum "$BINARY" | cut -d' ' -f1
    cat "${BASH_SOURCE[0]}"
} | sha256sum | cut -c1-16)
if [[ $(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$IMAGE" 2>/dev/null || true) == "$STAMP" ]]; then
    log "$IMAGE is current (stamp $STAMP)"
    echo "$IMAGE"
    exit 0
fi

start=$SECONDS
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/rootfs/bin" "$WORK/rootfs/etc" "$WORK/rootfs/tmp"
chmod 1777 "$WORK/rootfs/tmp"
cp "$BINARY" "$WORK/rootfs/bin/kube-controlplane"
ln -s kube-controlplane "$WORK/rootfs/bin/kubectl"
printf 'root:x:0:0:root:/:/bin/false\nnonroot:x:65532:65532:nonroot:/tmp:/bin/false\n' >"$WORK/rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$WORK/rootfs/etc/group"

old=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
tar -C "$WORK/rootfs" --numeric-owner --owner=0 --group=0 -c . |
    docker import \
        --change 'ENTRYPOINT ["kubectl"]' \
        --change 'USER 65532:65532' \
        --change 'ENV PATH=/bin HOME=/tmp' \
        --change "LABEL $LABEL=$STAMP org.opencontainers.image.version=$KUBERNETES_VERSION" \
        - "$IMAGE" >/dev/null
[[ -z $old || $old == "$(docker image inspect -f '{{.Id}}' "$IMAGE")" ]] ||
    docker image rm "$old" >/dev/null 2>&1 || true
log "built $IMAGE in $((SECONDS - start))s"
echo "$IMAGE"
