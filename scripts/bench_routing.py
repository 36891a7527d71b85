#!/usr/bin/env python3
"""Routing by cache vs round robin: vLLM's router in front of N real vLLM replicas.

One set of replicas (the tiny model on CPU here; `--model`/`--engine-arg` for another) and one
vllm-router per policy in front of all of them, each with the chart's command line
(ministream_testkit.router: discovery swapped for `--worker-urls`). Rounds alternate the
policies' order; within a round every policy gets the same workload shape with its own text,
so no policy is served from the caches another one filled.

The workload: SYSTEMS distinct system prompts, USERS_PER_SYSTEM users on each, every user a
chat of TURNS turns that resends its history (the system prompt, every earlier question and
answer) plus a new question. Requests leave at a fixed RATE in a shuffled turn-major order;
a user's turn waits for their previous one. Per policy and round: each replica's prefix-cache
hit rate from vLLM's `vllm:prefix_cache_hits`/`vllm:prefix_cache_queries` deltas (and all
replicas together), TTFT p50/p99 (streamed, to the first token's text:
ministream_loadtest.streaming), output tokens/s, failures, and the router's
`vllm_router_prefix_routing_decisions_total` by outcome. Summary: per policy the median over
rounds; each policy / round_robin as a paired ratio over rounds with a t-interval
(interval_stats.paired_ratio_interval).

    scripts/bench_routing.py --model .artifacts/models/ministream-tiny --rounds 4 \
        --out docs/results/serve/routing-cpu.json

A machine without helm (the GPU host) reads the chart's router arguments from a file rendered
here: `scripts/bench_routing.py --write-chart-router scripts/gpu/chart-router.json`, then
`--chart-router scripts/gpu/chart-router.json` there (scripts/gpu/h200.sh routing).
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from interval_stats import paired_ratio_interval
from prometheus_client.parser import text_string_to_metric_families

from ministream_loadtest.streaming import StreamTiming, timed_completion, ttft_percentiles_s
from ministream_testkit.net import free_port
from ministream_testkit.results import write_json
from ministream_testkit.router import RouterProcess, chart_router_args, chart_router_engine_args
from ministream_testkit.vllm_server import TINY_ENGINE_ARGS, VLLMServer, metrics_text, sum_samples

POLICIES = ("round_robin", "cache_aware")  # the default set; --policies adds kv_aware
KNOWN_POLICIES = ("round_robin", "cache_aware", "kv_aware")
METRICS = ("hit_rate", "ttft_p50_s", "ttft_p99_s", "output_tok_s")
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
DECISIONS = "vllm_router_prefix_routing_decisions_total"


@dataclass(frozen=True)
class Workload:
    systems: int
    users_per_system: int
    turns: int
    system_words: int
    question_words: int
    output_tokens: int
    rate: float


# Short common words: about two tokens each even for the tiny model's 512-token vocabulary, so
# a chat's last turn stays inside its 512-position context at the defaults.
WORDS = [
    "the",
    "a",
    "of",
    "to",
    "in",
    "and",
    "is",
    "it",
    "on",
    "for",
    "cat",
    "dog",
    "sky",
    "sea",
    "red",
    "blue",
    "old",
    "new",
    "run",
    "sit",
    "big",
    "low",
    "day",
    "way",
    "man",
    "car",
    "sun",
    "map",
    "cup",
    "box",
    "key",
    "pen",
    "top",
]


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def chats(w: Workload, seed: int) -> list[list[str]]:
    """chats[u][t]: user u's prompt at turn t (the history resent, then a new question)."""
    rng = random.Random(seed)
    systems = [f"System {s}: " + _words(rng, w.system_words) for s in range(w.systems)]
    out = []
    for u in range(w.systems * w.users_per_system):
        history = systems[u % w.systems]
        turns = []
        for _ in range(w.turns):
            history += "\nUser: " + _words(rng, w.question_words) + "\nAssistant:"
            turns.append(history)
            history += " " + _words(rng, w.output_tokens)  # a stand-in answer, resent
        out.append(turns)
    return out


