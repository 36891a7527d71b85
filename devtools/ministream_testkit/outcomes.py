"""What a client sees of a completion request while a replica behind the front dies: the
answer (its token ids), an HTTP error status, a stream that ends with an error event, or a
connection closed before the response (a stream's `data: [DONE]`) was complete. A request the
client gave up on at its deadline is none of these: the tests count it as hung.

`Stream` is the steady load of a kill test: clients that each send their request again and
again through the front, recording every outcome, until told to stop after the kill.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx


class Seen(enum.Enum):
    COMPLETED = "completed"
    HTTP_ERROR = "HTTP error status"
    ERROR_EVENT = "stream ended with an error event"
    CUT = "connection closed before the response was complete"
    TIMED_OUT = "no answer within the deadline"


@dataclass(frozen=True)
class Ask:
    """One request a client sends: its JSON body, plain or streamed."""

    body: dict[str, Any]
    streamed: bool = False


@dataclass(frozen=True)
class Outcome:
    """One request's end as the client saw it. `ids`: the token ids received (a cut or
    failed stream's are those before the end); `detail`: the error body, event message or
    client exception."""

    seen: Seen
    ask: Ask
    started: float  # time.monotonic() when sent
    ids: tuple[int, ...] = ()
    status: int | None = None
    detail: str = ""
    ended: float = 0.0  # time.monotonic() when it ended (set by `attempt`)

    def label(self) -> str:
        """What a person reading the counts needs: kind, plain or streamed, status."""
        kind = "streamed" if self.ask.streamed else "plain"
        status = f" {self.status}" if self.status is not None else ""
        return f"{kind}: {self.seen.value}{status}"


@dataclass
class StreamRead:
    """A streamed completion's chunks joined: text, token ids, logprobs, the error event's
    message if one came, and whether `data: [DONE]` ended it."""

    text: str = ""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    error: str | None = None
    done: bool = False


def read_stream(
    lines: Iterable[str],
    on_token: Callable[[int], None] | None = None,
    read: StreamRead | None = None,
) -> StreamRead:
    """Join the server-sent events of a streamed completion into `read` (a new one by
    default, which keeps what came before an exception from `lines`); `on_token` gets the
    number of token ids received so far after each chunk that carries some."""
    read = StreamRead() if read is None else read
    for line in lines:
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            read.done = True
            continue
        event = json.loads(line[len("data: ") :])
        if "error" in event:
            read.error = str(event["error"].get("message", event["error"]))
        for choice in event.get("choices", []):
            read.text += choice.get("text") or ""
            read.ids += choice.get("token_ids") or []
            read.logprobs += (choice.get("logprobs") or {}).get("token_logprobs") or []
        if on_token is not None and read.ids:
            on_token(len(read.ids))
    return read


def _streamed(
    url: str, ask: Ask, started: float, timeout: float, on_token: Callable[[int], None] | None
) -> Outcome:
    body = {**ask.body, "stream": True}
    read = StreamRead()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout) as response:
        if response.status_code != 200:
            detail = response.read().decode(errors="replace")
            return Outcome(
                Seen.HTTP_ERROR, ask, started, status=response.status_code, detail=detail
            )
        try:
            read_stream(response.iter_lines(), on_token, read)
        except httpx.TransportError as exc:
            return Outcome(Seen.CUT, ask, started, tuple(read.ids), 200, repr(exc))
    if read.error is not None:
        return Outcome(Seen.ERROR_EVENT, ask, started, tuple(read.ids), 200, read.error)
    seen = Seen.COMPLETED if read.done else Seen.CUT
    return Outcome(seen, ask, started, tuple(read.ids), 200)


def _plain(url: str, ask: Ask, started: float, timeout: float) -> Outcome:
    response = httpx.post(f"{url}/v1/completions", json=ask.body, timeout=timeout)
    if response.status_code != 200:
        return Outcome(
            Seen.HTTP_ERROR, ask, started, status=response.status_code, detail=response.text
        )
    ids = tuple(response.json()["choices"][0]["token_ids"])
    return Outcome(Seen.COMPLETED, ask, started, ids, 200)


def attempt(
    url: str, ask: Ask, timeout: float, on_token: Callable[[int], None] | None = None
) -> Outcome:
    """Send `ask` to the completions endpoint at `url` and classify how it ended; `timeout`:
    httpx's, per read, so a stalled answer ends as TIMED_OUT."""
    started = time.monotonic()
    try:
        if ask.streamed:
            outcome = _streamed(url, ask, started, timeout, on_token)
        else:
            outcome = _plain(url, ask, started, timeout)
    except httpx.TimeoutException as exc:
        outcome = Outcome(Seen.TIMED_OUT, ask, started, detail=repr(exc))
    except httpx.TransportError as exc:
        outcome = Outcome(Seen.CUT, ask, started, detail=repr(exc))
    return dataclasses.replace(outcome, ended=time.monotonic())


def in_flight(outcomes: Iterable[Outcome], t: float) -> list[Outcome]:
    """The requests sent before `t` that ended after it."""
    return [o for o in outcomes if o.started < t < o.ended]


def sent_after(outcomes: Iterable[Outcome], t: float) -> list[Outcome]:
    return [o for o in outcomes if o.started >= t]


class Stream:
    """One client thread per ask, each sending its ask again and again through `url`
    (`once`: a single time), until `finish_after(t)`: then each stops after its first
    request sent at or after `t`. `tokens[i]`: token ids client i has received of its
    current streamed answer."""

    def __init__(self, url: str, asks: Sequence[Ask], timeout: float, once: bool = False):
        self.url, self.asks, self.timeout, self.once = url, list(asks), timeout, once
        self.outcomes: list[Outcome] = []
        self.tokens = [0] * len(self.asks)
        self._finish_at: float | None = None
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True)
            for i in range(len(self.asks))
        ]

    def start(self) -> Stream:
        for t in self._threads:
            t.start()
        return self

    def _client(self, i: int) -> None:
        def progress(n: int) -> None:
            self.tokens[i] = n

        while True:
            self.tokens[i] = 0
            outcome = attempt(self.url, self.asks[i], self.timeout, progress)
            self.outcomes.append(outcome)
            finish_at = self._finish_at
            if self.once or (finish_at is not None and outcome.started >= finish_at):
                return

    def completed(self) -> int:
        return sum(o.seen is Seen.COMPLETED for o in self.outcomes)

    def finish_after(self, t: float) -> None:
        self._finish_at = t

    def __enter__(self) -> Stream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Leaving without `finish_after` (a failed test): each client stops after its
        current request, so no client keeps loading the fleet for the next test."""
        if self._finish_at is None:
            self.finish_after(0.0)

    def join(self, timeout: float) -> list[Outcome]:
        """Every client's outcomes, once all have stopped; TimeoutError naming the clients
        still waiting after `timeout` s (a request that hung)."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        waiting = [self.asks[i] for i, t in enumerate(self._threads) if t.is_alive()]
        if waiting:
            raise TimeoutError(f"{len(waiting)} client(s) still waiting after {timeout:g} s")
        return list(self.outcomes)
