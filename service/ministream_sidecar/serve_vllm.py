"""The CPU serving image's entrypoint: vLLM's OpenAI server, with the KV cache sized to fit
the container unless the user sized it (`cpu_memory`).

    python3 -m ministream_sidecar.serve_vllm VLLM_ARGS...

is `python3 -m vllm.entrypoints.openai.api_server VLLM_ARGS...` with `VLLM_CPU_KVCACHE_SPACE`
added to the environment when neither it nor `--gpu-memory-utilization` /
`--kv-cache-memory-bytes` is given: vLLM's own default reserves 92 % of the pod's memory
limit and refuses to start when the page cache already holds more than 8 % of it. The
process replaces itself with vLLM (same PID, so the kubelet's signals reach vLLM). LoRA
adapters the pod's fetch step refused are left out of `--lora-modules` (`lora_modules`).
"""

from __future__ import annotations

import os
import sys

from . import cpu_memory, lora_modules

VLLM_SERVER = "vllm.entrypoints.openai.api_server"


def main(argv: list[str]) -> None:
    env = dict(os.environ)
    argv, dropped = lora_modules.admitted(argv)
    for entry in dropped:
        print(
            f"serve_vllm: LoRA adapter {entry} left out: the fetch-adapters step did not "
            "admit it (its log says why); serving the base model and the other adapters",
            file=sys.stderr,
            flush=True,
        )
    view = cpu_memory.MemoryView.read()
    if sized := cpu_memory.kv_cache_env(env, argv, view=view):
        env.update(sized)
        print(
            f"serve_vllm: {cpu_memory.describe(int(sized[cpu_memory.ENV]), view)}",
            file=sys.stderr,
            flush=True,
        )
    os.execve(sys.executable, [sys.executable, "-m", VLLM_SERVER, *argv], env)


if __name__ == "__main__":
    main(sys.argv[1:])
