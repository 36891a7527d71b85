"""scripts/bench_pd.py's pieces that need no engine: the workload, the per-class metrics of a
block, the pd / colocated ratios and the verdict, the table (the benchmark itself is
`make bench-pd`, not a test)."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ministream_loadtest.streaming import StreamTiming
from tests.support.scripts import GPU_SCRIPTS, ScriptImporter


@pytest.fixture
def bench(import_script: ScriptImporter) -> ModuleType:
    return import_script("bench_pd")


def _mix(bench: ModuleType, rate: float = 4.0) -> Any:
    return bench.Mix(3, 9, (300, 400), (60, 90), (20, 40), (10, 20), rate)


def test_a_round_mixes_both_classes_at_a_fixed_rate_with_sizes_in_range(
    bench: ModuleType,
) -> None:
    mix = _mix(bench)
    requests = bench.plan(mix, seed=7)
    assert [r.at_s for r in requests] == pytest.approx([i / 4.0 for i in range(12)])
    kinds = [r.kind for r in requests]
    assert kinds.count("long") == 3 and kinds.count("chat") == 9
    assert kinds != sorted(kinds, key=lambda k: k != "long")  # shuffled, not long-first
    for r in requests:
        ins, outs = (mix.long_in, mix.long_out) if r.kind == "long" else (mix.chat_in, mix.chat_out)
        assert ins[0] <= r.prompt_tokens <= ins[1] and outs[0] <= r.output_tokens <= outs[1]
    # The same seed, the same round (both arms of a round get it); another seed, another one.
    assert bench.plan(mix, seed=7) == requests
    assert bench.plan(mix, seed=8) != requests


class _Tokenizer:
    """Two tokens per word of more than two letters, one otherwise."""

    def encode(self, text: str) -> list[int]:
        return [
            hash(w) % 97 if i == 0 else 1 for w in text.split() for i in range(1 + (len(w) > 2))
        ]

    def decode(self, ids: list[int]) -> str:
        return "x " * len(ids)


def test_a_prompt_is_cut_to_its_token_count(bench: ModuleType) -> None:
    tokenizer = _Tokenizer()
    for tokens in (1, 17, 300):
        text = bench.prompt_text(tokenizer, tokens, random.Random(tokens))
        assert len(tokenizer.encode(text)) == tokens


def test_a_blocks_metrics_are_per_class_and_leave_failures_out(bench: ModuleType) -> None:
    long_, chat = bench.Request("long", 0.0, 300, 10), bench.Request("chat", 0.5, 20, 4)
    requests = [long_, chat, chat, long_]
    timings = [
        StreamTiming(ttft=2.0, e2e=3.0, itl=(0.5, 0.1)),
        StreamTiming(ttft=0.2, e2e=0.5, itl=(0.1, 0.1, 0.1)),
        StreamTiming(failure="503", itl=(9.0,)),
        StreamTiming(ttft=4.0, e2e=6.0, itl=(0.3,)),
    ]
    m = bench.class_metrics(requests, timings, wall_s=2.0)
    assert m["long"]["requests"] == 2 and m["long"]["failed"] == 0
    assert m["long"]["ttft_p50_s"] == pytest.approx(3.0)
    assert m["long"]["itl_p50_s"] == pytest.approx(0.3)  # pooled gaps 0.5, 0.1, 0.3
    assert m["long"]["itl_p99_s"] == pytest.approx(0.496)  # numpy's linear method
    assert m["long"]["output_tok_s"] == pytest.approx(20 / 2.0)
    assert m["chat"]["failed"] == 1 and m["chat"]["failures"] == ["503"]
    assert m["chat"]["ttft_p99_s"] == pytest.approx(0.2)  # the failure's TTFT of 0 is left out
    assert m["chat"]["itl_p99_s"] == pytest.approx(0.1)
    assert m["chat"]["output_tok_s"] == pytest.approx(4 / 2.0)
    assert m["all"]["requests"] == 4 and m["all"]["output_tok_s"] == pytest.approx(24 / 2.0)


def _interval(lo: float, hi: float) -> dict[str, Any]:
    return {"ratio": (lo * hi) ** 0.5, "ci95": [lo, hi]}


@pytest.mark.parametrize(
    ("itl", "ttft", "want"),
    [
        ((0.4, 0.8), (0.9, 1.2), "PAYS"),  # ITL resolved lower, TTFT not resolved higher
        ((0.4, 0.8), (0.7, 0.9), "PAYS"),
        ((0.4, 1.1), (0.7, 0.9), "NOT_RESOLVED"),  # ITL's interval reaches 1
        ((0.4, 0.8), (1.1, 1.5), "DOES_NOT_PAY"),  # TTFT resolved higher
        ((1.1, 1.3), (0.7, 0.9), "DOES_NOT_PAY"),  # ITL resolved higher
        ((0.9, 1.3), (1.05, 1.3), "DOES_NOT_PAY"),
    ],
)
def test_the_verdict_recommends_pd_only_where_the_intervals_favour_it(
    bench: ModuleType, itl: tuple[float, float], ttft: tuple[float, float], want: str
) -> None:
    ratios = {"itl_p99_s": _interval(*itl), "ttft_p99_s": _interval(*ttft)}
    assert bench.verdict(ratios) == getattr(bench, want)


def test_without_an_interval_the_verdict_is_not_resolved(bench: ModuleType) -> None:
    assert bench.verdict({"itl_p99_s": _interval(0.4, 0.8), "ttft_p99_s": None}) == (
        bench.NOT_RESOLVED
    )


def _block(bench: ModuleType, ttft: float, itl: float, transfers: int) -> dict[str, Any]:
    figures = {
        "requests": 4,
        "failed": 0,
        "failures": [],
        "ttft_p50_s": ttft / 2,
        "ttft_p99_s": ttft,
        "itl_p50_s": itl / 2,
        "itl_p99_s": itl,
        "output_tok_s": 50.0,
    }
    return {
        "wall_s": 10.0,
        "classes": {cls: dict(figures) for cls in bench.CLASSES},
        "nixl_transfers": transfers,
        "nixl_failed": 0,
        "nixl_bytes": transfers * 25e6,  # 25 MB of KV a transfer
        "nixl_xfer_s": transfers * 0.01,
        "idle_arm_cpu_s": 0.2,
    }


def _rounds(bench: ModuleType, instances: int, per_instance: int) -> list[dict[str, Any]]:
    out = []
    for i in range(instances):
        for k in range(per_instance):
            wobble = 1 + 0.01 * ((i + k) % 3)
            out.append(
                {
                    "instance": i,
                    "round": k,
                    "pd": _block(bench, 0.9 * wobble, 0.05 * wobble * (1 + 0.1 * i), 4),
                    "colocated": _block(bench, 1.0, 0.1, 0),
                }
            )
    return out


def test_ratios_pair_rounds_or_instances_and_the_table_shows_the_verdicts(
    bench: ModuleType,
) -> None:
    one = bench.summarize(_rounds(bench, 1, 3))
    itl = one["pd_over_colocated"]["long"]["itl_p99_s"]
    assert itl["over"] == "rounds" and itl["n"] == 3
    assert itl["ci95"][1] < 1 and one["verdicts"]["long"] == bench.PAYS
    assert one["arms"]["pd"]["nixl_transfers"] == 12
    assert one["arms"]["pd"]["nixl_gb_per_s"] == pytest.approx(2.5)
    assert one["arms"]["colocated"]["nixl_gb_per_s"] is None  # no transfer, no rate
    assert one["arms"]["pd"]["idle_arm_cpu_share_max"] == pytest.approx(0.02)
    # Two instances of three rounds: one pair per instance, each its medians over rounds.
    two = bench.summarize(_rounds(bench, 2, 3))["pd_over_colocated"]["chat"]["itl_p99_s"]
    assert two["over"] == "instances" and two["n"] == 2
    assert two["pair_ratios"][1] / two["pair_ratios"][0] == pytest.approx(1.1)
    result = {"summary": one, "rounds": _rounds(bench, 1, 3)}
    text = bench.table(result)
    # Medians over the rounds (0.9 s and 50 ms times 1.00, 1.01, 1.02), in milliseconds.
    assert "| pd | long | 3 | 454.5 | 909.0 | 25.2 | 50.5 | 50.0 | 0 |  |" in text
    assert "| colocated | all | 3 | 500.0 | 1000.0 | 50.0 | 100.0 | 50.0 | 0 | 0 |" in text
    assert "| pd | all | 3 | 454.5 | 909.0 | 25.2 | 50.5 | 50.0 | 0 | 12 |" in text
    assert "| pd / colocated | chat | 3 | 0.91 [0.89, 0.93] | " in text
    assert f"- long: {bench.PAYS} (pd / colocated ITL p99 0.50 [0.49, 0.52], " in text
    assert "intervals over 3 rounds)" in text
    assert "- KV moved by the decode replica: 0.30 GB in 0.12 s of transfers, 2.50 GB/s" in text


def test_a_result_without_the_transfer_bytes_still_summarizes(bench: ModuleType) -> None:
    rounds = _rounds(bench, 1, 3)
    for row in rounds:
        for arm in bench.ARMS:
            del row[arm]["nixl_bytes"], row[arm]["nixl_xfer_s"]
    summary = bench.summarize(rounds)
    assert summary["arms"]["pd"]["nixl_transfers"] == 12
    assert summary["arms"]["pd"]["nixl_gb_per_s"] is None
    assert "GB/s" not in bench.table({"summary": summary, "rounds": rounds})


def test_a_single_pair_gives_no_interval(bench: ModuleType) -> None:
    summary = bench.summarize(_rounds(bench, 1, 1))
    assert summary["pd_over_colocated"]["all"]["itl_p99_s"] is None
    assert summary["verdicts"]["all"] == bench.NOT_RESOLVED
    assert "n/a" in bench.table({"summary": summary, "rounds": _rounds(bench, 1, 1)})


def test_token_ranges(bench: ModuleType) -> None:
    assert bench.token_range("4096:8192") == (4096, 8192)
    assert bench.token_range("128") == (128, 128)
    with pytest.raises(argparse.ArgumentTypeError):
        bench.token_range("8:4")


def test_the_arms_differ_by_the_connector_and_share_memory_and_cores(
    bench: ModuleType, tmp_path: Path
) -> None:
    """Built from the committed chart-pd.json (checked against `helm template` in
    test_gpu_bench_scripts.py): the pd replicas are the colocated ones plus the chart's
    connector, each with its own side channel and UCX ports; every replica has the same KV
    cache; each arm's replica i runs on core i."""
    chart = bench.chart_pd(str(GPU_SCRIPTS / "chart-pd.json"))
    args = bench._parser().parse_args(["--model", "m", "--out", "o", "--cpu-kv-cache-gib", "3"])
    arms = bench.build_arms(chart, args, tmp_path, instance=0)
    pd, colocated = arms["pd"].replicas, arms["colocated"].replicas
    for p, c in zip(pd, colocated, strict=True):
        i = list(p.args).index("--kv-transfer-config")
        assert [*p.args[:i], *p.args[i + 2 :]] == list(c.args)
        assert "--kv-transfer-config" not in c.args
    assert {r.env[bench.KV_CPU_ENV] for r in pd + colocated} == {"3"}
    for arm in (pd, colocated):
        assert [r.env["VLLM_CPU_OMP_THREADS_BIND"] for r in arm] == ["0", "1"]
    for name in ("VLLM_NIXL_SIDE_CHANNEL_PORT", "UCX_TCP_PORT_RANGE"):
        assert len({r.env[name] for r in pd}) == 2, name
    assert arms["pd"].decode is pd[1] and arms["colocated"].decode is None
