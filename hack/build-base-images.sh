#!/usr/bin/env bash
# Build the two base images the project needs from Debian packages alone, for machines that
# reach a Debian mirror but no image registry:
#
#   agentrun/debian:bookworm-slim   Debian bookworm made by `debootstrap --variant=minbase`, slimmed
#                                   like the official debian:bookworm-slim (no docs, man pages or
#                                   locales; apt caches cleaned). hack/build-images.sh builds the
#                                   operator image on it (BASE_IMAGE build arg). It has its own
#                                   name so it never stands in for Docker Hub's debian:bookworm-slim:
#                                   where that can be pulled, a plain `docker build .` uses it.
#   busybox:1.36                    The step image of examples/ and the tests: Debian's
#                                   busybox-static (bookworm ships BusyBox 1.35; the tag is the one
#                                   the examples name) as /bin/busybox with a symlink per applet
#                                   (/bin/sh, /bin/echo, ...), /tmp (1777), /etc/passwd with root,
#                                   nobody (65534) and nonroot (65532, home /home/nonroot). A
#                                   busybox:1.36 this script did not make (one pulled from a
#                                   registry) is left alone.
#
# Usage: hack/build-base-images.sh       (needs a Docker engine: run hack/docker-up.sh first)
#
# The Debian mirror is the one this machine's apt uses for bookworm (from /etc/apt/sources.list
# and /etc/apt/sources.list.d/), else http://deb.debian.org/debian; AGENTRUN_DEBIAN_MIRROR
# overrides it. debootstrap is installed with apt-get when missing (hack/lib/apt.sh: it waits for
# any other apt-get or dpkg to finish; building the Debian image needs root; a machine that
# already has both images needs nothing). Concurrent runs take turns (a lock in the cache).
#
# Pinning and cache: each image carries the label dev.agentrun.base.stamp, a hash of this
# recipe (suite, variant, mirror, architecture and this script's text); an image whose label
# matches is kept, so a second run takes about a second. The labels dev.agentrun.base.debian-version
# and dev.agentrun.base.release-date record the point release and the mirror's Release date the
# image was made from, and dev.agentrun.base.busybox-version the busybox-static package. To take
# newer Debian packages, run with AGENTRUN_BASE_REFRESH=1. The images live in the Docker engine's
# data root (hack/docker-up.sh puts it in the cache directory).
#
# Environment: AGENTRUN_DEBIAN_MIRROR, AGENTRUN_BASE_REFRESH=1, AGENTRUN_DOCKER_NETWORK (the
# network of the container that fetches busybox-static; default: the engine's default network,
# falling back to "host" when that cannot reach the mirror).
set -euo pipefail

SUITE=bookworm
VARIANT=minbase
DEBIAN_IMAGE=agentrun/debian:bookworm-slim
BUSYBOX_IMAGE=busybox:1.36
LABEL=dev.agentrun.base
CACHE="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/base-images"

log() { printf 'build-base-images: %s\n' "$*" >&2; }
die() {
    printf 'build-base-images: error: %s\n' "$*" >&2
    exit 1
}
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/apt.sh
source "$HACK_DIR/lib/apt.sh"

docker info >/dev/null 2>&1 || die "no Docker engine answers \`docker info\`: run hack/docker-up.sh"

# --- the Debian mirror of this machine's apt ---------------------------------------------------
# Prints the first URI that serves "$SUITE ... main" as a binary (deb) source.
apt_mirror() {
    local file
    for file in /etc/apt/sources.list.d/*.sources; do
        [[ -f $file ]] || continue
        awk -v suite="$SUITE" '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " suite " ") &&
                    (" " comps " ") ~ / main / && uris != "") { split(uris, u, " "); print u[1]; exit }
                types = uris = suites = comps = enabled = ""
            }
            /^[[:space:]]*#/ { next }
            /^[[:space:]]*$/ { flush(); next }
            { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "") }
            key == "types" { types = $0 } key == "uris" { uris = $0 } key == "suites" { suites = $0 }
            key == "components" { comps = $0 } key == "enabled" { enabled = tolower($0) }
            END { flush() }' "$file"
    done
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f $file ]] || continue
        # deb [options] URI SUITE COMPONENT...
        sed -E 's/\[[^]]*\]//' "$file" |
            awk -v suite="$SUITE" '$1 == "deb" && $3 == suite { for (i = 4; i <= NF; i++) if ($i == "main") { print $2; exit } }'
    done
}
MIRROR=${AGENTRUN_DEBIAN_MIRROR:-$(apt_mirror 2>/dev/null | head -n1 || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
MIRROR=${MIRROR%/}
# The security archive sits beside the main one on Debian's own mirrors.
SECURITY_MIRROR=${MIRROR%/debian}/debian-security
[[ $MIRROR == */debian ]] || SECURITY_MIRROR=http://deb.debian.org/debian-security
ARCH=$(dpkg --print-architecture 2>/dev/null || true)
if [[ -z $ARCH ]]; then
    case $(uname -m) in
    x86_64) ARCH=amd64 ;; aarch64) ARCH=arm64 ;; *) die "unknown architecture $(uname -m)" ;;
    esac
