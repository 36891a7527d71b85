#!/usr/bin/env python3
"""Prefill/decode (P/D) disaggregation against colocated replicas, behind vLLM's router.

Two arms, each two vLLM replicas of one model with the same KV-cache memory each:
- `pd`: one prefill and one decode replica with the chart's P/D engine arguments and NIXL/UCX
  environment (ministream_testkit.pd, read from `helm template` of ci/pd-values.yaml; each
  replica its own side-channel port and UCX range, as two pods would have their own IPs),
  behind vllm-router with the chart's P/D command line (`--vllm-pd-disaggregation`, the pools'
  selectors swapped for the two local URLs);
- `colocated`: two replicas with the chart's engine arguments of the same release with
  `disaggregation.enabled=false`, behind vllm-router with that release's command line (the
  chart's default policy).
The router's health-check timeout is raised to `--router-health-timeout` for both arms (the
P/D test's reason: on two loaded cores a replica's /health outlasts the chart's 5 s and the
router ejects it).

KV-cache memory: on CPU every replica gets `VLLM_CPU_KVCACHE_SPACE=--cpu-kv-cache-gib` GiB;
on a GPU pass `--engine-arg=--kv-cache-memory-bytes=N` (the same N for every replica: no
memory profiling among processes that share one GPU; scripts/gpu/h200.sh pd).

The workload, per round: LONG long-prompt requests and CHAT short chat turns in a shuffled
order, leaving at a fixed RATE (request i at i/RATE s, whether or not earlier ones finished),
each size drawn uniformly from its range (`--long-in`, `--long-out`, `--chat-in`, `--chat-out`,
MIN:MAX tokens). Prompts are random common words cut to the drawn token count by the model's
own tokenizer (a replica's /tokenize and /detokenize); outputs are exact (`ignore_eos`). Both
arms of a round get the same sizes, order and times, each with its own text, so that no arm
is served from a prefix cache another filled. The defaults fit the CPU tiny model's 512
positions: long prompts 320-400 tokens in and 64-96 out stand in for the 4-8k in and 128-256
out of a real long-prompt mix (its prefill is what P/D moves off the decode replica);
on the H200 (h200.sh pd): `--long-in 4096:8192 --long-out 128:256 --chat-in 64:256
--chat-out 32:128`.

Per arm and round, for the long requests, the chat turns and all together: TTFT and ITL p50
and p99 (ministream_loadtest.streaming: streamed; ITL pooled over every gap), output tokens/s
over the block's wall time, failures; for `pd` the decode replica's NIXL transfers (vLLM's
`vllm:nixl_xfer_time_seconds_count` delta; one per request means the KV really moved) and
failed transfers; for both, the CPU seconds the other arm's processes used meanwhile.
Rounds alternate the arms' order. Summary per arm: the median over rounds; per metric the
paired ratio pd / colocated with a t-interval (interval_stats.paired_ratio_interval) over
rounds, or with `--instances N` (every engine and router started afresh N times, the arms'
start order rotated, interval_stats.creation_order) over the instances, each instance's
figure its median over its rounds: an interval over blocks of fresh engines, which is what
covers the instances' own offsets (interval_stats' module docstring). Verdict per request
class: "P/D pays" only where the ITL p99 ratio's whole interval lies below 1 and the TTFT p99
interval does not lie above 1; "P/D does not pay" where either interval lies above 1;
otherwise "not resolved".

Both arms' four engines are up at once, each arm's two replicas with their OpenMP threads
bound to cores `--omp-bind` (0 and 1: the P/D test's lesson, docs/fleet.md, two engines'
threads spinning on the same cores starve whichever must act), so a replica of each arm
shares each core. That is fair only if an idle arm takes no CPU from the measured one: an
idle vLLM engine core blocks on its input queue, but the router's health checks, the API
servers' loops and NIXL's threads run on; so every block records the other arm's CPU
seconds (`idle_arm_cpu_s`), and the table shows its largest share of one core. The
alternative, one arm up at a time, would restart engines between every pair of blocks and
make every round a new pair of instances.

    scripts/bench_pd.py --model .artifacts/models/ministream-tiny --rounds 4 \\
        --out .artifacts/bench-serve/pd-cpu.json

A machine without helm (the GPU host) reads the chart's arguments from a file rendered here:
`scripts/bench_pd.py --write-chart-pd scripts/gpu/chart-pd.json`, then `--chart-pd
scripts/gpu/chart-pd.json` there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
from bench_routing import WORDS, add_engine_arg, add_without_engine_arg, start_replicas
from interval_stats import creation_order, paired_ratio_interval

from ministream.atomic_file import write_atomic
from ministream_loadtest.streaming import (
    StreamTiming,
    itl_percentiles_s,
    timed_completion,
    ttft_percentiles_s,
)
from ministream_observability import catalog
from ministream_testkit.net import free_port
from ministream_testkit.pd import PD_VALUES, PDEngine, chart_pd_engine
from ministream_testkit.results import write_json
from ministream_testkit.router import RouterProcess, chart_router_args, chart_router_engine_args
from ministream_testkit.vllm_server import TINY_ENGINE_ARGS, VLLMServer, metrics_text, sum_samples

ARMS = ("pd", "colocated")
CLASSES = ("long", "chat", "all")
METRICS = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "output_tok_s")
# The decode replica's NIXL series a block records the change of: its transfers (each pulls
# one request's KV), their failures, and the bytes and seconds the transfers took, whose
# quotient is the rate the transport delivered.
NIXL_SERIES = {
    "nixl_transfers": catalog.NIXL_XFER_TIME.name + "_count",
    "nixl_failed": catalog.NIXL_FAILED.name,
    "nixl_bytes": catalog.NIXL_BYTES.name + "_sum",
    "nixl_xfer_s": catalog.NIXL_XFER_TIME.name + "_sum",
}
PAYS, DOES_NOT_PAY, NOT_RESOLVED = "P/D pays", "P/D does not pay", "not resolved"
COLOCATED_SET = "disaggregation.enabled=false"  # the same release without P/D
KV_CPU_ENV = "VLLM_CPU_KVCACHE_SPACE"


@dataclass(frozen=True)
class Mix:
    """One round's requests: how many of each class, their token ranges, the rate."""

    long: int
    chat: int
    long_in: tuple[int, int]
    long_out: tuple[int, int]
    chat_in: tuple[int, int]
    chat_out: tuple[int, int]
    rate: float


