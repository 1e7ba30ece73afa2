#!/bin/sh
# Build the local base image the tests (and CI) use where no registry is reachable:
#   debootstrap --variant=minbase bookworm + python3 and pip, imported as harness-test-base:bookworm.
# Idempotent: does nothing when the image already exists (delete it to rebuild).
#
# usage: scripts/make-test-base-image.sh [IMAGE] [MIRROR]
#   IMAGE  default harness-test-base:bookworm
#   MIRROR default: the first Debian mirror in /etc/apt (this machine's apt source), else deb.debian.org
set -eu

IMAGE="${1:-harness-test-base:bookworm}"
MIRROR="${2:-}"

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "$IMAGE already exists: $(docker image inspect -f '{{.Id}}' "$IMAGE")"
    exit 0
fi

if [ -z "$MIRROR" ]; then
    # Reuse the apt source this machine already reaches (a proxy or local mirror behind it).
    # (only active files: *.list and *.sources; disabled ones have other suffixes)
    MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
             | grep -oE '^(deb|URIs:) *(\[[^]]*\] *)?https?://[^ ]+' \
             | grep -oE 'https?://[^ ]+' | grep -v security | head -n1 || true)
    MIRROR="${MIRROR:-http://deb.debian.org/debian}"
fi

ROOTFS=$(mktemp -d /var/tmp/harness-base-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT

echo "debootstrap bookworm (minbase + python3) from $MIRROR into $ROOTFS"
# python3 (+pip): stages, `harness inspect` and the supervisor's helpers run inside the image;
# ca-certificates: pip inside the image trusts the same roots as the host (plus an extra bundle).
debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates bookworm "$ROOTFS" "$MIRROR"
# Keep the image small: the apt lists and caches are not needed at run time.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*

tar -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    - "$IMAGE"
echo "built $IMAGE: $(docker image inspect -f '{{.Id}}' "$IMAGE")"
