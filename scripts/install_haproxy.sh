#!/usr/bin/env bash
# Installs a real HAProxy (Debian's `haproxy` package) for the rolling-restart experiment
# (`ministream-loadtest rollout`, tests/loadtest/): the load balancer that follows each
# replica's sidecar /readyz the way a Kubernetes Service follows pod readiness.
# Idempotent: does nothing when `haproxy` is on PATH.
#
# The package's maintainer scripts would enable a `haproxy` service; the experiment never
# uses it (it starts its own HAProxy on 127.0.0.1 with a config in a temporary directory),
# and in containers without an init system nothing is started. Usage: scripts/install_haproxy.sh
set -euo pipefail

source "$(dirname "$0")/apt_install.sh"

if have haproxy; then
    echo "install_haproxy: already installed"
else
    apt_install install_haproxy haproxy
fi

haproxy -v 2>&1 | sed -n 1p
