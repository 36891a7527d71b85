"""Everything the sidecar says to `vllm serve`, over its HTTP API and nothing else.

Endpoints used (vLLM 0.32 OpenAI server): GET /health, GET /v1/models,
POST /v1/completions, GET /metrics (for `vllm:num_requests_running` and
`vllm:num_requests_waiting`, gauges labelled `model_name` and `engine`; see
vllm/v1/metrics/loggers.py), and GET /load (`{"server_load": N}`: the generation requests
the HTTP server has accepted and not yet finished answering, counted only when vLLM runs
with `--enable-server-load-tracking`; vllm/entrypoints/serve/utils/api_utils.py).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, replace
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .errors import UpstreamError, UpstreamUnavailable

log = logging.getLogger(__name__)

RUNNING_METRIC = "vllm:num_requests_running"
LOAD_PATH = "/load"
# The vLLM flag without which /load answers 0 whatever vLLM holds: every vLLM the sidecar
# drains is started with it (the chart's arguments, `ministream up`).
LOAD_TRACKING_FLAG = "--enable-server-load-tracking"
WAITING_METRIC = "vllm:num_requests_waiting"
# Counters of the tokens vLLM has processed (prefill and decode): they grow while it works.
PROGRESS_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")


class Health(enum.Enum):
    OK = enum.auto()
    SLOW = enum.auto()  # no answer within the timeout: hung, or only saturated
    DOWN = enum.auto()  # refused, reset, or not 200: no server, or vLLM says unhealthy


@dataclass(frozen=True)
class ServedModel:
    name: str
    max_model_len: int | None


@dataclass(frozen=True)
class RequestCounts:
    """What vLLM holds. `running` and `waiting` are the engine core's scheduler queues as it
    last published them; `in_flight` is the HTTP server's own count (GET /load), which also
    covers a request still being parsed, tokenized or handed to the engine core, one the
    engine core has not stepped yet, and a response still being written. None: vLLM has no
    /load (then only the gauges count; docs/sidecar.md#what-the-drain-counts)."""

    running: int
    waiting: int
    in_flight: int | None = None

    @property
    def idle(self) -> bool:
        # vLLM's counter can dip below 0 when a client disconnects mid-request: not busy.
        return self.running == 0 and self.waiting == 0 and (self.in_flight or 0) <= 0


@dataclass(frozen=True)
class Completion:
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None


class VLLMClient:
    """Async client for one vLLM OpenAI server."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        health_timeout: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._health_timeout = health_timeout
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=httpx.Timeout(30.0),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def health(self) -> Health:
        """vLLM's GET /health: 200 within the health timeout, no answer in time, or not OK."""
        try:
            response = await self._http.get("/health", timeout=self._health_timeout)
        except httpx.TimeoutException as exc:
            log.debug("vLLM /health timed out", extra={"error": repr(exc)})
            return Health.SLOW
        except httpx.HTTPError as exc:
            log.debug("vLLM /health failed", extra={"error": repr(exc)})
            return Health.DOWN
        return Health.OK if response.status_code == 200 else Health.DOWN

    async def tokens_processed(self, timeout: float) -> float | None:
        """Prompt plus generated tokens vLLM has processed so far (PROGRESS_COUNTERS, summed
        over labels), or None when /metrics does not answer in `timeout` or lacks them."""
        try:
            response = await self._http.get("/metrics", timeout=timeout)
        except httpx.HTTPError as exc:
            log.debug("vLLM /metrics failed", extra={"error": repr(exc)})
            return None
        if response.status_code != 200:
            return None
        total, seen = 0.0, False
        try:
            for family in text_string_to_metric_families(response.text):
                for sample in family.samples:
                    if sample.name in PROGRESS_COUNTERS:
                        total, seen = total + sample.value, True
        except ValueError:
            return None
        return total if seen else None

    async def served_models(self) -> list[ServedModel]:
        body = await self._get_json("/v1/models")
        try:
            return [
                ServedModel(name=str(item["id"]), max_model_len=item.get("max_model_len"))
                for item in body["data"]
            ]
        except (KeyError, TypeError) as exc:
            raise UpstreamError(f"unexpected /v1/models body: {exc!r}") from exc

    async def complete(
        self, *, model: str, prompt_token_ids: list[int], max_tokens: int, timeout: float
    ) -> Completion:
        """One non-streaming completion that generates exactly `max_tokens` tokens.

        The prompt is sent as token ids, so its length is exact whatever the tokenizer;
        `ignore_eos` (a vLLM extension) keeps decode running to `max_tokens`.
        """
        payload: dict[str, Any] = {
            "model": model,
            "prompt": prompt_token_ids,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        }
        try:
            response = await self._http.post("/v1/completions", json=payload, timeout=timeout)
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"POST /v1/completions failed: {exc!r}") from exc
        if response.status_code != 200:
            raise UpstreamError(
                f"POST /v1/completions answered {response.status_code}: {_error_message(response)}",
                details={"status_code": response.status_code},
            )
        try:
            body = response.json()
            usage = body["usage"]
            return Completion(
                prompt_tokens=int(usage["prompt_tokens"]),
                completion_tokens=int(usage["completion_tokens"]),
                finish_reason=body["choices"][0].get("finish_reason"),
            )
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise UpstreamError(f"unexpected /v1/completions body: {exc!r}") from exc

    async def request_counts(self, model: str | None) -> RequestCounts:
        """Running and waiting requests from vLLM's own /metrics, summed over engines, and
        the HTTP requests in flight from GET /load.

        Only series of `model` count; if none carries that name (an alias was configured),
        all series count: one vLLM server serves one model. /load is read after /metrics, so
        a request that leaves the engine's queues between the two reads is still counted
        until its response has been written.
        """
        try:
            response = await self._http.get("/metrics", timeout=self._health_timeout)
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"GET /metrics failed: {exc!r}") from exc
        if response.status_code != 200:
            raise UpstreamError(f"GET /metrics answered {response.status_code}")
        counts = parse_request_counts(response.text, model)
        return replace(counts, in_flight=await self.in_flight())

    async def in_flight(self) -> int | None:
        """vLLM's GET /load: requests accepted and not yet answered; None where vLLM has no
        such endpoint (404). Without `--enable-server-load-tracking` vLLM answers 0 always."""
        try:
            response = await self._http.get(LOAD_PATH, timeout=self._health_timeout)
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"GET {LOAD_PATH} failed: {exc!r}") from exc
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise UpstreamError(f"GET {LOAD_PATH} answered {response.status_code}")
        try:
            return int(response.json()["server_load"])
        except (ValueError, KeyError, TypeError) as exc:
            raise UpstreamError(f"unexpected {LOAD_PATH} body: {response.text[:200]!r}") from exc

    async def _get_json(self, path: str) -> Any:
        try:
            response = await self._http.get(path)
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"GET {path} failed: {exc!r}") from exc
        if response.status_code != 200:
            raise UpstreamError(f"GET {path} answered {response.status_code}")
        try:
            return response.json()
        except ValueError as exc:
            raise UpstreamError(f"GET {path} returned no JSON: {exc}") from exc


