"""Golden numerics: greedy tokens and top-k logprobs from vLLM and from the reference model.

Used by the tests, the GPU script and the benchmarks, so every comparison runs the same
code. `python -m ministream_reference.golden --model DIR [--tp N] [--dtype D] --out FILE.json`
runs one vLLM engine (offline `vllm.LLM`) and writes its outputs (and their provenance block
beside them, FILE.provenance.json); `compare()` applies the
semantics of vLLM's `check_logprobs_close`: sequences must agree token for token; where
they first differ, each side's token must be in the other's top-k, and the comparison
stops there (later tokens condition on different prefixes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ministream.atomic_file import write_atomic
from ministream_testkit.provenance import write_sidecar

DEFAULT_PROMPTS: tuple[tuple[int, ...], ...] = (
    (1, 17, 250, 9, 33),
    (1, 400, 401, 402, 403, 404, 405, 406),
    (1, 5),
    (1, 77, 300, 12, 6, 90, 200, 150, 11, 499, 3, 44),
)


@dataclass
class Completion:
    prompt: list[int]
    tokens: list[int]
    logprobs: list[dict[int, float]]  # top-k per generated position


def reference_completions(
    model_dir: str | Path,
    prompts: list[list[int]],
    max_tokens: int,
    top_k: int = 5,
    device: str = "cpu",
    emulate: str | None = None,
) -> list[Completion]:
    """The reference model in float32 (on `device`) on the directory's weights; with
    `emulate="fp8"`, its linear layers as vLLM's online FP8 computes them (fp8_emulation)."""
    import torch

    from ministream_reference.model import ReferenceMiniStream

    model = ReferenceMiniStream.from_pretrained(model_dir, dtype=torch.float32, device=device)
    if emulate == "fp8":
        from ministream_reference.fp8_emulation import emulate_fp8

        emulate_fp8(model)
    out = []
    for prompt in prompts:
        tokens, logprobs = model.generate_greedy(prompt, max_tokens, top_k=top_k)
        out.append(Completion(list(prompt), tokens, logprobs))
    return out


def vllm_completions(
    model_dir: str | Path,
    prompts: list[list[int]],
    max_tokens: int,
    top_k: int = 5,
    **llm_kwargs: Any,
) -> list[Completion]:
    """Greedy decode with an offline vLLM engine (call under `if __name__ == "__main__"`)."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model_dir), **llm_kwargs)
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, logprobs=top_k, ignore_eos=False
    )
    results = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    out = []
    for prompt, result in zip(prompts, results, strict=True):
        seq = result.outputs[0]
        logprobs = [
            {int(tok): float(lp.logprob) for tok, lp in step.items()}
            for step in (seq.logprobs or [])
        ]
        out.append(Completion(list(prompt), list(seq.token_ids), logprobs))
    return out


@dataclass
class Mismatch:
    prompt_index: int
    position: int
    detail: str


def compare(
    expected: list[Completion],
    actual: list[Completion],
    *,
    atol: float,
    require_identical: bool = True,
) -> list[Mismatch]:
    """Check `actual` against `expected`; return every violation (empty list = pass).

    Top-k logprobs present in both are compared with absolute tolerance `atol` up to the
    first divergence. With `require_identical`, any token divergence is a violation;
    otherwise a divergence is allowed when each token is in the other's top-k.
    """
    problems: list[Mismatch] = []
    for i, (exp, act) in enumerate(zip(expected, actual, strict=True)):
        if exp.prompt != act.prompt:
            problems.append(Mismatch(i, -1, "different prompts"))
            continue
        for pos, (e_tok, a_tok) in enumerate(zip(exp.tokens, act.tokens, strict=False)):
            e_lp, a_lp = exp.logprobs[pos], act.logprobs[pos]
            if e_tok != a_tok:
                if require_identical or e_tok not in a_lp or a_tok not in e_lp:
                    problems.append(
                        Mismatch(
                            i,
                            pos,
                            f"token {a_tok} != expected {e_tok}; expected top-k {e_lp}, got {a_lp}",
                        )
                    )
                break
            for tok in e_lp.keys() & a_lp.keys():
                if abs(e_lp[tok] - a_lp[tok]) > atol:
                    problems.append(
                        Mismatch(
                            i,
                            pos,
                            f"logprob of token {tok}: {a_lp[tok]:.5f} vs expected "
                            f"{e_lp[tok]:.5f} (atol {atol})",
                        )
                    )
        else:
            if len(exp.tokens) != len(act.tokens):
                problems.append(
                    Mismatch(
                        i,
                        min(len(exp.tokens), len(act.tokens)),
                        f"length {len(act.tokens)} != {len(exp.tokens)}",
                    )
                )
    return problems


def as_llama(model_dir: str | Path, out_dir: str | Path) -> Path:
    """A copy of a converted directory that vLLM reads as its built-in LlamaForCausalLM.

    The weights are symlinked, not copied: the independent oracle serves identical bytes.
    """
    src, dst = Path(model_dir), Path(out_dir)
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.name == "config.json":
            continue
        target = dst / path.name
        if not target.exists():
            os.symlink(path.resolve(), target)
    config = json.loads((src / "config.json").read_text())
    config.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def save(completions: list[Completion], path: str | Path) -> None:
    write_atomic(Path(path), json.dumps([asdict(c) for c in completions]))


def load(path: str | Path) -> list[Completion]:
    return [
        Completion(
            c["prompt"],
            c["tokens"],
            [{int(k): v for k, v in step.items()} for step in c["logprobs"]],
        )
        for c in json.loads(Path(path).read_text())
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--engine", choices=["vllm", "reference"], default="vllm")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--eager", action="store_true", help="enforce_eager (no compile)")
    parser.add_argument("--device", default="cpu", help="reference engine's torch device")
    parser.add_argument(
        "--emulate",
        choices=["fp8"],
        default=None,
        help="reference engine: emulate vLLM's online FP8 in its linear layers",
    )
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    args = parser.parse_args(argv)
    prompts = [list(p) for p in DEFAULT_PROMPTS]
    if args.engine == "reference":
        result = reference_completions(
            args.model, prompts, args.max_tokens, device=args.device, emulate=args.emulate
        )
    else:
        extra = (
            {}
            if args.gpu_memory_utilization is None
            else {"gpu_memory_utilization": args.gpu_memory_utilization}
        )
        result = vllm_completions(
            args.model,
            prompts,
            args.max_tokens,
            dtype=args.dtype,
            tensor_parallel_size=args.tp,
            pipeline_parallel_size=args.pp,
            load_format=args.load_format,
            max_model_len=args.max_model_len,
            enforce_eager=args.eager,
            seed=0,
            **extra,
        )
    tmp = Path(f"{args.out}.tmp")
    save(result, tmp)
    shutil.move(tmp, args.out)
    # A golden file is a list (readers index it as one), so its provenance block goes beside
    # it: NAME.provenance.json (docs/benchmarks.md, "How results are recorded").
    write_sidecar(Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