fi
# A mirror that serves an archive snapshot has Release files past their Valid-Until; the image's
# apt then needs the same setting as this machine's.
# (Read whole, not through `grep -q`: an early exit would make apt-config fail under pipefail.)
NO_VALID_UNTIL=false
APT_CONFIG=$(apt-config dump 2>/dev/null || true)
if grep -qiE '^Acquire::Check-Valid-Until "(false|0|no)"' <<<"$APT_CONFIG"; then
    NO_VALID_UNTIL=true
fi

STAMP=$({
    echo "v1 $SUITE $VARIANT $ARCH $MIRROR $SECURITY_MIRROR $NO_VALID_UNTIL"
    cat "${BASH_SOURCE[0]}"
} | sha256sum | cut -c1-16)

# Import a root filesystem tarball (stdin) as IMAGE, then remove the image it replaces (if no
# container or image still uses it).
import_image() {
    local image=$1 old
    shift
    old=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
    docker import "$@" - "$image" >/dev/null
    [[ -z $old || $old == "$(docker image inspect -f '{{.Id}}' "$image")" ]] ||
        docker image rm "$old" >/dev/null 2>&1 || true
}
image_stamp() { docker image inspect -f "{{ index .Config.Labels \"$LABEL.stamp\" }}" "$1" 2>/dev/null || true; }
# Built here, from this recipe, and not asked to refresh.
current() { [[ ${AGENTRUN_BASE_REFRESH:-} != 1 && $(image_stamp "$1") == "$STAMP" ]]; }

mkdir -p "$CACHE"
# One build at a time (the image suite and the container suite may both ask at once): a second
# caller waits, then finds the images the first one made up to date.
exec 8>"$CACHE/build.lock"
if ! flock -n 8; then
    log "waiting for another build-base-images.sh to finish (lock $CACHE/build.lock)"
    flock 8
