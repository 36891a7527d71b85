"""The testkit's reading of what a client saw (ministream_testkit.outcomes), against a local
server that answers each prompt with a canned HTTP response, byte for byte: a completion,
an error status, a stream that ends with an error event, a stream cut short, no answer."""

from __future__ import annotations

import json
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from ministream_testkit.outcomes import Ask, Seen, Stream, attempt, sent_after
from ministream_testkit.waiting import wait_until

pytestmark = pytest.mark.network


def _event(data: object) -> bytes:
    """One server-sent event as one HTTP chunk."""
    text = f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()
    return f"{len(text):x}\r\n".encode() + text + b"\r\n"


def _chunk(ids: list[int]) -> bytes:
    return _event({"choices": [{"text": "x", "token_ids": ids}]})


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
_END = b"0\r\n\r\n"
_ERROR = {"error": {"message": "Internal server error", "type": "InternalServerError"}}


def _plain(status: str, body: object) -> bytes:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}"
    return head.encode() + b"\r\nconnection: close\r\n\r\n" + data


# The prompt names the answer; None: never answer.
ANSWERS: dict[str, bytes | None] = {
    "plain": _plain("200 OK", {"choices": [{"token_ids": [1, 2, 3]}]}),
    "status": _plain("500 Internal Server Error", _ERROR),
    "stream": _STREAM_HEAD + _chunk([1, 2]) + _chunk([3]) + _event("[DONE]") + _END,
    "event": _STREAM_HEAD + _chunk([1]) + _event(_ERROR) + _event("[DONE]") + _END,
    "cut": _STREAM_HEAD + _chunk([1, 2]),
    "undone": _STREAM_HEAD + _chunk([1, 2]) + _END,
    "silent": None,
}


class _Canned(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        length = 0
        while (line := self.rfile.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        answer = ANSWERS[json.loads(self.rfile.read(length))["prompt"]]
        if answer is None:
            self.rfile.read()  # until the client gives up and closes
            return
        self.wfile.write(answer)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Canned) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()


@pytest.mark.parametrize(
    ("prompt", "streamed", "seen", "ids", "status"),
    [
        ("plain", False, Seen.COMPLETED, (1, 2, 3), 200),
        ("status", False, Seen.HTTP_ERROR, (), 500),
        ("status", True, Seen.HTTP_ERROR, (), 500),
        ("stream", True, Seen.COMPLETED, (1, 2, 3), 200),
        ("event", True, Seen.ERROR_EVENT, (1,), 200),
        ("cut", True, Seen.CUT, (1, 2), 200),
        ("undone", True, Seen.CUT, (1, 2), 200),
        ("silent", False, Seen.TIMED_OUT, (), None),
        ("silent", True, Seen.TIMED_OUT, (), None),
    ],
)
def test_each_end_is_read_as_the_client_saw_it(
    url: str, prompt: str, streamed: bool, seen: Seen, ids: tuple[int, ...], status: int | None
) -> None:
    progress: list[int] = []
    outcome = attempt(url, Ask({"prompt": prompt}, streamed), timeout=1.0, on_token=progress.append)
    assert (outcome.seen, outcome.ids, outcome.status) == (seen, ids, status), outcome
    assert outcome.started <= outcome.ended
    if streamed and ids:
        assert progress[-1] == len(ids)
    if seen is Seen.ERROR_EVENT:
        assert outcome.detail == "Internal server error"


def test_a_stream_s_clients_each_stop_after_one_request_sent_after_the_mark(url: str) -> None:
    asks = [Ask({"prompt": "plain"}), Ask({"prompt": "stream"}, True)]
    with Stream(url, asks, timeout=10.0) as stream:
        wait_until(lambda: stream.completed() >= 2 * len(asks), 30, 0.01, what="answers")
        mark = time.monotonic()
        stream.finish_after(mark)
        outcomes = stream.join(30)
    assert all(o.seen is Seen.COMPLETED for o in outcomes)
    after = sent_after(outcomes, mark)
    assert sorted(o.ask.streamed for o in after) == [False, True], after
    assert len(outcomes) > len(after)
