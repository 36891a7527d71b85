"""MiniStream sidecar: health, warmup gate, drain and cold-start metrics around `vllm serve`.

Nothing here imports torch, vLLM or the `ministream` plugin: the sidecar image has none of
them (tests/service/test_sidecar_isolation.py proves it).
"""

__version__ = "0.1.0"
