"""Per-request records from the engine's own detailed results, and failure causes.

`vllm bench serve --save-detailed` writes parallel per-request lists (`start_times`, `ttfts`,
`itls`, `latencies`, `input_lens`, `output_lens`, `errors`, ...), in the order the requests
were issued, so record `i` is request `<request-id-prefix><i>`. Every figure the reports
derive (window counts, window percentiles) is computed from these records; `load_records`
refuses a result whose success count disagrees with the engine's own `completed`.

Times are the engine's `time.perf_counter()`, which on Linux is CLOCK_MONOTONIC, the same
clock as this process's `time.perf_counter()`: the rollout orchestrator's event times and
the engine's request times share one time axis.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import numpy as np

_PHRASES = {status.phrase.lower(): status.value for status in HTTPStatus}
# Exception classes (last line of the engine's traceback text) -> cause.
_EXCEPTION_CAUSES = {
    "ClientConnectorError": "connection_refused",
    "ClientConnectionError": "connection_error",
    "ServerDisconnectedError": "server_disconnected",
    "ClientPayloadError": "stream_interrupted",
    "ClientOSError": "connection_reset",
    "TimeoutError": "timeout",
    "ServerTimeoutError": "timeout",
    # The load engine's own SSE parser failing on a stream split right after `data:` (it
    # strips each read): a client artifact, the server's stream was whole
    # (tests/loadtest/test_stream_parse.py).
    "JSONDecodeError": "client_stream_parse_error",
}
# Causes that leave no HTTP response: the connection failed before one began.
CONNECTION_CAUSES = frozenset(
    {"connection_refused", "connection_error", "server_disconnected", "connection_reset"}
)


@dataclass(frozen=True)
class RequestRecord:
    index: int
    request_id: str
    start: float  # engine perf_counter() when the request was sent
    success: bool  # the engine's verdict
    error: str
    ttft: float  # seconds
    itl: tuple[float, ...]
    latency: float  # seconds, end to end
    input_len: int
    output_len: int
    expected_output_len: int | None = None

    @property
    def truncated(self) -> bool:
        """A stream that ended early without an error (fewer tokens than ignore_eos asked for)."""
        return (
            self.success
            and self.expected_output_len is not None
            and self.output_len < self.expected_output_len
        )

    @property
    def ok(self) -> bool:
        return self.success and not self.truncated

    @property
    def end(self) -> float:
        return self.start + self.latency

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_len <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_len - 1)

    def agrees_with_status(self, status: int) -> bool:
        """Whether an HTTP status seen by a proxy matches this outcome. A proxy sees only the
        status line: a stream that failed after its `200` (no token, or cut short) agrees."""
        if status == 200:
            return self.success or self.cause == "no_tokens"
        return not self.success

    @property
    def cause(self) -> str | None:
        if self.ok:
            return None
        if self.truncated:
            return "truncated_stream"
        return classify_error(self.error)


def classify_error(error: str) -> str:
    """A short, stable name for an engine error text (HTTP reason phrase or traceback)."""
    text = error.strip()
    if not text:
        return "http_error_without_reason"
    if text.startswith("Never received a valid chunk"):
        return "no_tokens"
    if "Traceback" in text or "\n" in text:
        last = text.splitlines()[-1]
        name = last.split(":", 1)[0].rsplit(".", 1)[-1].strip()
        if name in _EXCEPTION_CAUSES:
            return _EXCEPTION_CAUSES[name]
        return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() or "exception"
    code = _PHRASES.get(text.lower())
    if code is not None:
        return f"http_{code}"
    return "http_" + re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def load_records(
    result: dict[str, Any],
    *,
    request_id_prefix: str = "",
    expected_output_len: int | None = None,
) -> list[RequestRecord]:
    """Records from one engine result written with --save-detailed."""
    try:
        starts = result["start_times"]
        columns = [
            result[k] for k in ("ttfts", "itls", "latencies", "input_lens", "output_lens", "errors")
        ]
    except KeyError as exc:
        raise ValueError(
            f"engine result has no per-request detail ({exc}); "
            "it must be written with --save-detailed"
        ) from None
    if any(len(col) != len(starts) for col in columns):
        raise ValueError("engine result's per-request lists differ in length")
    records = []
    for i, (start, ttft, itl, latency, in_len, out_len, error) in enumerate(
        zip(starts, *columns, strict=True)
    ):
        # RequestFuncOutput: a success has no error text and a first token.
        success = not error and ttft > 0
        records.append(
            RequestRecord(
                index=i,
                request_id=f"{request_id_prefix}{i}",
                start=float(start),
                success=success,
                error=error or "",
                ttft=float(ttft),
                itl=tuple(itl),
                latency=float(latency),
                input_len=int(in_len),
                output_len=int(out_len),
                expected_output_len=expected_output_len,
            )
        )
    completed = sum(r.success for r in records)
    if "completed" in result and completed != result["completed"]:
        raise ValueError(
            f"engine result says completed={result['completed']} but its "
            f"per-request records hold {completed} successes"
        )
    return records


def percentiles_ms(values: Sequence[float], ps: Iterable[int] = (50, 95, 99)) -> dict[str, Any]:
    """Percentiles (numpy's linear method, as the engine uses) in milliseconds; None when empty."""
    ps = tuple(ps)
    if len(values) == 0:
        return {"count": 0, "mean": None, **{f"p{p}": None for p in ps}, "max": None}
    arr = np.asarray(values, dtype=float) * 1000.0
    out: dict[str, Any] = {"count": len(values), "mean": round(float(arr.mean()), 3)}
    for p in ps:
        out[f"p{p}"] = round(float(np.percentile(arr, p)), 3)
    out["max"] = round(float(arr.max()), 3)
    return out


def latency_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """TTFT, ITL (all gaps of all good requests), TPOT and E2E percentiles of the good records."""
    good = [r for r in records if r.ok]
    return {
        "ttft_ms": percentiles_ms([r.ttft for r in good]),
        "itl_ms": percentiles_ms([gap for r in good for gap in r.itl]),
        "tpot_ms": percentiles_ms([t for r in good if (t := r.tpot) is not None]),
        "e2el_ms": percentiles_ms([r.latency for r in good]),
    }


def failure_counts(records: Iterable[RequestRecord]) -> dict[str, int]:
    counts = Counter(cause for r in records if (cause := r.cause) is not None)
    return dict(sorted(counts.items()))


def failure_examples(records: Iterable[RequestRecord]) -> dict[str, str]:
    """One error text per cause (its last line, shortened), for the report's readers."""
    examples: dict[str, str] = {}
    for r in records:
        cause = r.cause
        if cause is not None and cause not in examples:
            text = r.error.strip().splitlines()[-1] if r.error.strip() else "(no error text)"
            if r.truncated:
                text = f"{r.output_len} of {r.expected_output_len} tokens, no error"
            examples[cause] = text[:300]
    return examples
