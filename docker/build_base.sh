#!/usr/bin/env bash
# Build a local base image from Debian packages, for machines that cannot pull flwr/superlink or flwr/supernode.
#
#   docker/build_base.sh [--tag TAG] [--suite SUITE] [--mirror URL] [--force]
#
# debootstrap a minimal Debian root (python3 + venv, CA certificates), lay it out like Flower's official images
# (virtual environment /python/venv first on PATH, user `app` uid 49999, WORKDIR and HOME /app) and `docker import`
# it as TAG (default silofl/base:bookworm). The image has no Flower: the silofl images install everything from the
# wheelhouse (docker/wheels.sh). Skips the work when TAG already exists, unless --force. Needs root (debootstrap,
# chroot) and a Debian mirror; prints the seconds it took.
set -euo pipefail

TAG="silofl/base:bookworm"
SUITE="bookworm"
MIRROR="http://deb.debian.org/debian"
FORCE=0
DOCKER="${DOCKER:-docker}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --tag) TAG="$2"; shift 2 ;;
        --suite) SUITE="$2"; shift 2 ;;
        --mirror) MIRROR="$2"; shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "build_base.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

if [[ "$FORCE" == 0 ]] && "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
    echo "build_base.sh: $TAG exists; nothing to do (--force rebuilds it)"
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "build_base.sh: debootstrap and chroot need root; run it with sudo" >&2
    exit 1
fi
command -v debootstrap >/dev/null || { echo "build_base.sh: debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }

start=$(date +%s)
work="$(mktemp -d "${TMPDIR:-/tmp}/silofl-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"

# minbase: dpkg, apt and essentials only; python3-venv brings ensurepip (pip for the virtual environment).
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE" "$root" "$MIRROR" \
    > "$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log" >&2; exit 1; }

chroot "$root" /bin/sh -euc '
    python3 -m venv /python/venv
    /python/venv/bin/python -m pip --version
    useradd --no-create-home --home-dir /app -c "" --uid 49999 app
    mkdir -p /app
    chown -R app:app /app
    apt-get clean
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /usr/share/doc/* /usr/share/man/* /usr/share/locale/*
'

# The same environment as flwr/base (framework/docker/base/ubuntu/Dockerfile in adap/flower).
tar --numeric-owner -C "$root" -c . | "$DOCKER" import \
    --change 'ENV PATH=/python/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV PYTHONUNBUFFERED=1' \
    --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
    --change 'ENV PYTHONIOENCODING=UTF-8' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV LC_ALL=C.UTF-8' \
    --change 'ENV HOME=/app' \
    --change 'WORKDIR /app' \
    --change 'USER app' \
    --change 'CMD ["python3"]' \
    --message "silofl base: debootstrap $SUITE minbase + python3, $(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    - "$TAG" >/dev/null

echo "build_base.sh: built $TAG in $(( $(date +%s) - start )) s"