@dataclass(frozen=True)
class Request:
    kind: str  # "long" or "chat"
    at_s: float  # when it leaves, from the block's start
    prompt_tokens: int
    output_tokens: int


def plan(mix: Mix, seed: int) -> list[Request]:
    """The round's requests in the order they leave, one every 1/rate s, the classes shuffled
    together and each size drawn uniformly from its class's range."""
    rng = random.Random(seed)
    kinds = ["long"] * mix.long + ["chat"] * mix.chat
    rng.shuffle(kinds)
    sizes = {"long": (mix.long_in, mix.long_out), "chat": (mix.chat_in, mix.chat_out)}
    return [
        Request(kind, i / mix.rate, rng.randint(*sizes[kind][0]), rng.randint(*sizes[kind][1]))
        for i, kind in enumerate(kinds)
    ]


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def prompt_text(tokenizer: Tokenizer, tokens: int, rng: random.Random) -> str:
    """Random common words cut to `tokens` tokens (every word is at least one token); the cut
    text re-tokenizes to that count give or take a token at the cut."""
    ids = tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(tokens)))
    return tokenizer.decode(ids[:tokens])


@dataclass
class ServerTokenizer:
    """The model's own tokenizer, through a replica's /tokenize and /detokenize."""

    url: str
    model: str

    def encode(self, text: str) -> list[int]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        response = httpx.post(f"{self.url}/tokenize", json=body, timeout=60)
        response.raise_for_status()
        return [int(t) for t in response.json()["tokens"]]

    def decode(self, ids: list[int]) -> str:
        body = {"model": self.model, "tokens": ids}
        response = httpx.post(f"{self.url}/detokenize", json=body, timeout=60)
        response.raise_for_status()
        return str(response.json()["prompt"])


