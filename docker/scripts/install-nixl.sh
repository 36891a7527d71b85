#!/usr/bin/env bash
# Make `import nixl` work beside the `pd` extra's NIXL backend wheel (nixl-cu12).
#
#   install-nixl.sh [--without-ep]
#
# vLLM's NixlConnector imports `nixl`, the name of a small meta wheel that dispatches to the
# backend wheel installed (nixl_cu12 here) but requires the CUDA 12 *and* 13 wheels. This
# installs the meta wheel at the backend's own version without its requirements, so the one
# pin stays the `pd` extra's in pyproject.toml.
#
# --without-ep  remove the backend's expert-parallel kernels (nixl_ep_cu12: CUDA kernels of
#               vLLM's MoE all-to-all, about 100 MB, unusable without a GPU): the CPU image.
# PYTHON  the interpreter whose environment receives it (default python3)
# Run by scripts/setup.sh (the test environment) and docker/Dockerfile.cpu.
set -euo pipefail
py="${PYTHON:-python3}"
backend=nixl-cu12
version="$("${py}" -c "from importlib.metadata import version; print(version('${backend}'))" 2>/dev/null)" || {
  echo "install-nixl: ${backend} is not installed: install the project's pd extra first" >&2
  exit 1
}
"${py}" -m pip install --disable-pip-version-check -q --no-deps "nixl==${version}"
if [ "${1:-}" = --without-ep ]; then
  site="$("${py}" -c "import nixl_cu12, pathlib; print(pathlib.Path(nixl_cu12.__file__).parent.parent)")"
  rm -rf "${site}/nixl_ep_cu12"
fi
echo "install-nixl: nixl ${version} over ${backend}"