def parse_request_counts(metrics_text: str, model: str | None = None) -> RequestCounts:
    """Running and waiting requests in vLLM's /metrics text, summed over engines (the series
    of `model` only, when any carries its name). UpstreamError when unparsable or absent."""
    # family -> (model_name, engine) -> value
    values: dict[str, dict[tuple[str, str], float]] = {RUNNING_METRIC: {}, WAITING_METRIC: {}}
    try:
        for family in text_string_to_metric_families(metrics_text):
            if family.name not in values:
                continue
            for sample in family.samples:
                key = (sample.labels.get("model_name", ""), sample.labels.get("engine", ""))
                values[family.name][key] = sample.value
    except ValueError as exc:
        raise UpstreamError(f"unparsable vLLM /metrics: {exc}") from exc
    missing = [name for name, series in values.items() if not series]
    if missing:
        raise UpstreamError(f"vLLM /metrics lacks {', '.join(missing)}")
    return RequestCounts(
        running=_sum_for_model(values[RUNNING_METRIC], model),
        waiting=_sum_for_model(values[WAITING_METRIC], model),
    )


def _sum_for_model(series: dict[tuple[str, str], float], model: str | None) -> int:
    mine = [value for (name, _engine), value in series.items() if model and name == model]
    return round(sum(mine if mine else series.values()))


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])[:500]
    except (ValueError, KeyError, TypeError):
        return response.text[:500]
