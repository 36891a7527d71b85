"""Forward-pass parity: the MiniStream plugin vs vLLM's built-in Llama, at fixed shapes.

Three engines live in ONE process on one device: `plugin` (the converted directory),
`llama_a` and `llama_b` (two Llama twins of it, `ministream_reference.golden.as_llama`:
same weight files, config naming `LlamaForCausalLM`). Each runs vLLM's normal path
(torch.compile + CUDA graphs on a GPU) and times the model's forward pass inside the
worker (forward_timer.py: CUDA events around the runner's forward call). Per round, every
engine runs every shape once, the engine order rotating through all six permutations, so
drift and position effects hit all three alike.

Shapes: `decode:B` = B prompts of (context - steps/2) tokens decoding `--decode-steps`
tokens (mean context = `--context`); its figure is the median forward time of the pure
decode steps. `prefill:PxL` = P prompts of L tokens, max_tokens=1; its figure is the
median forward time of `--prefill-reps` back-to-back prefills (one short burst after the
host-side set-up of a rep lands on a GPU that has idled: single prefills of one shape took
10.5-38.7 ms from round to round in every engine). Prefix caching is off, so
every prefill computes.

Reported per shape: parity = t(llama_a) / t(plugin) per round (> 1: the plugin is faster)
and the A/A control = t(llama_a) / t(llama_b) per round, each as the median over rounds
with a 95 % bootstrap interval; the same two ratios from each round's end-to-end
`LLM.generate` wall time as a second view; whether plugin and llama_a produced identical
tokens.

`--instances K` (K > 1) starts K engines of each of the three kinds (`plugin.0` ...
`llama_b.K-1`), every one timed in every round in a shuffled order, and adds the
replicated figures: each engine's median over rounds, each kind's mean over its K
engines, parity = llama_a / plugin and A/A = llama_a / llama_b of those means, with the
lowest and highest ratio of one engine pair (interval_stats.instance_pair_range: the
engines start kind by kind, not in blocks, and a bootstrap over K = 3 engines would
undercover). An offset that belongs to one engine start then shows in the range instead of
hiding inside an interval over rounds. The per-round figures above stay, for the first
engine of each kind.

    python scripts/gpu/forward_parity.py --model DIR --out F.json \
        --llm-args '{"dtype": "bfloat16", "gpu_memory_utilization": 0.25}'     # GPU
    python scripts/gpu/forward_parity.py --model DIR --out F.json --smoke      # CPU, CI
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ministream_testkit.provenance import stamp
from ministream_testkit.results import write_json

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # scripts/: the one statistics module

from engine_versions import engine_versions  # noqa: E402
from interval_stats import (  # noqa: E402
    fmt_pair_range,
    fmt_ratio,
    instance_pair_range,
    ratio_summary,
)

PROCESS_START = time.time()
KINDS = ("plugin", "llama_a", "llama_b")
GPU_SHAPES = "decode:1,decode:16,decode:64,decode:256,prefill:1x2048,prefill:8x512"
SMOKE_SHAPES = "decode:1,decode:4,prefill:1x64"
RATIO_DEFINITION = (
    "t(llama_a)/t(plugin) and t(llama_a)/t(llama_b) per round; "
    "> 1 means the first-named engine is slower; replicated_*: the same ratios of "
    "each kind's mean over its engines' medians, with the range of the engine pairs' "
    "ratios (interval_stats.instance_pair_range)"
)


def parse_shape(spec: str) -> tuple[str, int, int]:
    """`decode:B` -> ("decode", B, 0); `prefill:PxL` -> ("prefill", P, L)."""
    kind, _, size = spec.partition(":")
    if kind == "decode" and size.isdigit():
        return kind, int(size), 0
    if kind == "prefill" and "x" in size:
        p, _, length = size.partition("x")
        if p.isdigit() and length.isdigit():
            return kind, int(p), int(length)
    raise ValueError(f"bad shape {spec!r}: use decode:B or prefill:PxL")


def shape_figure(kind: str, calls: list[tuple[int, str, float]]) -> tuple[float, int]:
    """The shape's forward time (ms) from one rep's timed calls, and how many went in.

    decode: the pure decode steps are the most frequent batch size; their median.
    prefill: max_tokens=1, so every call is prefill; their sum (one call unless chunked).
    """
    if not calls:
        raise RuntimeError("no forward call was timed: the timer is not on the runner's path")
    if kind == "prefill":
        return sum(ms for _, _, ms in calls), len(calls)
    mode, _ = Counter(n for n, _, _ in calls).most_common(1)[0]
    steps = [ms for n, _, ms in calls if n == mode]
    return statistics.median(steps), len(steps)


def engine_names(instances: int) -> dict[str, list[str]]:
    """Engine names per kind: the kind itself for one instance (the reports of earlier runs
    keep their keys), `kind.i` for several."""
    if instances < 1:
        raise ValueError("--instances must be at least 1")
    if instances == 1:
        return {kind: [kind] for kind in KINDS}
    return {kind: [f"{kind}.{i}" for i in range(instances)] for kind in KINDS}


def round_order(names: list[str], round_index: int) -> list[str]:
    """The engines' order in a round: for three engines every permutation in turn; for more,
    a shuffle seeded by the round (too many permutations to cycle through)."""
    if len(names) == 3:
        perms = list(itertools.permutations(names))
        return list(perms[round_index % len(perms)])
    order = list(names)
    random.Random(round_index).shuffle(order)
    return order


def _prompts(rng: random.Random, n: int, length: int, vocab: int) -> list[dict[str, Any]]:
    return [
        {"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(length)]} for _ in range(n)
    ]


def add_round_options(
    parser: argparse.ArgumentParser, *, rounds: int, min_rounds: int, budget_s: float
) -> None:
    """The options `another_round` reads, with a script's defaults."""
    parser.add_argument("--rounds", type=int, default=rounds, help="at most this many rounds")
    parser.add_argument("--min-rounds", type=int, default=min_rounds)
    parser.add_argument(
        "--budget-s", type=float, default=budget_s, help="no new round after this many seconds"
    )
    parser.add_argument(
        "--stop-after-s",
        type=float,
        default=1e9,
        help="no new round this many seconds after the process started (fits a time limit)",
    )


