"""MiniStream plugin for vLLM. This module holds only `register()`.

vLLM calls `register()` (entry point group `vllm.general_plugins`, name `ministream`) in
every process it starts, so it is idempotent. It registers the model *class*, not a lazy
`"module:Class"` string: for a string, vLLM inspects the class in a fresh Python
subprocess (to keep CUDA out of the API server) whenever `VLLM_CACHE_ROOT/modelinfos` has
no entry for it, i.e. at every pod start with an empty cache volume. That subprocess
imports torch and vLLM again: 24 s of a 115 s first start on the H200, 11 s on the 2-vCPU
CPU machine (docs/benchmarks.md, time to Ready). The model module initialises no device
at import, and every process that registers the plugin imports it anyway to build the
model (the engine core is forked from the API server).

It also registers the load guard (`ministream.load_guard.EngineStartCheck`) as the
architecture's config check, so that a bad model location fails in the API server before
vLLM starts its engine core.

On vLLM's CPU build it points LoRA at `ministream.lora_punica`'s wrapper, which serves
requests without an adapter as the base model also when every adapter slot is in use
(vllm#48421; docs/plugin.md, "The full-slots guard").
"""

ARCHITECTURE = "MiniStreamForCausalLM"


def register() -> None:
    """Register the MiniStream architecture and its `ministream` config type with vLLM.

    With `MINISTREAM_SIDECAR_STARTUP_LOG` set, also stamp this process's vLLM log lines into
    that file for the sidecar's cold-start phases (ministream.startup_log)."""
    import os

    from ministream import startup_log  # standard library only

    if path := os.environ.get(startup_log.ENV):
        startup_log.attach(path)

    from vllm import ModelRegistry

    from ministream.config import register_auto_config

    register_auto_config()
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        from ministream.model import MiniStreamForCausalLM

        ModelRegistry.register_model(ARCHITECTURE, MiniStreamForCausalLM)

    # The load guard at config time, in the API server, before any engine process starts.
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from ministream.load_guard import EngineStartCheck

    MODELS_CONFIG_MAP.setdefault(ARCHITECTURE, EngineStartCheck)

    from ministream.lora_punica import install

    install()
