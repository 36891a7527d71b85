"""MiniStream plugin for vLLM. This module holds only `register()`.

vLLM calls `register()` (entry point group `vllm.general_plugins`, name `ministream`) in
every process it starts, so it is idempotent and imports nothing heavy: the model class is
registered by its `"module:Class"` string and imported only when a model is built.
"""

ARCHITECTURE = "MiniStreamForCausalLM"
MODEL_CLASS = "ministream.model:MiniStreamForCausalLM"


def register() -> None:
    """Register the MiniStream architecture and its `ministream` config type with vLLM."""
    from vllm import ModelRegistry

    from ministream.config import register_auto_config

    register_auto_config()
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
