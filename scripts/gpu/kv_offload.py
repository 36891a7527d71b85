"""KV-cache offload on vs off: a multi-turn workload whose working set exceeds the GPU's KV cache.

Two vLLM OpenAI servers run side by side on one GPU, both with the chart's command and
environment (chart-defaults.json, as cold_start.py starts them) and the same small GPU KV
cache (`--kv-cache-memory-bytes`); the "on" side adds vLLM's native CPU offloading
(`--kv-offloading-size GiB --kv-offloading-backend native`). Blocks alternate between the
sides (off/on, then on/off, ...) and each block pair replays the same sessions on both, so a
pair's ratio cancels drift on the machine.

A block: SESSIONS sessions, each a random PREFIX-token context, come back TURNS times in a
shuffled round-robin, CONCURRENCY requests in flight. Turn t's prompt is the session's
prefix plus every earlier turn (USER new tokens and OUTPUT synthetic "assistant" tokens per
turn) plus this turn's USER tokens: a chat that resends its history. With round-robin
returns, the distance between two visits of a session is about SESSIONS x the session's
length in tokens; when that exceeds the GPU KV cache, vLLM's LRU has evicted the prefix by
the time the session returns, unless the offload tier holds it. Token ids go in as lists,
so lengths are exact; `ignore_eos` makes every answer OUTPUT tokens long.

Per block and side: TTFT (streamed, time to the first token's text:
ministream_loadtest.streaming) p50/p99, end-to-end p50,
output tokens/s and requests/s over the block's wall time, and the deltas of vLLM's
counters over the block: prefix-cache queries and hits (tokens; vLLM's own hit rate),
external (connector) prefix-cache queries/hits, preemptions, and every offload/connector
counter the server exposes. Summary: per side the median over blocks with a bootstrap 95 %
interval, and the per-pair ratio on/off (interval_stats: rounds of one instance pair).

    python scripts/gpu/kv_offload.py run --model DIR --out OUT/kv-offload.json \
        --kv-cache-bytes 4294967296 --offload-gib 24 --blocks 3
    python scripts/gpu/kv_offload.py table OUT/kv-offload.json

Servers start through ministream_testkit's VLLMServer (cold_start.PodServer); the client is
httpx and the prometheus parser, both vLLM dependencies, so present on the GPU host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from cold_start import PodServer, cache_env, server_command
from prometheus_client.parser import text_string_to_metric_families

from ministream.startup_log import ENV as STARTUP_LOG_ENV
from ministream_loadtest.streaming import StreamTiming, timed_completion, ttft_percentiles_s
from ministream_testkit.results import write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: interval_stats
from interval_stats import bootstrap_median_ci, fmt_ratio, ratio_summary

# Counters whose per-block deltas are recorded (sums over label sets; histograms' _sum and
# _count, not their buckets).
COUNTER = re.compile(
    r"^vllm:[a-z_:]*(prefix_cache|offload|kv_transfer|connector|preemption)[a-z_:]*$"
)
LEFT_OUT = ("_created", "_bucket")
# The chart's pod paths (volumes): one process on a host needs neither.
POD_PATHS = (STARTUP_LOG_ENV, "PROMETHEUS_MULTIPROC_DIR")
TOKEN_LOW = 10  # above the special tokens; the top is the model's vocab_size


@dataclass(frozen=True)
class Workload:
    sessions: int
    turns: int
    prefix_tokens: int
    user_tokens: int
    output_tokens: int
    concurrency: int
    vocab_size: int

    def max_prompt(self) -> int:
        return (
            self.prefix_tokens
            + self.turns * self.user_tokens
            + (self.turns - 1) * (self.output_tokens)
        )

    def working_set_tokens(self) -> int:
        """Prompt tokens the sessions hold at their last turn (what a full cache would keep)."""
        return self.sessions * self.max_prompt()


def prompts(w: Workload, seed: int) -> list[list[list[int]]]:
    """prompts[s][t]: session s's prompt at turn t (exact token ids, seeded)."""
    out = []
    for s in range(w.sessions):
        rng = random.Random(seed * 1_000_003 + s)
        history = [rng.randrange(TOKEN_LOW, w.vocab_size) for _ in range(w.prefix_tokens)]
        turns = []
        for _ in range(w.turns):
            history += [rng.randrange(TOKEN_LOW, w.vocab_size) for _ in range(w.user_tokens)]
            turns.append(list(history))
            history += [rng.randrange(TOKEN_LOW, w.vocab_size) for _ in range(w.output_tokens)]
        out.append(turns)
    return out


