"""Load on a real vLLM server for tests: completions from threads, and an engine kept busy.

Every client here opens a new connection per request. A kept-alive connection races the
server's keep-alive timeout (uvicorn closes an idle connection after 5 s): on a saturated
two-core machine a client thread can stay descheduled that long between two requests, and its
next POST then meets a closed socket ("Server disconnected without sending a response"). It
did, in CI and on a quiet run of the autoscaling test. A load test must not fail on that.
"""

from __future__ import annotations

import threading
from functools import partial
from types import TracebackType
from typing import Protocol

import httpx

from ministream_testkit.vllm_server import metrics_text, sum_samples
from ministream_testkit.waiting import wait_until


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


def completion(http: httpx.Client, model: str, prompt: list[int], max_tokens: int) -> None:
    """One greedy completion of exactly `max_tokens` tokens; raises on a non-2xx answer."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    http.post("/v1/completions", json=body).raise_for_status()


def generated_tokens(url: str) -> float:
    """vLLM's generation-token counter, summed over its label sets."""
    return sum_samples(metrics_text(url), "vllm:generation_tokens_total")


class BusyEngine:
    """Long completions from `threads` staggered threads while the `with` block runs.

    One long request is not enough to keep vLLM busy: the tiny model generates 480 tokens in
    about a second, which can end before a /metrics poll sees it running (it did, in CI). The
    threads start a third of a request apart, so that they never all finish together. A
    thread stops at its first failed request; `errors` holds it, `check()` raises it.
    """

    TOKENS = 480  # per request

    def __init__(self, server: Served, threads: int = 2) -> None:
        self._server = server
        self._stop = threading.Event()
        self.errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _loop(self) -> None:
        with client(self._server.url) as http:
            while not self._stop.is_set():
                try:
                    completion(http, self._server.served_name, [5] * 16, self.TOKENS)
                except httpx.HTTPError as e:
                    self.errors.append(e)
                    return

    def check(self) -> None:
        """Raise the first failed request's error, if any."""
        if self.errors:
            raise self.errors[0]

    def _generated_at_least(self, tokens: float) -> bool:
        self.check()
        return generated_tokens(self._server.url) >= tokens

    def __enter__(self) -> BusyEngine:
        for t in self._threads:
            target = generated_tokens(self._server.url) + self.TOKENS // 3
            t.start()
            wait_until(
                partial(self._generated_at_least, target),
                120,
                0.02,
                what="the busy-engine request under way",
            )
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
