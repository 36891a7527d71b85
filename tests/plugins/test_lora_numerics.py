"""LoRA in the real vLLM engine (CPU build), against the reference with the adapter merged.

Two adapters of different ranks on different targets (the fused QKV and gate-up matrices;
the output and down projections), converted by `ministream convert-lora`, are served by ONE
engine per tensor-parallel size beside base requests, interleaved in one `generate` call
(`ministream_reference.lora`). Every request must reproduce the float32 reference that
merges `W + alpha/r · B @ A` from the raw adapter file: identical greedy tokens, chosen-token
(top-5) logprobs within 1e-3.

The engine runs with exactly as many adapter slots as adapters (`--max-loras 2`), the
configuration in which vLLM's CPU kernels serve base requests with the last slot's adapter
(vllm#48421): the base requests here fail without the plugin's guard
(`ministream.lora_punica`; seen without it: all four base prompts decoded token for token
as one of the adapters).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ministream_reference.golden import DEFAULT_PROMPTS, Completion, compare
from ministream_reference.lora import LoraCompletion, load, reference_lora_completions
from tests.support.golden_runs import MAX_TOKENS, run_lora_golden
from tests.support.models import ModelFactory

pytestmark = pytest.mark.engine

ATOL = 1e-3
PROMPTS = [list(p) for p in DEFAULT_PROMPTS]
# name -> (rank, targets): different ranks, disjoint targets, packed and plain modules.
ADAPTERS: dict[str, tuple[int, tuple[str, ...]]] = {
    "qkv-gateup": (16, ("attn.Wqkv", "mlp.w12")),
    "out-down": (4, ("attn.out_proj", "mlp.w3")),
}
MAX_LORA_RANK = max(rank for rank, _ in ADAPTERS.values())


class LoraCase:
    """The base, its adapters (raw and converted) and the reference completions of each."""

    def __init__(self, models: ModelFactory) -> None:
        self.base = models.converted("tiny", "float32")
        self.raw: dict[str, Path] = {}
        self.converted: dict[str, Path] = {}
        for seed, (name, (rank, targets)) in enumerate(ADAPTERS.items()):
            self.raw[name], self.converted[name] = models.adapter(
                self.base, rank=rank, targets=targets, seed=seed
            )
        self.expected: dict[str | None, list[Completion]] = {
            name: reference_lora_completions(
                self.base, None if name is None else self.raw[name], PROMPTS, MAX_TOKENS
            )
            for name in (None, *ADAPTERS)
        }

    def served(self, tmp: Path, tp: int) -> list[LoraCompletion]:
        out = tmp / f"lora-tp{tp}.json"
        run_lora_golden(self.base, self.converted, out, tp=tp, max_lora_rank=MAX_LORA_RANK)
        return load(out)


@pytest.fixture(scope="module")
def case(models: ModelFactory) -> LoraCase:
    return LoraCase(models)


def test_the_adapters_change_the_reference(case: LoraCase) -> None:
    """Without this the comparison below could pass with adapters that change nothing."""
    for name in ADAPTERS:
        differs = [
            a.tokens != b.tokens
            for a, b in zip(case.expected[name], case.expected[None], strict=True)
        ]
        assert sum(differs) >= 2, name


@pytest.mark.parametrize("tp", [1])
def test_adapters_and_base_in_one_batch_match_the_reference(
    case: LoraCase, tmp_path: Path, tp: int
) -> None:
    served = case.served(tmp_path, tp)
    assert len(served) == len(PROMPTS) * (1 + len(ADAPTERS))
    problems = []
    for name in (None, *ADAPTERS):
        got = [c for c in served if c.adapter == name]
        for m in compare(case.expected[name], got, atol=ATOL):
            problems.append(f"{name or 'base'} prompt {m.prompt_index} @{m.position}: {m.detail}")
    assert not problems, "\n".join(problems)
