#!/usr/bin/env bash
# Installs a real Prometheus server and promtool (Debian's `prometheus` package) for the
# observability tests (tests/observability/). Idempotent: does nothing when both are on PATH.
#
# The package's maintainer scripts would enable a `prometheus` service; the tests never use
# it (they start their own server on 127.0.0.1, a free port and a temporary data dir), and in
# containers without an init system nothing is started. Usage: scripts/install_prometheus.sh
set -euo pipefail

source "$(dirname "$0")/apt_install.sh"

if have prometheus && have promtool; then
    echo "install_prometheus: already installed"
else
    apt_install install_prometheus prometheus
fi

prometheus --version 2>&1 | sed -n 1p
promtool --version 2>&1 | sed -n 1p
