"""ministream_loadtest.streaming: the benchmark scripts' one streamed client, its TTFT and ITL."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest

from ministream_loadtest.streaming import (
    StreamTiming,
    itl_percentiles_s,
    timed_completion,
    ttft_percentiles_s,
)


def _sse(*texts: str) -> bytes:
    chunks = [f'data: {{"choices": [{{"index": 0, "text": "{t}"}}]}}\n\n' for t in texts]
    return "".join([*chunks, "data: [DONE]\n\n"]).encode()


def _time(handler: httpx.MockTransport, prompt: str = "p") -> StreamTiming:
    async def one() -> StreamTiming:
        async with httpx.AsyncClient(transport=handler) as client:
            return await timed_completion(client, "http://server", "m", prompt, 3)

    return asyncio.run(one())


def test_ttft_stops_at_the_first_chunk_with_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first chunk without text (a token that completes no character) does not end TTFT:
    with a clock that ticks once per reading (the start, each chunk with a choice, the end),
    the TTFT is the reading at the "a" chunk; every chunk after the first adds one ITL gap,
    the textless one included, and `[DONE]` none."""
    ticks = iter(range(100))
    clock = SimpleNamespace(perf_counter=lambda: float(next(ticks)))
    monkeypatch.setattr("ministream_loadtest.streaming.time", clock)
    timing = _time(httpx.MockTransport(lambda _: httpx.Response(200, content=_sse("", "a", "b"))))
    assert timing == StreamTiming(ttft=2.0, e2e=4.0, itl=(1.0, 1.0)) and timing.ok
    # No text at all: TTFT is the whole stream.
    ticks = iter(range(100))
    silent = _time(httpx.MockTransport(lambda _: httpx.Response(200, content=_sse("", ""))))
    assert silent.ttft == silent.e2e == 3.0


def test_a_failure_names_its_status_or_error() -> None:
    refused = _time(httpx.MockTransport(lambda _: httpx.Response(503, text="busy")))
    assert refused == StreamTiming(failure="503") and not refused.ok

    def disconnect(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("closed", request=request)

    assert _time(httpx.MockTransport(disconnect)).failure == "RemoteProtocolError"


def test_ttft_percentiles_leave_failures_out() -> None:
    timings = [StreamTiming(ttft=t, e2e=1.0) for t in (0.1, 0.2, 0.3)]
    p50, p99 = ttft_percentiles_s([*timings, StreamTiming(failure="500")])
    assert p50 == pytest.approx(0.2) and p99 == pytest.approx(0.298)  # numpy's linear method
    assert ttft_percentiles_s([StreamTiming(failure="500")]) == (None, None)


def test_itl_percentiles_pool_the_gaps_of_good_timings() -> None:
    timings = [StreamTiming(ttft=0.1, e2e=1.0, itl=(0.1, 0.3)), StreamTiming(itl=(0.2,))]
    p50, p99 = itl_percentiles_s([*timings, StreamTiming(failure="500", itl=(9.0,))])
    assert p50 == pytest.approx(0.2) and p99 == pytest.approx(0.298)
    assert itl_percentiles_s([StreamTiming(ttft=0.1, e2e=0.1)]) == (None, None)