def another_round(rounds: int, args: argparse.Namespace, t_start: float, started: float) -> bool:
    """Whether to run one more round: below `--rounds`, and below `--min-rounds` or within
    both the budget (`t_start`, perf_counter) and `--stop-after-s` (`started`, epoch s)."""
    return rounds < args.rounds and (
        rounds < args.min_rounds
        or (
            time.perf_counter() - t_start < args.budget_s
            and time.time() - started < args.stop_after_s
        )
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default=GPU_SHAPES)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--decode-steps", type=int, default=64)
    parser.add_argument(
        "--prefill-reps",
        type=int,
        default=5,
        help="back-to-back prefills per engine, shape and round; their median is the figure",
    )
    add_round_options(parser, rounds=48, min_rounds=6, budget_s=240)
    parser.add_argument(
        "--instances",
        type=int,
        default=1,
        help="engines of each kind (plugin, llama_a, llama_b); > 1 adds replicated figures",
    )
    parser.add_argument(
        "--llm-args",
        default='{"dtype": "bfloat16", "max_model_len": 2560, "gpu_memory_utilization": 0.25}',
        help="JSON kwargs for vllm.LLM, identical for all three engines",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CPU/CI: tiny shapes, 2 rounds, float32, eager (checks the code path, not speed)",
    )
    return parser


def _parse(argv: list[str] | None) -> argparse.Namespace:
    args = _parser().parse_args(argv)
    if args.smoke:
        args.shapes, args.context, args.decode_steps = SMOKE_SHAPES, 64, 8
        args.rounds, args.min_rounds, args.prefill_reps = 2, 2, 2
        args.llm_args = '{"dtype": "float32", "max_model_len": 256, "enforce_eager": true}'
    return args


