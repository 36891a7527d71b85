#!/usr/bin/env bash
# Installs the OCI tools that build and run the project's images without a Docker daemon
# (`make images`, tests/images/, `ministream-loadtest rollout --runtime podman`): Debian's
# buildah, podman, runc and mmdebstrap, plus what podman needs to run containers (uidmap,
# netavark, aardvark-dns, iptables, conmon, and catatonit: with no registry reachable, podman
# builds its pod "pause" image locally from it). Idempotent: does nothing when all are there.
#
# The packages' own configuration under /etc/containers is left alone: the project's scripts
# point CONTAINERS_CONF and CONTAINERS_STORAGE_CONF at files of their own
# (scripts/images/containers_env.sh), so this machine's settings never leak into another.
# Usage: scripts/install_oci.sh
set -euo pipefail

source "$(dirname "$0")/apt_install.sh"

if have buildah && have podman && have runc && have mmdebstrap && have conmon \
    && [[ -x /usr/libexec/podman/catatonit || -x /usr/bin/catatonit ]]; then
    echo "install_oci: already installed"
else
    apt_install install_oci buildah podman runc mmdebstrap uidmap netavark aardvark-dns iptables \
        conmon catatonit
fi

buildah --version
podman --version
runc --version | sed -n 1p