def class_metrics(
    requests: Sequence[Request], timings: Sequence[StreamTiming], wall_s: float
) -> dict[str, dict[str, Any]]:
    """Per class (long, chat, all): requests, failures, TTFT and ITL p50/p99 in seconds
    (None without a good request), output tokens/s of the good requests over `wall_s`."""
    out: dict[str, dict[str, Any]] = {}
    for cls in CLASSES:
        picked = [(r, t) for r, t in zip(requests, timings, strict=True) if cls in ("all", r.kind)]
        good = [t for _, t in picked if t.ok]
        ttft, itl = ttft_percentiles_s(good), itl_percentiles_s(good)
        out[cls] = {
            "requests": len(picked),
            "failed": len(picked) - len(good),
            "failures": sorted({str(t.failure) for _, t in picked if not t.ok}),
            "ttft_p50_s": ttft[0],
            "ttft_p99_s": ttft[1],
            "itl_p50_s": itl[0],
            "itl_p99_s": itl[1],
            "output_tok_s": sum(r.output_tokens for r, t in picked if t.ok) / wall_s,
        }
    return out


# ---- the arms


@dataclass
class Arm:
    """One arm's replicas (pd: prefill, then decode) and the router in front of them."""

    name: str
    replicas: list[VLLMServer]
    router_args: list[str]
    router: RouterProcess | None = None
    logs: Path = field(default_factory=Path)

    @property
    def decode(self) -> VLLMServer | None:
        return self.replicas[1] if self.name == "pd" else None

    def start_router(self, extra: dict[str, str]) -> None:
        urls = [r.url for r in self.replicas]
        self.router = RouterProcess(
            [] if self.name == "pd" else urls,
            self.logs / f"router-{self.name}.log",
            chart_args=self.router_args,
            pd=(urls[0], urls[1]) if self.name == "pd" else None,
            extra=extra,
        ).start()
        self.router.wait_workers_healthy(timeout=300.0)

    def pids(self) -> list[int]:
        procs = [r.process for r in self.replicas] + [self.router.process if self.router else None]
        return [p.pid for p in procs if p is not None]

    def stop(self) -> None:
        if self.router:
            self.router.stop()
        for r in self.replicas:
            r.stop()


def chart_pd(path: str | None, sets: Sequence[str] = ()) -> dict[str, Any]:
    """The chart's arguments for both arms: from `helm template` now (with `sets`, helm --set
    values of every render), or from a file written by `--write-chart-pd`."""
    if path:
        data: dict[str, Any] = json.loads(Path(path).read_text())
        return data
    pools = {pool: chart_pd_engine(PD_VALUES, pool, *sets) for pool in ("prefill", "decode")}
    return {
        "pd": {
            "router_args": chart_router_args(PD_VALUES, *sets),
            "pools": {p: {"args": list(e.args), "env": e.env} for p, e in pools.items()},
        },
        "colocated": {
            "router_args": chart_router_args(PD_VALUES, *sets, COLOCATED_SET),
            "engine_args": chart_router_engine_args(PD_VALUES, *sets, COLOCATED_SET),
        },
    }