@dataclass
class Figures:
    """What the rounds measured, per shape: each engine's forward ms and generate wall s per
    round, the timed calls per rep of the first plugin engine, and whether the first
    engines' tokens agreed (plugin vs llama_a, and the control llama_b vs llama_a)."""

    shapes: list[str]
    engines: list[str]
    fwd: dict[str, dict[str, list[float]]] = field(init=False)
    wall: dict[str, dict[str, list[float]]] = field(init=False)
    steps_used: dict[str, list[int]] = field(init=False)
    same_tokens: dict[str, list[bool]] = field(init=False)
    same_tokens_aa: dict[str, list[bool]] = field(init=False)

    def __post_init__(self) -> None:
        self.fwd = {s: {e: [] for e in self.engines} for s in self.shapes}
        self.wall = {s: {e: [] for e in self.engines} for s in self.shapes}
        self.steps_used = {s: [] for s in self.shapes}
        self.same_tokens = {s: [] for s in self.shapes}
        self.same_tokens_aa = {s: [] for s in self.shapes}

    def shape_result(
        self, spec: str, kinds: dict[str, list[str]], resamples: int
    ) -> dict[str, Any]:
        """One shape's entry of the report."""
        f, w = self.fwd[spec], self.wall[spec]
        a, b, p = kinds["llama_a"][0], kinds["llama_b"][0], kinds["plugin"][0]
        same, same_aa = self.same_tokens[spec], self.same_tokens_aa[spec]
        result = {
            "forward_ms": f,
            "wall_s": w,
            "median_forward_ms": {e: statistics.median(f[e]) for e in self.engines},
            "timed_calls_per_rep": statistics.median(self.steps_used[spec]),
            "parity_forward": ratio_summary(f[a], f[p], resamples),
            "aa_forward": ratio_summary(f[a], f[b], resamples),
            "parity_e2e": ratio_summary(w[a], w[p], resamples),
            "aa_e2e": ratio_summary(w[a], w[b], resamples),
            "identical_tokens_plugin_vs_llama": f"{sum(same)}/{len(same)}",
            "identical_tokens_llama_vs_llama": f"{sum(same_aa)}/{len(same_aa)}",
        }
        if len(kinds["plugin"]) > 1:

            def replicated(times: dict[str, list[float]], num: str, den: str) -> Any:
                return instance_pair_range(
                    [times[e] for e in kinds[num]], [times[e] for e in kinds[den]]
                )

            result |= {
                "replicated_parity_forward": replicated(f, "llama_a", "plugin"),
                "replicated_aa_forward": replicated(f, "llama_a", "llama_b"),
                "replicated_parity_e2e": replicated(w, "llama_a", "plugin"),
                "replicated_aa_e2e": replicated(w, "llama_a", "llama_b"),
            }
        return result


