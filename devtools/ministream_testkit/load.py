"""Load on a real vLLM server for tests: completions from threads, and an engine kept busy.

Every client here opens a new connection per request. A kept-alive connection races the
server's keep-alive timeout (uvicorn closes an idle connection after 5 s): on a saturated
two-core machine a client thread can stay descheduled that long between two requests, and its
next POST then meets a closed socket ("Server disconnected without sending a response"). It
did, in CI and on a quiet run of the autoscaling test. A load test must not fail on that.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

import httpx


class Served(Protocol):
    """What the load needs of a server (VLLMServer has both)."""

    @property
    def url(self) -> str: ...

    served_name: str


def client(url: str, timeout: float = 300) -> httpx.Client:
    """An HTTP client of `url` that never reuses a connection (see the module's docstring)."""
    return httpx.Client(
        base_url=url, timeout=timeout, limits=httpx.Limits(max_keepalive_connections=0)
    )


def _greedy(model: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """The body of a greedy completion of exactly `max_tokens` tokens."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def completion(http: httpx.Client, model: str, prompt: list[int], max_tokens: int) -> None:
    """One greedy completion of exactly `max_tokens` tokens; raises on a non-2xx answer."""
    http.post("/v1/completions", json=_greedy(model, prompt, max_tokens)).raise_for_status()


def streamed_completion(
    http: httpx.Client,
    model: str,
    prompt: list[int],
    max_tokens: int,
    on_tokens: Callable[[int], None],
) -> None:
    """`completion`, streamed: `on_tokens(n)` with the tokens generated so far, as vLLM
    counts them in each chunk's usage (a chunk may carry several tokens when the client
    lags). Raises on a non-2xx answer."""
    body = _greedy(model, prompt, max_tokens) | {
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with http.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            data = line.removeprefix("data: ")
            if data.startswith("{"):
                usage = json.loads(data).get("usage")
                if usage:
                    on_tokens(usage["completion_tokens"])


class BusyEngine:
    """Long completions from `threads` staggered threads while the `with` block runs.

    One long request is not enough to keep vLLM busy: the tiny model generates 480 tokens in
    about a second, which can end before a /metrics poll sees it running (it did, in CI). The
    threads start a third of a request apart, so that they never all finish together: each
    next thread starts once the previous one's first request has streamed a third of its
    tokens. (This was once read from vLLM's generation-token counter, polled every 20 ms: that
    counter moves in steps of whole requests, and the polls kept the API server busy, so 8
    threads took 50 s to start instead of a few.) A thread stops at its first failed request;
    `errors` holds it, `check()` raises it.
    """

    TOKENS = 480  # per request
    START_TIMEOUT = 120.0  # seconds for one thread's first third

    def __init__(self, server: Served, threads: int = 2, stream: bool = True) -> None:
        """`stream=False`: each thread loops plain completions and counts as under way once
        its first one is sent. On two cores vLLM's API server falls behind streamed output:
        the engine finishes the requests and its gauges read 0 while the clients still
        receive tokens (20 of 20 polls under 4 streams; 4 of 5 polls saw 4 running without
        streaming). A load meant to show in vLLM's gauges should not stream."""
        self._server = server
        self._stream = stream
        self._stop = threading.Event()
        self.errors: list[BaseException] = []
        self._under_way = [threading.Event() for _ in range(threads)]
        self._threads = [
            threading.Thread(target=self._loop, args=(event, self._tokens(k, threads)), daemon=True)
            for k, event in enumerate(self._under_way)
        ]

    def _tokens(self, k: int, threads: int) -> int:
        """Thread k's request length. Streamed, every thread asks for TOKENS (the start is
        staggered). Plain completions all start together, so their lengths differ instead,
        from TOKENS/2 up: the threads fall out of step after one request and do not all
        finish, and leave the engine idle, at once (8 clients in lockstep: 9 of 15 polls of
        vLLM's gauges read 0 running; lengths spread: 5 of 15)."""
        if self._stream:
            return self.TOKENS
        return self.TOKENS // 2 + k * self.TOKENS // (2 * threads)

    def _loop(self, under_way: threading.Event, tokens: int) -> None:
        def progress(tokens: int) -> None:
            if tokens >= self.TOKENS // 3:
                under_way.set()

        with client(self._server.url) as http:
            while not self._stop.is_set():
                try:
                    if self._stream:
                        streamed_completion(
                            http, self._server.served_name, [5] * 16, tokens, progress
                        )
                    else:
                        under_way.set()
                        completion(http, self._server.served_name, [5] * 16, tokens)
                except httpx.HTTPError as e:
                    self.errors.append(e)
                    under_way.set()  # ends the start-up wait, which then raises it
                    return

    def check(self) -> None:
        """Raise the first failed request's error, if any."""
        if self.errors:
            raise self.errors[0]

    def __enter__(self) -> BusyEngine:
        for thread, under_way in zip(self._threads, self._under_way, strict=True):
            thread.start()
            started = under_way.wait(self.START_TIMEOUT)
            self.check()
            assert started, f"no busy-engine request under way after {self.START_TIMEOUT:g} s"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(300)
        if exc_type is None:  # an error inside the block is the one to report
            assert not self.errors, f"the busy-engine requests failed: {self.errors}"