def schedule(w: Workload, seed: int) -> list[tuple[int, int]]:
    """(session, turn) in issue order: each turn a shuffled round over all sessions."""
    rng = random.Random(seed)
    order: list[tuple[int, int]] = []
    for t in range(w.turns):
        sessions = list(range(w.sessions))
        rng.shuffle(sessions)
        order += [(s, t) for s in sessions]
    return order


def counters(text: str) -> dict[str, float]:
    """Selected counters of a /metrics page, summed over their label sets."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if COUNTER.match(name) and not name.endswith(LEFT_OUT):
                out[name] = out.get(name, 0.0) + sample.value
    return out


async def one_request(
    client: httpx.AsyncClient, base: str, model: str, prompt: list[int], output_tokens: int
) -> StreamTiming:
    """One streamed completion; a failed one ends the block (its error is the run's)."""
    timing = await timed_completion(client, base, model, prompt, output_tokens)
    if not timing.ok:
        raise RuntimeError(f"a completion failed: {timing.failure}")
    return timing


async def run_block(base: str, model: str, w: Workload, seed: int) -> dict[str, Any]:
    """One block of the workload against one server; counters diffed around it."""
    texts = prompts(w, seed)
    order = schedule(w, seed)
    done = {(s, -1): asyncio.Event() for s in range(w.sessions)}
    for event in done.values():
        event.set()
    for s, t in order:
        done[(s, t)] = asyncio.Event()
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for item in order:
        queue.put_nowait(item)
    results: list[tuple[StreamTiming, int, int]] = []  # (timing, turn, prompt tokens)
    limits = httpx.Limits(max_connections=w.concurrency + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:
        before = counters((await client.get(f"{base}/metrics")).text)

        async def worker() -> None:
            while True:
                try:
                    s, t = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await done[(s, t - 1)].wait()  # a session's turns stay in order
                r = await one_request(client, base, model, texts[s][t], w.output_tokens)
                results.append((r, t, len(texts[s][t])))
                done[(s, t)].set()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(w.concurrency)))
        wall = time.perf_counter() - t0
        after = counters((await client.get(f"{base}/metrics")).text)
    return {"seed": seed} | block_figures(results, wall, before, after, w)


def block_figures(
    results: list[tuple[StreamTiming, int, int]],
    wall: float,
    before: dict[str, float],
    after: dict[str, float],
    w: Workload,
) -> dict[str, Any]:
    """A block's figures from its requests' timings and the counters around it."""
    delta = {k: after[k] - before.get(k, 0.0) for k in sorted(after)}
    timings = [r for r, _, _ in results]
    ttft_p50, ttft_p99 = ttft_percentiles_s(timings)
    later = [r.ttft for r, turn, _ in results if turn > 0]
    queries = delta.get("vllm:prefix_cache_queries_total", 0.0)
    hits = delta.get("vllm:prefix_cache_hits_total", 0.0)
    ext_q = delta.get("vllm:external_prefix_cache_queries_total", 0.0)
    ext_h = delta.get("vllm:external_prefix_cache_hits_total", 0.0)
    return {
        "requests": len(results),
        "wall_s": wall,
        "ttft_p50_s": ttft_p50,
        "ttft_p99_s": ttft_p99,
        "ttft_later_turns_p50_s": statistics.median(later) if later else None,
        "e2e_p50_s": statistics.median(r.e2e for r in timings),
        "output_tok_s": len(results) * w.output_tokens / wall,
        "prompt_tok_s": sum(tokens for _, _, tokens in results) / wall,
        "requests_s": len(results) / wall,
        "prefix_cache_hit_rate": hits / queries if queries else None,
        "external_prefix_cache_hit_rate": ext_h / ext_q if ext_q else None,
        "counters": delta,
    }


