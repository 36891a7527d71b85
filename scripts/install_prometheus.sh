#!/usr/bin/env bash
# Installs a real Prometheus server and promtool (Debian's `prometheus` package) for the
# observability tests (tests/observability/). Idempotent: does nothing when both are on PATH.
#
# The package's maintainer scripts would enable a `prometheus` service; the tests never use
# it (they start their own server on 127.0.0.1, a free port and a temporary data dir), and in
# containers without an init system nothing is started. Usage: scripts/install_prometheus.sh
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if have prometheus && have promtool; then
    echo "install_prometheus: already installed"
else
    SUDO=""
    [[ "$(id -u)" -ne 0 ]] && SUDO="sudo"
    echo "install_prometheus: apt-get install prometheus"
    ${SUDO} apt-get update
    DEBIAN_FRONTEND=noninteractive ${SUDO} apt-get install -y --no-install-recommends prometheus
fi

prometheus --version 2>&1 | sed -n 1p
promtool --version 2>&1 | sed -n 1p