def build_arms(
    chart: dict[str, Any], args: argparse.Namespace, logs: Path, instance: int
) -> dict[str, Arm]:
    """Both arms' replicas (not started): the tiny model's or the caller's engine arguments,
    the chart's additions (less `--without-engine-arg`), each replica's cores, the same
    KV-cache memory for every one."""
    base = list(args.engine_arg or TINY_ENGINE_ARGS)
    cores = [c for c in args.omp_bind.split(",") if c] or [None, None]
    common = {KV_CPU_ENV: str(args.cpu_kv_cache_gib)}

    def replica(arm: str, i: int, chart_args: Sequence[str], env: dict[str, str]) -> VLLMServer:
        bind = {"VLLM_CPU_OMP_THREADS_BIND": cores[i]} if cores[i] is not None else {}
        kept = [a for a in chart_args if a not in args.without_engine_arg]
        return VLLMServer(
            args.model,
            logs / f"{arm}-{i}-instance{instance}.log",
            args=[*base, *kept],
            env={**common, **env, **bind},
        )

    pools = chart["pd"]["pools"]
    ucx = args.ucx_port_base
    pd = [
        replica("pd", i, pools[pool]["args"], _local_env(pools[pool], ucx + 40 * i))
        for i, pool in enumerate(("prefill", "decode"))
    ]
    colocated = [replica("colocated", i, chart["colocated"]["engine_args"], {}) for i in (0, 1)]
    return {
        "pd": Arm("pd", pd, chart["pd"]["router_args"], logs=logs),
        "colocated": Arm("colocated", colocated, chart["colocated"]["router_args"], logs=logs),
    }


def _local_env(pool: dict[str, Any], ucx_low: int) -> dict[str, str]:
    engine = PDEngine(tuple(pool["args"]), dict(pool["env"]))
    return engine.local_env(free_port(), (ucx_low, ucx_low + 39))


def start_instance(arms: dict[str, Arm], order: Sequence[str], args: argparse.Namespace) -> None:
    """Start the arms' replicas in `order`, arm by arm, then a router in front of each."""
    extra = (
        {"health_check_timeout_secs": str(args.router_health_timeout)}
        if args.router_health_timeout
        else {}
    )
    for name in order:
        start_replicas(arms[name].replicas, args.start_first_alone)
    for name in order:
        arms[name].start_router(extra)


# ---- measuring


async def send_all(
    url: str, model: str, requests: Sequence[Request], prompts: Sequence[str]
) -> list[StreamTiming]:
    """Every request at its time (open loop), each answered in its own task."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:

        async def send(r: Request, prompt: str) -> StreamTiming:
            await asyncio.sleep(r.at_s)
            return await timed_completion(client, url, model, prompt, r.output_tokens)

        return list(
            await asyncio.gather(*(send(r, p) for r, p in zip(requests, prompts, strict=True)))
        )


def tree_cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds (user + system) the processes and all their children have used so far."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            top = psutil.Process(pid)
            procs = [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
    return total


def _nixl(arm: Arm) -> dict[str, float]:
    if arm.decode is None:
        return dict.fromkeys(NIXL_SERIES, 0.0)
    page = metrics_text(arm.decode.url)
    return {key: sum_samples(page, name) for key, name in NIXL_SERIES.items()}


def measure(
    arm: Arm, idle: Arm, requests: Sequence[Request], prompts: Sequence[str]
) -> dict[str, Any]:
    """One block of `requests` through `arm`'s router: per class metrics, the NIXL transfer
    counts, and the CPU the idle arm used meanwhile."""
    assert arm.router is not None
    nixl0, idle0 = _nixl(arm), tree_cpu_s(idle.pids())
    t0 = time.perf_counter()
    timings = asyncio.run(send_all(arm.router.url, arm.replicas[0].served_name, requests, prompts))
    wall = time.perf_counter() - t0
    nixl1, idle1 = _nixl(arm), tree_cpu_s(idle.pids())
    return {
        "wall_s": wall,
        "classes": class_metrics(requests, timings, wall),
        **{key: nixl1[key] - nixl0[key] for key in NIXL_SERIES},
        "idle_arm_cpu_s": idle1 - idle0,
    }


def measure_instance(
    arms: dict[str, Arm], args: argparse.Namespace, instance: int, rounds: list[dict[str, Any]]
) -> None:
    """An unrecorded warm-up block per arm (first requests pay for lazy set-up, and the pd
    pair's first transfer makes NIXL's handshake), then `--rounds` rounds appended to
    `rounds`, the arms' order alternating."""
    mix, first = _mix(args), arms["colocated"].replicas[0]
    tokenizer = ServerTokenizer(first.url, first.served_name)
    warm = Mix(2, 2, mix.chat_in, mix.chat_out, mix.chat_in, mix.chat_out, mix.rate)
    for name, other in (ARMS, ARMS[::-1]):
        reqs = plan(warm, seed=-1)
        rng = random.Random(f"warm-{instance}-{name}")
        prompts = [prompt_text(tokenizer, r.prompt_tokens, rng) for r in reqs]
        measure(arms[name], arms[other], reqs, prompts)
    for k in range(args.rounds):
        seed = instance * 1000 + k
        requests = plan(mix, seed)
        order = ARMS if (instance + k) % 2 == 0 else ARMS[::-1]
        row: dict[str, Any] = {"instance": instance, "round": k, "order": list(order)}
        for name in order:
            other = ARMS[1] if name == ARMS[0] else ARMS[0]
            rng = random.Random(f"{seed}-{name}")  # fresh text per arm
            prompts = [prompt_text(tokenizer, r.prompt_tokens, rng) for r in requests]
            row[name] = block = measure(arms[name], arms[other], requests, prompts)
            c = block["classes"]["all"]
            print(
                f"instance {instance} round {k} {name}: TTFT p99 {c['ttft_p99_s']} s, ITL p99 "
                f"{c['itl_p99_s']} s, {c['failed']} failed {c['failures']}, "
                f"{block['nixl_transfers']:.0f} transfers, idle arm {block['idle_arm_cpu_s']:.1f}"
                " CPU s",
                flush=True,
            )
        rounds.append(row)


