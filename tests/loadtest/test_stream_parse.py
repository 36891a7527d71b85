"""The load generator's own stream parser, on reads split where a network can split them.

The rolling restart behind vLLM's router once recorded one request as failed with
`JSONDecodeError: Expecting value: line 1 column 1 (char 0)` while one replica served and no
shutdown was under way (docs/benchmarks.md, "Rollout soak"). The cause is the client, vLLM's
benchmark request function (vllm/benchmarks/lib/endpoint_request_func.py, vLLM 0.32): it
strips every read before buffering it, so an SSE event split right after `data:` loses the
space after the colon and the blank lines that end it; the next event glues onto it and the
glued text fails to parse. The server's stream was whole.

The session below stands in for aiohttp only to hand the parser the exact reads a network may
deliver (loopback TCP cannot be made to split at a given byte); the parser is vLLM's own code.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from vllm.benchmarks.lib.endpoint_request_func import (
    RequestFuncInput,
    async_request_openai_completions,
)

from ministream_loadtest.records import classify_error


def event(text: str, finish: str | None = None) -> bytes:
    chunk = {"id": "cmpl-1", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


class _Content:
    def __init__(self, reads: Sequence[bytes]) -> None:
        self._reads = reads

    async def iter_any(self) -> AsyncIterator[bytes]:
        for read in self._reads:
            yield read


class _Response:
    status = 200
    reason = "OK"

    def __init__(self, reads: Sequence[bytes]) -> None:
        self.content = _Content(reads)

    async def __aenter__(self) -> _Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class ReadsSession:
    """`session.post(...)` answers 200 and delivers `reads` as aiohttp's iter_any would."""

    def __init__(self, reads: Sequence[bytes]) -> None:
        self.reads = reads

    def post(self, **_: Any) -> _Response:
        return _Response(self.reads)


def run_client(reads: Sequence[bytes]) -> Any:
    request = RequestFuncInput(
        prompt="hello",
        api_url="http://127.0.0.1:1/v1/completions",
        prompt_len=1,
        output_len=3,
        model="m",
    )
    return asyncio.run(async_request_openai_completions(request, ReadsSession(reads)))


STREAM = event("a") + event("b") + event("c", "length") + b"data: [DONE]\n\n"


def split_after(data: bytes, marker: bytes, occurrence: int) -> list[bytes]:
    at = -1
    for _ in range(occurrence):
        at = data.index(marker, at + 1)
    cut = at + len(marker)
    return [data[:cut], data[cut:]]


def test_the_whole_stream_in_one_read_parses() -> None:
    output = run_client([STREAM])
    assert output.success and output.generated_text == "abc"


@pytest.mark.parametrize("occurrence", [1, 2, 3])
def test_a_read_ending_inside_an_event_elsewhere_parses(occurrence: int) -> None:
    """Splits inside the JSON or before `data:` are buffered correctly."""
    for marker in (b'"text": ', b"\n\n"):
        output = run_client(split_after(STREAM, marker, occurrence))
        assert output.success and output.generated_text == "abc", (marker, output.error)


def test_a_read_ending_right_after_data_colon_fails_in_the_client() -> None:
    """The recorded anomaly, by construction: the second event's read starts with ' {'."""
    output = run_client(split_after(STREAM, b"data:", 2))
    assert not output.success
    last = output.error.strip().splitlines()[-1]
    assert last == "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)"
    # The report names it as the client's, not the server's.
    assert classify_error(output.error) == "client_stream_parse_error"