@dataclass
class Side:
    """One side's chart-configured vLLM server, with its own caches in a scratch folder."""

    server: PodServer
    scratch: Path
    started: float

    @classmethod
    def start(cls, name: str, model: str, port: int, extra: list[str], out: Path) -> Side:
        argv, env_over, served = server_command("chart", model, port)
        scratch = Path(tempfile.mkdtemp(prefix=f"kvoff-{name}-"))
        env = {k: v for k, v in env_over.items() if k not in POD_PATHS}
        server = PodServer(
            model,
            out / f"{name}.log",
            served_name=served,
            port=port,
            env=env | cache_env(scratch / "cache", scratch),
            test_env=False,
            argv=argv + extra,
        )
        side = cls(server, scratch, time.time())
        server.start()
        return side

    def wait_ready(self, deadline: float) -> float:
        """Seconds from the start to /health 200 (raises past `deadline`, epoch seconds)."""
        self.server.wait_healthy(max(0.0, deadline - time.time()), interval=0.2)
        return time.time() - self.started

    def stop(self) -> None:
        self.server.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)


def side_args(args: argparse.Namespace) -> dict[str, list[str]]:
    common = [
        f"--kv-cache-memory-bytes={args.kv_cache_bytes}",
        f"--gpu-memory-utilization={args.gpu_memory_utilization}",
        f"--max-model-len={args.max_model_len}",
        *args.extra_arg,
    ]
    on = [f"--kv-offloading-size={args.offload_gib}", "--kv-offloading-backend=native"]
    return {"off": common, "on": common + on}


