#!/usr/bin/env bash
# Create or update the project's environment at .venv (idempotent).
#   scripts/setup.sh serve   # the engine (vLLM CPU build), S3 streaming, the sidecar
#   scripts/setup.sh test    # the above plus Ray (multi-node tests), vllm-router, NIXL (P/D tests), the test tools, helm/kubectl, Prometheus, HAProxy,
#                            # and the OCI tools (buildah, podman) that build and run the images
#   scripts/setup.sh oci     # the OCI tools only (`make images`; no .venv)
# Re-installs only when pyproject.toml, this script or install-nixl.sh changed since the last run.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-serve}
if [ "$target" = oci ]; then
  exec bash scripts/install_oci.sh
fi
case "$target" in
  serve) extras="cpu,s3,sidecar" ;;
  test) extras="cpu,s3,sidecar,multinode,router,pd,test" ;;
  *) echo "usage: scripts/setup.sh serve|test|oci" >&2; exit 2 ;;
esac

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$python" -m venv .venv
fi
stamp=.venv/.ministream-$target.stamp
want=$(cat pyproject.toml scripts/setup.sh docker/scripts/install-nixl.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "==> installing ministream-serving[$extras] into .venv (first run: a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[$extras]"
  # The registry's torchvision/torchaudio/torchcodec are built for CUDA torch and break
  # `import transformers` beside the CPU torch (docs/architecture.md §3); vLLM's CPU build needs none.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  if [ "$target" = test ]; then
    # `import nixl` (what vLLM's NixlConnector imports) over the pd extra's nixl-cu12.
    PYTHON=.venv/bin/python bash docker/scripts/install-nixl.sh
  fi
  echo "$want" > "$stamp"
fi

if [ "$target" = test ]; then
  for tool in scripts/install_tools.sh scripts/install_prometheus.sh scripts/install_haproxy.sh \
      scripts/install_oci.sh; do
    if [ -f "$tool" ]; then bash "$tool"; fi
  done
fi