def order(w: Workload, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    users = w.systems * w.users_per_system
    out: list[tuple[int, int]] = []
    for t in range(w.turns):
        batch = [(u, t) for u in range(users)]
        rng.shuffle(batch)
        out += batch
    return out


async def run_block(
    router: RouterProcess, model: str, w: Workload, seed: int
) -> list[StreamTiming]:
    prompts, plan = chats(w, seed), order(w, seed)
    done = {(u, t): asyncio.Event() for u, t in plan}
    results: list[StreamTiming] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:

        async def send(i: int, u: int, t: int) -> None:
            await asyncio.sleep(i / w.rate)
            if t > 0:
                await done[(u, t - 1)].wait()
            results.append(
                await timed_completion(client, router.url, model, prompts[u][t], w.output_tokens)
            )
            done[(u, t)].set()

        await asyncio.gather(*(send(i, u, t) for i, (u, t) in enumerate(plan)))
    return results


def _counters(replicas: list[VLLMServer]) -> list[tuple[float, float]]:
    return [
        (sum_samples(text, HITS), sum_samples(text, QUERIES))
        for text in (metrics_text(r.url) for r in replicas)
    ]


def decisions(metrics_text: str) -> dict[str, float]:
    """The router's prefix-routing decisions by outcome (summed over other labels)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == DECISIONS and "outcome" in sample.labels:
                outcome = sample.labels["outcome"]
                out[outcome] = out.get(outcome, 0.0) + sample.value
    return out


def _decisions(router: RouterProcess) -> dict[str, float]:
    return decisions(httpx.get(router.metrics_url, timeout=10).text)


def measure(
    router: RouterProcess, replicas: list[VLLMServer], w: Workload, seed: int
) -> dict[str, Any]:
    before, decisions_before = _counters(replicas), _decisions(router)
    t0 = time.perf_counter()
    results = asyncio.run(run_block(router, replicas[0].served_name, w, seed))
    wall = time.perf_counter() - t0
    after, decisions_after = _counters(replicas), _decisions(router)
    per_replica = []
    for (h0, q0), (h1, q1) in zip(before, after, strict=True):
        per_replica.append({"hits": h1 - h0, "queries": q1 - q0})
    hits = sum(r["hits"] for r in per_replica)
    queries = sum(r["queries"] for r in per_replica)
    ok = [r for r in results if r.ok]
    ttft_p50, ttft_p99 = ttft_percentiles_s(results)
    return {
        "seed": seed,
        "requests": len(results),
        "failed": len(results) - len(ok),
        "failures": sorted({str(r.failure) for r in results if not r.ok}),
        "wall_s": wall,
        "ttft_p50_s": ttft_p50,
        "ttft_p99_s": ttft_p99,
        "output_tok_s": len(ok) * w.output_tokens / wall,
        "hit_rate": hits / queries if queries else None,
        "replicas": [
            r | {"hit_rate": r["hits"] / r["queries"] if r["queries"] else None}
            for r in per_replica
        ],
        "router_decisions": {
            k: v - decisions_before.get(k, 0.0) for k, v in decisions_after.items()
        },
    }


def summarize(rounds: list[dict[str, Any]], policies: Sequence[str] = POLICIES) -> dict[str, Any]:
    """Per policy the median over rounds; per policy other than round_robin, its paired ratio
    to round_robin (`<policy>_over_round_robin`)."""
    out: dict[str, Any] = {"policies": {}}
    for p in policies:
        rows = [r[p] for r in rounds]
        out["policies"][p] = {
            m: statistics.median(r[m] for r in rows)
            for m in METRICS
            if all(r[m] is not None for r in rows)
        } | {"failed": sum(r["failed"] for r in rows)}
    for p in policies:
        if p == "round_robin":
            continue
        ratios = out[f"{p}_over_round_robin"] = {}
        if len(rounds) < 2:
            continue
        for m in METRICS:
            a = [r[p][m] for r in rounds]
            b = [r["round_robin"][m] for r in rounds]
            if all(x and x > 0 for x in a + b):
                ratios[m] = paired_ratio_interval(a, b).as_dict()
    return out


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        "| policy | rounds | hit rate | TTFT p50 ms | TTFT p99 ms | output tok/s | failed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    n = len(result["rounds"])
    policies = list(s["policies"])
    for p in policies:
        c = s["policies"][p]
        lines.append(
            f"| {p} | {n} | {c.get('hit_rate', 0):.3f} | {c.get('ttft_p50_s', 0) * 1e3:.1f} | "
            f"{c.get('ttft_p99_s', 0) * 1e3:.1f} | {c.get('output_tok_s', 0):.1f} | {c['failed']} |"
        )

    def cell(r: dict[str, Any], m: str) -> str:
        if m not in r:
            return "n/a"
        return f"{r[m]['ratio']:.2f} [{r[m]['ci95'][0]:.2f}, {r[m]['ci95'][1]:.2f}]"

    for p in policies:
        if p != "round_robin":
            r = s[f"{p}_over_round_robin"]
            lines.append(
                f"| {p} / round_robin | {n} | " + " | ".join(cell(r, m) for m in METRICS) + " | |"
            )
    return "\n".join(lines)


def kv_event_ports(policies: Sequence[str], replicas: int) -> list[int]:
    """A ZMQ port per replica for vLLM's KV-cache events when kv_aware runs; [] otherwise."""
    return [free_port() for _ in range(replicas)] if "kv_aware" in policies else []


def kv_events_engine_args(port: int) -> list[str]:
    """vLLM publishes its KV-cache events on `port` (ZMQ, the default empty topic: kv_aware
    found no placement at all with a topic of its own)."""
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
    return ["--kv-events-config", json.dumps(config)]


def kv_aware_router_args(
    workers: Sequence[str], ports: Sequence[int], block_size: int, model: str
) -> list[str]:
    """kv_aware's event sources: each worker URL with its replica's ZMQ endpoint."""
    out: list[str] = []
    for url, port in zip(workers, ports, strict=True):
        out += ["--kv-event-source", f"{url}=tcp://127.0.0.1:{port}"]
    return [*out, "--kv-event-block-size", str(block_size), "--kv-event-model", model]


def chart_router(path: str | None) -> dict[str, list[str]]:
    """The router's arguments and what the chart adds to the replicas' vLLM arguments: from
    `helm template` now, or from a file written by `--write-chart-router`."""
    if path:
        data = json.loads(Path(path).read_text())
        return {k: [str(a) for a in data[k]] for k in ("router_args", "engine_args")}
    return {"router_args": chart_router_args(), "engine_args": chart_router_engine_args()}


def start_replicas(replicas: list[VLLMServer], first_alone: bool) -> None:
    """Start every replica and wait until all are healthy. `first_alone`: the first one on
    its own, then the rest together (on a GPU the first fills the compile cache the rest
    read, instead of all of them compiling the same graphs at once)."""
    rest = replicas
    if first_alone and replicas:
        replicas[0].start().wait_healthy()
        rest = replicas[1:]
    for r in rest:
        r.start()
    for r in rest:
        r.wait_healthy()


def add_engine_arg(p: argparse.ArgumentParser) -> None:
    """`--engine-arg`, repeated (scripts/bench_pd.py's too)."""
    p.add_argument(
        "--engine-arg",
        action="append",
        default=None,
        help="a vLLM argument of every replica (default: the tests' tiny-model arguments)",
    )


def add_without_engine_arg(p: argparse.ArgumentParser) -> None:
    """`--without-engine-arg FLAG`, repeated (scripts/bench_pd.py's too)."""
    p.add_argument(
        "--without-engine-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="leave out a flag the chart adds to the replicas' vLLM arguments (an older vLLM "
        "that lacks it; vLLM 0.25.1 serves the render endpoints without --enable-scale-out)",
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", help="model directory the replicas serve (required)")
    p.add_argument("--out", help="result JSON, logs beside it (required)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--systems", type=int, default=16)
    p.add_argument("--users-per-system", type=int, default=2)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--system-words", type=int, default=60)
    p.add_argument("--question-words", type=int, default=8)
    p.add_argument("--output-tokens", type=int, default=8)
    p.add_argument("--rate", type=float, default=4.0, help="requests per second leaving")
    add_engine_arg(p)
    p.add_argument(
        "--chart-router",
        help="JSON of the chart's router and engine arguments (default: rendered by helm now)",
    )
    p.add_argument(
        "--write-chart-router",
        metavar="FILE",
        help="render the chart's router and engine arguments into FILE, then exit",
    )
    add_without_engine_arg(p)
    p.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated, round_robin among them ({', '.join(KNOWN_POLICIES)})",
    )
    p.add_argument(
        "--kv-event-block-size",
        type=int,
        default=128,
        help="kv_aware: the replicas' KV block size (vLLM's CPU default 128; 16 on a GPU)",
    )
    p.add_argument(
        "--start-first-alone",
        action="store_true",
        help="start the first replica alone, then the others (they read its compile cache)",
    )
    return p


def _checked(
    p: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[str], dict[str, list[str]]]:
    """The policies and the chart's router and engine arguments, or a usage error."""
    if not (args.model and args.out):
        p.error("--model and --out are required")
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    if "round_robin" not in policies or set(policies) - set(KNOWN_POLICIES):
        p.error(f"--policies: round_robin and any of {KNOWN_POLICIES}, got {args.policies!r}")
    chart = chart_router(args.chart_router)
    unknown = set(args.without_engine_arg) - set(chart["engine_args"])
    if unknown:
        p.error(
            f"--without-engine-arg {sorted(unknown)}: not among the chart's {chart['engine_args']}"
        )
    return policies, chart


def write_chart_router(path: str) -> None:
    """Render the chart's router and engine arguments into `path`."""
    target = Path(path)
    tmp = target.with_suffix(".tmp")  # a failed render leaves the committed file as it was
    tmp.write_text(json.dumps(chart_router(None), indent=2) + "\n")
    tmp.replace(target)


def start_routers(
    replicas: list[VLLMServer],
    policies: Sequence[str],
    chart: dict[str, list[str]],
    ports: Sequence[int],
    args: argparse.Namespace,
    logs: Path,
    routers: dict[str, RouterProcess],
) -> None:
    """One router per policy in front of every replica, each added to `routers` once
    started (so that the caller stops those that did)."""
    urls = [r.url for r in replicas]
    for policy in policies:
        more = (
            kv_aware_router_args(urls, ports, args.kv_event_block_size, replicas[0].served_name)
            if policy == "kv_aware"
            else []
        )
        routers[policy] = RouterProcess(
            urls,
            logs / f"router-{policy}.log",
            policy=policy,
            chart_args=chart["router_args"],
            more_args=more,
        ).start()


def measure_rounds(
    routers: dict[str, RouterProcess],
    replicas: list[VLLMServer],
    policies: list[str],
    w: Workload,
    args: argparse.Namespace,
    rounds: list[dict[str, Any]],
) -> None:
    """An unrecorded warm-up block per policy, then `--rounds` rounds, each appended to
    `rounds` when measured; the policies' order rotates, so each takes each place in turn."""
    # One unrecorded block per policy: first requests pay for lazy set-up in each engine.
    warm = Workload(2, 1, 1, 16, 4, 2, args.rate)
    for policy in policies:
        measure(routers[policy], replicas, warm, seed=10_000)
    for k in range(args.rounds):
        row: dict[str, Any] = {"round": k}
        shift = k % len(policies)  # each policy takes each place in turn
        sequence = policies[shift:] + policies[:shift]
        for j, policy in enumerate(sequence):
            row[policy] = measure(routers[policy], replicas, w, seed=k * 100 + j)
            b = row[policy]
            print(
                f"round {k} {policy}: hit rate {b['hit_rate']}, TTFT p50 {b['ttft_p50_s']} s, "
                f"{b['failed']} failed {b['failures']}, decisions {b['router_decisions']}",
                flush=True,
            )
        rounds.append(row)


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.write_chart_router:
        write_chart_router(args.write_chart_router)
        return 0
    policies, chart = _checked(p, args)
    w = Workload(
        args.systems,
        args.users_per_system,
        args.turns,
        args.system_words,
        args.question_words,
        args.output_tokens,
        args.rate,
    )
    logs = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    # The replicas run what the chart gives serving pods behind the router (cache_aware's
    # render endpoints), plus the tiny model's or the caller's engine arguments.
    engine_args = (args.engine_arg or list(TINY_ENGINE_ARGS)) + [
        a for a in chart["engine_args"] if a not in args.without_engine_arg
    ]
    ports = kv_event_ports(policies, args.replicas)
    replicas = [
        VLLMServer(
            args.model,
            logs / f"replica-{i}.log",
            args=engine_args + (kv_events_engine_args(ports[i]) if ports else []),
        )
        for i in range(args.replicas)
    ]
    routers: dict[str, RouterProcess] = {}
    result: dict[str, Any] = {
        "workload": asdict(w),
        "replicas": args.replicas,
        "engine_args": engine_args,
        "policies": policies,
        "kv_event_ports": ports,
        "left_out_engine_args": args.without_engine_arg,
        "rounds": [],
        "logs": str(logs),
    }
    try:
        start_replicas(replicas, args.start_first_alone)
        result["router_args"] = chart["router_args"]
        start_routers(replicas, policies, chart, ports, args, logs, routers)
        measure_rounds(routers, replicas, policies, w, args, result["rounds"])
    finally:
        for router in routers.values():
            router.stop()
        for r in replicas:
            r.stop()
    result["summary"] = summarize(result["rounds"], policies)
    write_json(Path(args.out), result)
    print(table(result))
    return 0 if all(result["summary"]["policies"][p]["failed"] == 0 for p in policies) else 1


if __name__ == "__main__":
    sys.exit(main())