@dataclass
class Engines:
    """The engines by name, and one timed rep of a shape on one of them."""

    args: argparse.Namespace
    llms: dict[str, Any]
    vocab: int
    sampling: Any  # vllm.SamplingParams, imported once the plugin is registered

    def rep(
        self, name: str, kind: str, n: int, length: int, seed: int
    ) -> tuple[float, int, float, list[list[int]]]:
        """(forward ms, timed calls used, generate wall s, tokens) of one rep."""
        rng = random.Random(seed)
        if kind == "decode":
            steps = self.args.decode_steps
            prompts = _prompts(rng, n, self.args.context - steps // 2, self.vocab)
            params = self.sampling(temperature=0.0, max_tokens=steps, ignore_eos=True)
        else:
            prompts = _prompts(rng, n, length, self.vocab)
            params = self.sampling(temperature=0.0, max_tokens=1, ignore_eos=True)
        llm = self.llms[name]
        llm.collective_rpc("forward_timer_fetch")  # drop anything recorded before
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        calls = llm.collective_rpc("forward_timer_fetch")[0]
        ms, used = shape_figure(kind, calls)
        return ms, used, wall, [list(o.outputs[0].token_ids) for o in outs]

    def round(
        self,
        figures: Figures,
        shapes: list[tuple[str, int, int]],
        kinds: dict[str, list[str]],
        index: int,
    ) -> None:
        """Every engine runs every shape once (prefill: `--prefill-reps` times), in the
        round's order; the figures go to `figures`."""
        first = {kind: names[0] for kind, names in kinds.items()}
        order = round_order(figures.engines, index)
        for spec, (kind, n, length) in zip(figures.shapes, shapes, strict=True):
            tokens: dict[str, list[list[int]]] = {}
            for name in order:
                reps = [
                    self.rep(name, kind, n, length, seed=index)
                    for _ in range(self.args.prefill_reps if kind == "prefill" else 1)
                ]
                figures.fwd[spec][name].append(statistics.median(r[0] for r in reps))
                figures.wall[spec][name].append(statistics.median(r[2] for r in reps))
                tokens[name] = reps[0][3]
                if name == first["plugin"]:
                    figures.steps_used[spec].append(reps[0][1])
            figures.same_tokens[spec].append(tokens[first["plugin"]] == tokens[first["llama_a"]])
            # The control for the line above: on the H200 plugin and llama_a
            # differed in 1-2 of 6 reps at batch >= 16; do two identical engines too?
            figures.same_tokens_aa[spec].append(
                tokens[first["llama_b"]] == tokens[first["llama_a"]]
            )


def start_engines(
    args: argparse.Namespace, names: list[str], llm_args: dict[str, Any]
) -> tuple[Engines, dict[str, float], dict[str, Any]]:
    """Every engine, one after another (the Llama twins written first): the engines, each
    one's start in seconds and what its forward timer wraps."""
    import ministream

    ministream.register()
    from vllm import LLM, SamplingParams

    from ministream_reference.golden import as_llama

    tmp = Path(tempfile.mkdtemp(prefix="parity-"))
    dirs = {
        "plugin": args.model,
        "llama_a": str(as_llama(args.model, tmp / "llama_a")),
        "llama_b": str(as_llama(args.model, tmp / "llama_b")),
    }
    llms: dict[str, Any] = {}
    init_s: dict[str, float] = {}
    wrapped: dict[str, Any] = {}
    for name in names:
        t0 = time.perf_counter()
        llms[name] = LLM(model=dirs[name.split(".")[0]], **llm_args)
        init_s[name] = time.perf_counter() - t0
        wrapped[name] = llms[name].collective_rpc("forward_timer_install")[0]
        print(f"{name}: engine up in {init_s[name]:.1f} s, timing {wrapped[name]}", flush=True)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    return Engines(args, llms, vocab, SamplingParams), init_s, wrapped


def print_results(
    results: dict[str, Any], first: dict[str, str], args: argparse.Namespace, rounds: int
) -> None:
    """The per-round ratios of every shape, and the replicated ones with several engines."""
    print(f"\n{rounds} rounds. Ratio = t(llama_a) / t(x): median [95% CI]")
    print(
        f"{'shape':<16} {'plugin ms':>10} {'llama ms':>10}  {'parity fwd':<24} {'A/A fwd':<24} "
        f"{'parity e2e':<24} {'A/A e2e':<24} same tokens"
    )
    for spec, r in results.items():
        m = r["median_forward_ms"]
        print(
            f"{spec:<16} {m[first['plugin']]:>10.3f} {m[first['llama_a']]:>10.3f}  "
            f"{fmt_ratio(r['parity_forward']):<24} {fmt_ratio(r['aa_forward']):<24} "
            f"{fmt_ratio(r['parity_e2e']):<24} {fmt_ratio(r['aa_e2e']):<24} "
            f"{r['identical_tokens_plugin_vs_llama']} (A/A {r['identical_tokens_llama_vs_llama']})"
        )
    if args.instances > 1:
        print(
            f"\nReplicated: {args.instances} engines of each kind, mean of their medians; "
            "(lowest-highest ratio of one engine pair)"
        )
        print(f"{'shape':<16} {'parity fwd':<24} {'A/A fwd':<24} {'parity e2e':<24} A/A e2e")
        for spec, r in results.items():
            print(
                f"{spec:<16} "
                + " ".join(
                    f"{fmt_pair_range(r['replicated_' + k]):<24}"
                    for k in ("parity_forward", "aa_forward", "parity_e2e", "aa_e2e")
                )
            )
    print(f"JSON: {args.out}")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    kinds = engine_names(args.instances)
    all_engines = [name for names in kinds.values() for name in names]
    llm_args = json.loads(args.llm_args) | {
        "seed": 0,
        "enable_prefix_caching": False,
        "worker_extension_cls": "forward_timer.ForwardTimer",
    }
    # Every engine-core process must import forward_timer.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p
    )
    engines, init_s, wrapped = start_engines(args, all_engines, llm_args)
    figures = Figures(args.shapes.split(","), all_engines)
    for name in all_engines:  # warm-up: one untimed rep of every shape
        for kind, n, length in shapes:
            engines.rep(name, kind, n, length, seed=-1)
    # Stamped once: the provenance block is the same for every round's copy.
    report = stamp(
        {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
            "versions": engine_versions(),
            "settings": {
                "shapes": figures.shapes,
                "context": args.context,
                "decode_steps": args.decode_steps,
                "prefill_reps": args.prefill_reps,
                "rounds": 0,
                "instances": args.instances,
                "engines": all_engines,
                "llm_args": llm_args,
            },
            "engine_init_s": init_s,
            "timer": wrapped,
            "ratio_definition": RATIO_DEFINITION,
        }
    )

    def write_report(rounds: int, resamples: int = 4000) -> dict[str, Any]:
        """Summarise and write the JSON (after every round: a killed run keeps its rounds)."""
        results = {s: figures.shape_result(s, kinds, resamples) for s in figures.shapes}
        report["settings"]["rounds"] = rounds
        write_json(Path(args.out), report | {"shapes": results})
        return results

    t_start = time.perf_counter()
    rounds = 0
    while another_round(rounds, args, t_start, PROCESS_START):
        engines.round(figures, shapes, kinds, rounds)
        rounds += 1
        print(
            f"round {rounds}: "
            + "  ".join(
                f"{s} " + "/".join(f"{figures.fwd[s][e][-1]:.3f}" for e in all_engines)
                for s in figures.shapes
            ),
            flush=True,
        )
        write_report(rounds, resamples=200)  # a cheap interim copy; the final one below
    first = {kind: names[0] for kind, names in kinds.items()}
    print_results(write_report(rounds), first, args, rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
