"""One streamed completion, timed: the client of the benchmark scripts that send their own
requests (scripts/bench_routing.py, scripts/bench_pd.py, scripts/gpu/kv_offload.py).

TTFT here is the time from sending the request to the arrival of the first chunk whose
choice carries text: the first token's text, as a user sees it. A chunk without text (a
token that completes no character yet) does not end it; a stream that never carries text
has its TTFT equal to its end-to-end time. vLLM's own `vllm bench serve` (engine.py) stops
its TTFT clock at the first chunk with a choice, text or not; the two agree whenever the
first token decodes to text.

ITL (inter-token latency) is what `vllm bench serve` records as `itl`, and the load engine's
reports pool (records.latency_summary): the gaps between the arrivals of successive chunks
that carry a choice, text or not, one gap per chunk after the first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from .records import percentiles_ms


@dataclass(frozen=True)
class StreamTiming:
    """A streamed completion's TTFT, end-to-end time and inter-token gaps in seconds (see the
    module's docstring), or why it failed: the HTTP status, or the client error's class name."""

    ttft: float = 0.0
    e2e: float = 0.0
    failure: str | None = None
    itl: tuple[float, ...] = ()

    @property
    def ok(self) -> bool:
        return self.failure is None


def _first_choice(line: str) -> dict[str, Any] | None:
    """The first choice of an SSE line's chunk; None for another line or a chunk without one."""
    data = line.removeprefix("data: ")
    if data == line or not data.startswith("{"):
        return None
    choices = json.loads(data).get("choices") or [None]
    first: dict[str, Any] | None = choices[0]
    return first


async def timed_completion(
    client: httpx.AsyncClient, url: str, model: str, prompt: str | list[int], max_tokens: int
) -> StreamTiming:
    """A greedy, streamed completion of exactly `max_tokens` tokens from the server at `url`."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    t0 = time.perf_counter()
    ttft, last, gaps = None, None, list[float]()
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return StreamTiming(failure=str(resp.status_code))
            async for line in resp.aiter_lines():
                choice = _first_choice(line)
                if choice is None:
                    continue
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
                if ttft is None and choice.get("text"):
                    ttft = now - t0
    except httpx.HTTPError as exc:
        return StreamTiming(failure=type(exc).__name__)
    e2e = time.perf_counter() - t0
    return StreamTiming(ttft=e2e if ttft is None else ttft, e2e=e2e, itl=tuple(gaps))


def _p50_p99_s(values: Sequence[float]) -> tuple[float | None, float | None]:
    """p50 and p99 in seconds (records.percentiles_ms: numpy's linear method, as the load
    engine's reports); None when there is no value."""
    ms = percentiles_ms(values, (50, 99))
    if not ms["count"]:
        return None, None
    return ms["p50"] / 1000.0, ms["p99"] / 1000.0


def ttft_percentiles_s(timings: Sequence[StreamTiming]) -> tuple[float | None, float | None]:
    """TTFT p50 and p99 in seconds over the good timings; None when there is none."""
    return _p50_p99_s([t.ttft for t in timings if t.ok])


def itl_percentiles_s(timings: Sequence[StreamTiming]) -> tuple[float | None, float | None]:
    """ITL p50 and p99 in seconds over every gap of the good timings, pooled (as the load
    engine's reports pool them); None when there is no gap."""
    return _p50_p99_s([gap for t in timings if t.ok for gap in t.itl])