# ---- the summary


def ratio(rounds: Sequence[dict[str, Any]], cls: str, metric: str) -> dict[str, Any] | None:
    """pd / colocated for one class and metric: over rounds, or (more than one instance) over
    instances, each instance's figure its median over its rounds; None with fewer than two
    pairs or a figure missing."""
    instances = sorted({r["instance"] for r in rounds})

    def figures(arm: str, rows: Sequence[dict[str, Any]]) -> list[Any]:
        return [r[arm]["classes"][cls][metric] for r in rows]

    if len(instances) > 1:
        groups = [[r for r in rounds if r["instance"] == i] for i in instances]
        per = {arm: [figures(arm, g) for g in groups] for arm in ARMS}
        if any(None in v for arm in ARMS for v in per[arm]):
            return None
        a, b = ([statistics.median(v) for v in per[arm]] for arm in ARMS)
        over = "instances"
    else:
        a, b = figures("pd", rounds), figures("colocated", rounds)
        over = "rounds"
    if len(a) < 2 or None in a + b or min(a + b) <= 0:
        return None
    return paired_ratio_interval(a, b).as_dict() | {"over": over}


def verdict(ratios: dict[str, dict[str, Any] | None]) -> str:
    """P/D pays only where the ITL p99 ratio's whole interval lies below 1 and the TTFT p99
    ratio's does not lie above 1; it does not pay where either lies above 1."""
    itl, ttft = ratios.get("itl_p99_s"), ratios.get("ttft_p99_s")
    if itl is None or ttft is None:
        return NOT_RESOLVED
    if itl["ci95"][1] < 1 and not ttft["ci95"][0] > 1:
        return PAYS
    if itl["ci95"][0] > 1 or ttft["ci95"][0] > 1:
        return DOES_NOT_PAY
    return NOT_RESOLVED


