"""LoRA numerics: the reference model with an adapter merged in, and vLLM serving adapters.

The reference reads the training framework's `adapter.pt` (the input contract, not the
converted PEFT directory) and merges `W_eff = W + (alpha / r) · lora_B @ lora_A` into the
raw fused matrices' rows, split by the name table as the converter splits base weights.
So the converter's per-module split, vLLM's packing of q/k/v and gate/up LoRAs and its
punica kernels are all checked against the contract.

`python -m ministream_reference.lora --model DIR --adapter NAME=DIR[=ADAPTER_PT] ... --out FILE`
runs ONE offline vLLM engine with LoRA on and decodes every prompt once per adapter and once
without, all in one `generate` call, so base and adapter requests share batches
(`--max-loras` as many slots as given adapters: every slot in use).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ministream.atomic_file import write_atomic
from ministream_reference.golden import DEFAULT_PROMPTS, Completion


@dataclass
class LoraCompletion(Completion):
    adapter: str | None = None  # None: the base model


def merged_state(model_dir: str | Path, adapter_pt: str | Path) -> dict[str, Any]:
    """The base directory's HF-named weights with the adapter's fused deltas added."""
    import torch
    from safetensors.torch import load_file

    from ministream.lora_convert import read_base
    from ministream.names import lora_targets

    model_dir = Path(model_dir)
    cfg, _ = read_base(model_dir)
    state: dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(str(path)))
    adapter = torch.load(adapter_pt, map_location="cpu", weights_only=True)
    scale = adapter["lora_config"]["alpha"] / adapter["lora_config"]["r"]
    lora = adapter["lora"]
    for (layer, target), info in lora_targets(cfg).items():
        key = f"blocks.{layer}.{target}"
        if f"{key}.lora_A" not in lora:
            continue
        delta = scale * lora[f"{key}.lora_B"].double() @ lora[f"{key}.lora_A"].double()
        for s in info.slices:
            state[s.hf] = (state[s.hf].double() + delta[s.start : s.stop]).to(state[s.hf].dtype)
    return state


def reference_lora_completions(
    model_dir: str | Path,
    adapter_pt: str | Path | None,
    prompts: list[list[int]],
    max_tokens: int,
    top_k: int = 5,
) -> list[Completion]:
    """Greedy completions of the float32 reference, with the adapter merged (None: base)."""
    import torch

    from ministream.config import MiniStreamConfig
    from ministream_reference.model import ReferenceMiniStream

    if adapter_pt is None:
        from ministream_reference.golden import reference_completions

        return reference_completions(model_dir, prompts, max_tokens, top_k)
    cfg = MiniStreamConfig.from_json_file(str(Path(model_dir) / "config.json"))
    model = ReferenceMiniStream.from_state_dict(
        cfg, merged_state(model_dir, adapter_pt), dtype=torch.float32
    )
    out = []
    for prompt in prompts:
        tokens, logprobs = model.generate_greedy(prompt, max_tokens, top_k=top_k)
        out.append(Completion(list(prompt), tokens, logprobs))
    return out


def vllm_lora_completions(
    model_dir: str | Path,
    adapters: dict[str, str],
    prompts: list[list[int]],
    max_tokens: int,
    top_k: int = 5,
    **llm_kwargs: Any,
) -> list[LoraCompletion]:
    """Every prompt without an adapter and with each adapter, in one `generate` call
    (call under `if __name__ == "__main__"`)."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    llm = LLM(model=str(model_dir), enable_lora=True, **llm_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=top_k)
    names: list[str | None] = [None, *adapters]
    requests = {name: LoRARequest(name, i + 1, adapters[name]) for i, name in enumerate(adapters)}
    # Interleaved (base, a, b, base, a, b, ...): every batch mixes base and adapter requests.
    order = [(prompt, name) for prompt in prompts for name in names]
    results = llm.generate(
        [{"prompt_token_ids": list(p)} for p, _ in order],
        params,
        lora_request=[None if n is None else requests[n] for _, n in order],
        use_tqdm=False,
    )
    out = []
    for (prompt, name), result in zip(order, results, strict=True):
        seq = result.outputs[0]
        logprobs = [
            {int(tok): float(lp.logprob) for tok, lp in step.items()}
            for step in (seq.logprobs or [])
        ]
        out.append(LoraCompletion(list(prompt), list(seq.token_ids), logprobs, name))
    return out


def load(path: str | Path) -> list[LoraCompletion]:
    return [
        LoraCompletion(
            c["prompt"],
            c["tokens"],
            [{int(k): v for k, v in step.items()} for step in c["logprobs"]],
            c["adapter"],
        )
        for c in json.loads(Path(path).read_text())
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument(
        "--adapter", action="append", required=True, metavar="NAME=DIR", help="repeatable"
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--max-loras", type=int, help="default: as many as --adapter")
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    adapters = dict(a.split("=", 1) for a in args.adapter)
    result = vllm_lora_completions(
        args.model,
        adapters,
        [list(p) for p in DEFAULT_PROMPTS],
        args.max_tokens,
        dtype="float32",
        tensor_parallel_size=args.tp,
        max_loras=args.max_loras or len(adapters),
        max_lora_rank=args.max_lora_rank,
        max_model_len=256,
        enforce_eager=True,
        seed=0,
    )
    write_atomic(Path(args.out), json.dumps([asdict(c) for c in result]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
