"""The engine a GPU script measured: vLLM and torch versions and the device, for its report
(imported after vLLM is, so it costs nothing extra)."""

from __future__ import annotations


def engine_versions() -> dict[str, str]:
    import torch
    import vllm

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"vllm": vllm.__version__, "torch": torch.__version__, "device": device}