def summarize(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per arm and class the median over rounds; per class the ratios and the verdict."""
    arms: dict[str, Any] = {}
    for arm in ARMS:
        # Results written before the bytes and seconds were recorded lack them.
        arms[arm] = {
            key: sum(r[arm][key] for r in rounds)
            for key in NIXL_SERIES
            if all(key in r[arm] for r in rounds)
        }
        seconds = arms[arm].get("nixl_xfer_s")
        arms[arm]["nixl_gb_per_s"] = arms[arm]["nixl_bytes"] / seconds / 1e9 if seconds else None
        arms[arm]["idle_arm_cpu_share_max"] = max(
            (r[arm]["idle_arm_cpu_s"] / r[arm]["wall_s"] for r in rounds), default=None
        )
        for cls in CLASSES:
            rows = [r[arm]["classes"][cls] for r in rounds]
            arms[arm][cls] = {
                m: statistics.median(x[m] for x in rows)
                for m in METRICS
                if rows and all(x[m] is not None for x in rows)
            } | {"failed": sum(x["failed"] for x in rows)}
    ratios = {cls: {m: ratio(rounds, cls, m) for m in METRICS} for cls in CLASSES}
    return {
        "arms": arms,
        "pd_over_colocated": ratios,
        "verdicts": {cls: verdict(ratios[cls]) for cls in CLASSES},
    }


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "n/a"
    return f"{r['ratio']:.2f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]"


def _ms(figures: dict[str, Any], metric: str) -> str:
    return f"{figures[metric] * 1e3:.1f}" if metric in figures else "n/a"


def table(result: dict[str, Any]) -> str:
    """The medians per arm and class, the ratios with their intervals, the verdicts."""
    s, n = result["summary"], len(result["rounds"])
    lines = [
        "| arm | class | rounds | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
        "| output tok/s | failed | KV transfers |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cls in CLASSES:
        for arm in ARMS:
            c = s["arms"][arm][cls]
            tok_s = f"{c['output_tok_s']:.1f}" if "output_tok_s" in c else "n/a"
            xfer = f"{s['arms'][arm]['nixl_transfers']:.0f}" if cls == "all" else ""
            lines.append(
                f"| {arm} | {cls} | {n} | "
                + " | ".join(_ms(c, m) for m in METRICS[:4])
                + f" | {tok_s} | {c['failed']} | {xfer} |"
            )
        r = s["pd_over_colocated"][cls]
        lines.append(
            f"| pd / colocated | {cls} | {n} | "
            + " | ".join(_cell(r[m]) for m in METRICS)
            + " | | |"
        )
    lines.append("")
    for cls in CLASSES:
        r = s["pd_over_colocated"][cls]
        over = (
            f", intervals over {r['itl_p99_s']['n']} {r['itl_p99_s']['over']}"
            if r["itl_p99_s"]
            else ""
        )
        lines.append(
            f"- {cls}: {s['verdicts'][cls]} (pd / colocated ITL p99 {_cell(r['itl_p99_s'])}, "
            f"TTFT p99 {_cell(r['ttft_p99_s'])}{over})"
        )
    shares = [s["arms"][arm]["idle_arm_cpu_share_max"] for arm in ARMS]
    if None not in shares:
        lines.append(
            "- the idle arm's CPU while the other was measured, largest share of one core: "
            f"{max(shares):.3f}"
        )
    pd = s["arms"]["pd"]
    if pd.get("nixl_gb_per_s") is not None:
        lines.append(
            f"- KV moved by the decode replica: {pd['nixl_bytes'] / 1e9:.2f} GB in "
            f"{pd['nixl_xfer_s']:.2f} s of transfers, {pd['nixl_gb_per_s']:.2f} GB/s"
        )
    return "\n".join(lines)


# ---- the command


def token_range(text: str) -> tuple[int, int]:
    """`MIN:MAX` tokens (or one number for both)."""
    low, _, high = text.partition(":")
    pair = (int(low), int(high or low))
    if not 0 < pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"want MIN:MAX with 0 < MIN <= MAX, got {text!r}")
    return pair


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", help="model directory the replicas serve (required)")
    p.add_argument("--out", help="result JSON, logs beside it (required)")
    p.add_argument("--rounds", type=int, default=4, help="rounds per instance")
    p.add_argument("--instances", type=int, default=1, help="fresh engine sets, one after another")
    p.add_argument("--long", type=int, default=8, help="long-prompt requests per round")
    p.add_argument("--chat", type=int, default=24, help="short chat turns per round")
    p.add_argument("--long-in", type=token_range, default=(320, 400), metavar="MIN:MAX")
    p.add_argument("--long-out", type=token_range, default=(64, 96), metavar="MIN:MAX")
    p.add_argument("--chat-in", type=token_range, default=(24, 64), metavar="MIN:MAX")
    p.add_argument("--chat-out", type=token_range, default=(16, 32), metavar="MIN:MAX")
    p.add_argument("--rate", type=float, default=2.0, help="requests per second leaving")
    add_engine_arg(p)
    add_without_engine_arg(p)
    p.add_argument("--cpu-kv-cache-gib", type=int, default=1, help=f"{KV_CPU_ENV} per replica")
    p.add_argument(
        "--omp-bind",
        default="0,1",
        help="VLLM_CPU_OMP_THREADS_BIND of each arm's first and second replica ('' for none)",
    )
    p.add_argument("--ucx-port-base", type=int, default=18600, help="40 UCX ports per pd replica")
    p.add_argument(
        "--router-health-timeout",
        type=int,
        default=60,
        help="the routers' health-check timeout in s (0: the chart's)",
    )
    p.add_argument("--chart-pd", help="JSON of the chart's arguments (default: helm, now)")
    p.add_argument("--write-chart-pd", metavar="FILE", help="render them into FILE, then exit")
    p.add_argument(
        "--set",
        dest="chart_set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a helm --set value of the chart's renders (repeatable; escape commas as \\,)",
    )
    p.add_argument(
        "--start-first-alone",
        action="store_true",
        help="start each arm's first replica alone, then the other (it reads its compile cache)",
    )
    return p


def _mix(args: argparse.Namespace) -> Mix:
    return Mix(
        args.long, args.chat, args.long_in, args.long_out, args.chat_in, args.chat_out, args.rate
    )


def run(args: argparse.Namespace, chart: dict[str, Any], result: dict[str, Any]) -> None:
    """Every instance in turn: build and start both arms (their start order rotated), measure
    its rounds into result["rounds"], stop them."""
    logs = Path(result["logs"])
    order = creation_order(args.instances, ARMS)
    for instance in range(args.instances):
        arms = build_arms(chart, args, logs, instance)
        result.setdefault("engines", []).append(
            {a.name: [list(r.args) for r in a.replicas] for a in arms.values()}
        )
        try:
            start_instance(arms, [side for k, side in order if k == instance], args)
            measure_instance(arms, args, instance, result["rounds"])
        finally:
            for arm in arms.values():
                arm.stop()


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.write_chart_pd:
        chart = chart_pd(None, args.chart_set)
        write_atomic(Path(args.write_chart_pd), json.dumps(chart, indent=2) + "\n")
        return 0
    if not (args.model and args.out):
        p.error("--model and --out are required")
    if args.chart_pd and args.chart_set:
        p.error("--set renders the chart: render a file with it (--write-chart-pd), not both")
    if min(args.rounds, args.instances) < 1 or args.instances * args.rounds < 2:
        p.error("an interval needs two rounds (of one instance) or two instances")
    chart = chart_pd(args.chart_pd, args.chart_set)
    result: dict[str, Any] = {
        "workload": asdict(_mix(args)),
        "instances": args.instances,
        "kv_cache": {KV_CPU_ENV: args.cpu_kv_cache_gib, "engine_args": args.engine_arg},
        "omp_bind": args.omp_bind,
        "chart": chart,
        "rounds": [],
        "logs": tempfile.mkdtemp(prefix="bench-pd-"),
    }
    try:
        run(args, chart, result)
    finally:
        if result["rounds"]:
            result["summary"] = summarize(result["rounds"])
            write_json(Path(args.out), result)
    print(table(result))
    failed = sum(result["summary"]["arms"][a]["all"]["failed"] for a in ARMS)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