fi
WORK=$(mktemp -d "$CACHE/tmp.XXXXXX")
cleanup() {
    # debootstrap mounts /proc and /sys in the target: never remove through a mount.
    local mnt
    awk -v w="$WORK/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
    rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT

# --- agentrun/debian:bookworm-slim ---------------------------------------------------------------
build_debian() {
    local rootfs=$WORK/rootfs release_date version
    [[ $(id -u) == 0 ]] || die "building $DEBIAN_IMAGE needs root (debootstrap)"
    if ! command -v debootstrap >/dev/null 2>&1; then
        # Waits for any other apt-get or dpkg, such as hack/docker-up.sh's (hack/lib/apt.sh).
        apt_install debootstrap || die "\`apt-get install debootstrap\` failed (see above)"
    fi
    log "debootstrap --variant=$VARIANT $SUITE from $MIRROR ($ARCH)"
    debootstrap --variant="$VARIANT" --arch="$ARCH" "$SUITE" "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
        { tail -n 20 "$WORK/debootstrap.log" >&2; die "debootstrap failed (last lines above)"; }
    version=$(cat "$rootfs/etc/debian_version")
    release_date=$(sed -n 's/^Date: //p' "$rootfs"/var/lib/apt/lists/*_dists_"${SUITE}"_Release 2>/dev/null | head -n1 || true)
    [[ -n $release_date ]] || release_date=$(date -u +'%a, %d %b %Y %H:%M:%S UTC')

    # The image's apt sources: the same mirror, with updates and security.
    rm -f "$rootfs/etc/apt/sources.list"
    cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    if [[ $NO_VALID_UNTIL == true ]]; then
        echo 'Acquire::Check-Valid-Until "false";' >"$rootfs/etc/apt/apt.conf.d/99mirror-snapshot"
    fi
    # What the official slim images do: keep docs, man pages and locales out of later installs,
    # clean apt's caches after each install, start no services in a build.
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
EOF
    cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
    echo 'Acquire::GzipIndexes "true";' >"$rootfs/etc/apt/apt.conf.d/docker-gzip-indexes"
    echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$rootfs/etc/apt/apt.conf.d/docker-autoremove-suggests"
    printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
    chmod 755 "$rootfs/usr/sbin/policy-rc.d"
    # Remove what the slim rules would have kept out, and what is per-host or per-build.
    find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$rootfs"/usr/share/{man,groff,info,linda,lintian}/* "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
        "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old "$rootfs"/var/log/*.log \
        "$rootfs"/var/log/apt/* "$rootfs"/tmp/* "$rootfs"/etc/resolv.conf "$rootfs"/etc/hostname
    find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
    : >"$rootfs/etc/machine-id"

    log "importing $DEBIAN_IMAGE (Debian $version, mirror Release of $release_date)"
    tar --numeric-owner -C "$rootfs" -c . | import_image "$DEBIAN_IMAGE" \
        -c 'CMD ["bash"]' \
        -c "LABEL $LABEL.stamp=\"$STAMP\" $LABEL.debian-version=\"$version\" $LABEL.release-date=\"$release_date\" $LABEL.mirror=\"$MIRROR\""
    rm -rf --one-file-system "$rootfs"
}

# --- busybox:1.36 --------------------------------------------------------------------------------
# busybox-static comes from the same mirror, fetched and unpacked by apt inside the Debian image.
# shellcheck disable=SC2016 # expanded by the container's shell
BUSYBOX_RECIPE='
set -eu
cd /tmp
apt-get update -q >&2
apt-get download -q busybox-static >&2
dpkg-deb -x busybox-static_*.deb /out/root
dpkg-deb -f busybox-static_*.deb Version >/out/version
r=/out/root
rm -rf "$r/usr/share"
mkdir -p "$r/bin" "$r/sbin" "$r/usr/bin" "$r/usr/sbin" "$r/etc" "$r/root" "$r/home/nonroot" "$r/var" "$r/tmp"
[ -x "$r/bin/busybox" ] || mv "$r/usr/bin/busybox" "$r/bin/busybox"
for applet in $("$r/bin/busybox" --list-full | grep -v "^linuxrc$"); do
    [ -e "$r/$applet" ] || [ -L "$r/$applet" ] || ln -s /bin/busybox "$r/$applet"
done
cat >"$r/etc/passwd" <<EOF
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
nonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh
EOF
cat >"$r/etc/group" <<EOF
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
chmod 1777 "$r/tmp"
ln -s /tmp "$r/var/tmp"
chmod 700 "$r/root"
chown 65532:65532 "$r/home/nonroot"
tar --numeric-owner -C "$r" -cf /out/rootfs.tar .
chown -R "$OWNER" /out
'

build_busybox() {
    local out=$WORK/busybox network version args
    mkdir -p "$out"
    for network in ${AGENTRUN_DOCKER_NETWORK:-default host}; do
        args=(--rm -e "OWNER=$(id -u):$(id -g)" -v "$out:/out")
        [[ $network == default ]] || args+=(--network "$network")
        log "fetching busybox-static from $MIRROR (network: $network)"
        if docker run "${args[@]}" "$DEBIAN_IMAGE" sh -c "$BUSYBOX_RECIPE" 2>"$WORK/busybox.log"; then
            break
        fi
        tail -n 5 "$WORK/busybox.log" >&2
        rm -rf "${out:?}"/*
    done
    [[ -f $out/rootfs.tar ]] || die "could not fetch busybox-static in a container (see above)"
    version=$(<"$out/version")
    log "importing $BUSYBOX_IMAGE (Debian busybox-static $version)"
    import_image "$BUSYBOX_IMAGE" \
        -c 'CMD ["sh"]' \
        -c "LABEL $LABEL.stamp=\"$STAMP\" $LABEL.busybox-version=\"$version\" $LABEL.mirror=\"$MIRROR\"" \
        <"$out/rootfs.tar"
}

if current "$DEBIAN_IMAGE"; then
    log "$DEBIAN_IMAGE is up to date (stamp $STAMP)"
else
    build_debian
fi

if current "$BUSYBOX_IMAGE"; then
    log "$BUSYBOX_IMAGE is up to date (stamp $STAMP)"
elif docker image inspect "$BUSYBOX_IMAGE" >/dev/null 2>&1 && [[ -z $(image_stamp "$BUSYBOX_IMAGE") ]]; then
    log "$BUSYBOX_IMAGE exists and was not made here (pulled?): keeping it"
else
    build_busybox
fi