def summarize(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per side: median over blocks [bootstrap 95 %]; per metric: paired ratio on/off."""
    metrics = ("ttft_p50_s", "ttft_p99_s", "output_tok_s", "prefix_cache_hit_rate")
    out: dict[str, Any] = {"sides": {}, "ratio_on_off": {}}
    by_side = {s: [b for b in blocks if b["side"] == s] for s in ("off", "on")}
    for side, rows in by_side.items():
        out["sides"][side] = {}
        for m in metrics:
            values = [r[m] for r in rows if r.get(m) is not None]
            if values:
                lo, hi = bootstrap_median_ci(values)
                out["sides"][side][m] = {
                    "median": statistics.median(values),
                    "ci95": [lo, hi],
                    "n": len(values),
                }
    pairs: dict[int, dict[str, dict[str, Any]]] = {}
    for b in blocks:
        pairs.setdefault(b["pair"], {})[b["side"]] = b
    full = [p for p in pairs.values() if {"on", "off"} <= set(p)]
    for m in metrics[:3]:
        out["ratio_on_off"][m] = ratio_summary(
            [p["on"][m] for p in full], [p["off"][m] for p in full]
        )
    return out


def workload(args: argparse.Namespace) -> Workload:
    """The run's workload; refused when a session's last turn would not fit the context."""
    w = Workload(
        args.sessions,
        args.turns,
        args.prefix_tokens,
        args.user_tokens,
        args.output_tokens,
        args.concurrency,
        json.loads((Path(args.model) / "config.json").read_text())["vocab_size"],
    )
    if w.max_prompt() + w.output_tokens > args.max_model_len:
        raise SystemExit(
            f"a session's last turn needs {w.max_prompt() + w.output_tokens} tokens, more "
            f"than --max-model-len {args.max_model_len}: lower --turns or --prefix-tokens"
        )
    return w


def block(side: Side, w: Workload, seed: int) -> dict[str, Any]:
    """One block of `w` against one side's server."""
    return asyncio.run(run_block(side.server.url, side.server.served_name, w, seed))


def measure_pairs(
    servers: dict[str, Side],
    w: Workload,
    args: argparse.Namespace,
    deadline: float,
    blocks: list[dict[str, Any]],
) -> None:
    """Block pairs, the sides' order alternating, while `--blocks` or the budget asks for
    more; each block goes to `blocks` as soon as it is measured (an error keeps those)."""
    pair = 0
    while pair < args.blocks or (args.more and time.time() < deadline - args.pair_s):
        if time.time() > deadline - args.pair_s:
            print(f"stopping before pair {pair}: budget", flush=True)
            break
        order = ("off", "on") if pair % 2 == 0 else ("on", "off")
        for side in order:
            b = block(servers[side], w, seed=pair) | {"side": side, "pair": pair}
            blocks.append(b)
            print(
                f"pair {pair} {side}: ttft p50 {b['ttft_p50_s'] * 1e3:.1f} ms "
                f"p99 {b['ttft_p99_s'] * 1e3:.1f} ms, {b['output_tok_s']:.0f} "
                f"out tok/s, hit rate {b['prefix_cache_hit_rate']}, "
                f"{b['wall_s']:.1f} s",
                flush=True,
            )
        pair += 1


def run(args: argparse.Namespace) -> int:
    w = workload(args)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget_s
    servers = {
        side: Side.start(f"kv-offload-{side}", args.model, args.port + i, extra, out_path.parent)
        for i, (side, extra) in enumerate(side_args(args).items())
    }
    result: dict[str, Any] = {
        "workload": asdict(w)
        | {
            "max_prompt_tokens": w.max_prompt(),
            "working_set_tokens": w.working_set_tokens(),
        },
        "kv_cache_bytes": args.kv_cache_bytes,
        "offload_gib": args.offload_gib,
        "argv": {s: srv.server.command() for s, srv in servers.items()},
        "blocks": [],
        "ok": False,
    }
    try:
        result["ready_s"] = {s: srv.wait_ready(deadline) for s, srv in servers.items()}
        print(f"ready: {result['ready_s']}", flush=True)
        warm = Workload(2, 1, 256, 16, 8, 2, w.vocab_size)  # compiles/graphs touched before timing
        for srv in servers.values():
            block(srv, warm, seed=10_000)
        measure_pairs(servers, w, args, deadline, result["blocks"])
        result["ok"] = len(result["blocks"]) >= 2
    except (Exception, KeyboardInterrupt) as exc:  # keep what was measured
        result["error"] = repr(exc)
        print(f"error: {exc!r}", flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
    result["summary"] = summarize(result["blocks"])
    write_json(out_path, result)
    print(table_text(result))
    return 0 if result["ok"] else 1


def _ci(cell: dict[str, Any] | None, scale: float = 1.0, digits: int = 1) -> str:
    if not cell:
        return "n/a"
    lo, hi = cell["ci95"]
    return f"{cell['median'] * scale:.{digits}f} [{lo * scale:.{digits}f}, {hi * scale:.{digits}f}]"


def table_text(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        "| offload | blocks | TTFT p50 ms | TTFT p99 ms | output tok/s | prefix-cache hit rate |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for side in ("off", "on"):
        c = s["sides"].get(side, {})
        n = sum(1 for b in result["blocks"] if b["side"] == side)
        lines.append(
            f"| {side} | {n} | {_ci(c.get('ttft_p50_s'), 1e3)} | {_ci(c.get('ttft_p99_s'), 1e3)}"
            f" | {_ci(c.get('output_tok_s'), 1, 0)} | {_ci(c.get('prefix_cache_hit_rate'), 1, 3)} |"
        )
    r = s["ratio_on_off"]
    lines.append(
        f"| on/off (paired) | {r['ttft_p50_s'].get('n', 0)} | {fmt_ratio(r['ttft_p50_s'])} | "
        f"{fmt_ratio(r['ttft_p99_s'])} | {fmt_ratio(r['output_tok_s'])} | |"
    )
    return "\n".join(lines)


def table(args: argparse.Namespace) -> int:
    print(table_text(json.loads(Path(args.file).read_text())))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="both servers, alternating blocks, JSON + table")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True, help="result JSON (server logs beside it)")
    p.add_argument("--port", type=int, default=8100, help="off side; on side port + 1")
    p.add_argument("--kv-cache-bytes", type=int, required=True, help="GPU KV cache, both sides")
    p.add_argument("--offload-gib", type=float, required=True, help="CPU tier, on side")
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.4,
        help="vLLM's start-up check of free memory: two servers share the GPU",
    )
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--prefix-tokens", type=int, default=2048)
    p.add_argument("--user-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--blocks", type=int, default=3, help="block pairs (off+on) at least")
    p.add_argument("--more", action="store_true", help="more pairs while the budget lasts")
    p.add_argument("--pair-s", type=float, default=60, help="seconds one pair may take")
    p.add_argument("--budget-s", type=float, default=480, help="whole run, starts included")
    p.add_argument("--extra-arg", action="append", default=[], help="vLLM argument, both sides")
    p.set_defaults(func=run)
    t = sub.add_parser("table", help="the table of a result JSON")
    t.add_argument("file")
    t.set_defaults(func=table)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
