"""Warmup: real completions through vLLM that exercise prefill and decode before the pod is ready.

One *run* is up to WARMUP_MAX_ATTEMPTS *attempts*, with a doubling backoff between them;
one attempt is WARMUP_REQUESTS completions, WARMUP_CONCURRENCY at a time, each with a
WARMUP_PROMPT_TOKENS-long prompt and WARMUP_MAX_TOKENS generated tokens. An attempt
succeeds only when every completion does. With LoRA adapters (LORA_ADAPTERS) the
completions go round-robin to the base model and every configured adapter vLLM lists under
/v1/models, at least one each; an adapter it does not list (the fetch step refused it) is
recorded as missing, not waited for: the pod serves the base model and the other adapters.
Runs are shared: concurrent callers of `WarmupRunner.run` (the automatic start and POST
/warmup) wait on the same run, and once a run succeeded, further calls return its result
without sending anything (idempotent).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from .context import SidecarContext
from .errors import Draining, SidecarError
from .events import EventReason, EventType
from .metrics import Outcome
from .state import WarmupState

log = logging.getLogger(__name__)

# Prompt token ids are drawn from 1..97: every tokenizer has that many ids, and sending ids
# (not text) makes the prompt length exact. Each request gets a different first token so
# that prefix caching cannot turn the warmup prefills into cache hits.
_PROMPT_ID_SPAN = 97


@dataclass(frozen=True)
class WarmupResult:
    succeeded: bool
    ran: bool  # False: an earlier run had already succeeded and nothing was sent
    attempts: int
    requests_succeeded: int  # in the last attempt
    requests_failed: int  # in the last attempt
    duration_seconds: float
    model: str
    last_error: str | None = None
    adapters_warmed: tuple[str, ...] = ()
    adapters_missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class _AttemptResult:
    succeeded: int
    failed: int
    first_error: str | None
    warmed: tuple[str, ...] = ()  # adapters sent a request in this attempt
    missing: tuple[str, ...] = ()


def prompt_token_ids(seed: int, length: int) -> list[int]:
    """A deterministic prompt of exactly `length` token ids; `seed` varies its first token."""
    return [1 + (seed * 31 + j * 7) % _PROMPT_ID_SPAN for j in range(length)]


class WarmupRunner:
    def __init__(
        self,
        ctx: SidecarContext,
        *,
        resolve_model: Callable[[], Awaitable[str]],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._ctx = ctx
        self._resolve_model = resolve_model
        self._sleep = sleep
        self._task: asyncio.Task[WarmupResult] | None = None
        self._last: WarmupResult | None = None
        self._runs = 0

    def trigger(self) -> None:
        """Start a run in the background unless one is running or one has succeeded."""
        if self._ctx.state.warmup is WarmupState.SUCCEEDED or self._ctx.state.draining:
            return
        self._ensure_task()

    async def run(self) -> WarmupResult:
        """Run warmup now, or join the run in progress, or return the earlier success."""
        if self._ctx.state.draining:
            raise Draining("the pod is draining; warmup will not run")
        if self._ctx.state.warmup is WarmupState.SUCCEEDED and self._last is not None:
            return replace(self._last, ran=False)
        # shield: a client that hangs up must not cancel the run other callers wait on.
        return await asyncio.shield(self._ensure_task())

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _ensure_task(self) -> asyncio.Task[WarmupResult]:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self._task

    async def _run(self) -> WarmupResult:
        self._runs += 1
        self._ctx.state.set_warmup(WarmupState.RUNNING)
        started = time.monotonic()
        try:
            return await self._attempts(started)
        except Exception as exc:  # a bug must leave the pod unready, not stuck in RUNNING
            log.exception("warmup crashed")
            return self._finish(False, 0, _AttemptResult(0, 0, repr(exc)), started, "")

    async def _attempts(self, started: float) -> WarmupResult:
        s = self._ctx.settings
        model = ""
        attempt = 0
        outcome = _AttemptResult(0, 0, None)
        log.info(
            "warmup started",
            extra={
                "run": self._runs,
                "requests": s.warmup_requests,
                "concurrency": s.warmup_concurrency,
                "prompt_tokens": s.warmup_prompt_tokens,
                "max_tokens": s.warmup_max_tokens,
            },
        )
        for attempt in range(1, s.warmup_max_attempts + 1):
            if self._ctx.state.draining:
                outcome = replace(outcome, first_error="drain started during warmup")
                break
            try:
                model = await self._resolve_model()
            except SidecarError as exc:
                outcome = _AttemptResult(0, 0, exc.message)
            else:
                outcome = await self._attempt_with_adapters(model, attempt)
            if outcome.failed == 0 and outcome.first_error is None:
                return self._finish(True, attempt, outcome, started, model)
            log.warning(
                "warmup attempt failed",
                extra={
                    "attempt": attempt,
                    "max_attempts": s.warmup_max_attempts,
                    "failed_requests": outcome.failed,
                    "error": outcome.first_error,
                },
            )
            if attempt < s.warmup_max_attempts:
                await self._sleep(
                    min(
                        s.warmup_backoff_initial_seconds * 2 ** (attempt - 1),
                        s.warmup_backoff_max_seconds,
                    )
                )
        return self._finish(False, attempt, outcome, started, model)

    async def _attempt_with_adapters(self, model: str, attempt: int) -> _AttemptResult:
        configured = self._ctx.settings.lora_adapters
        if not configured:
            return await self._attempt([model], attempt)
        try:
            listed = {m.name for m in await self._ctx.client.served_models()}
        except SidecarError as exc:
            return _AttemptResult(0, 0, exc.message)
        warmed = tuple(a for a in configured if a in listed)
        missing = tuple(a for a in configured if a not in listed)
        outcome = await self._attempt([model, *warmed], attempt)
        return replace(outcome, warmed=warmed, missing=missing)

    async def _attempt(self, models: list[str], attempt: int) -> _AttemptResult:
        s = self._ctx.settings
        gate = asyncio.Semaphore(s.warmup_concurrency)
        errors: list[str] = []

        async def one(index: int) -> bool:
            async with gate:
                begun = time.monotonic()
                try:
                    await self._ctx.client.complete(
                        model=models[index % len(models)],
                        prompt_token_ids=prompt_token_ids(
                            (attempt - 1) * s.warmup_requests + index, s.warmup_prompt_tokens
                        ),
                        max_tokens=s.warmup_max_tokens,
                        timeout=s.warmup_request_timeout_seconds,
                    )
                except SidecarError as exc:
                    errors.append(exc.message)
                    ok = False
                else:
                    ok = True
                self._ctx.metrics.warmup_request_duration_seconds.observe(time.monotonic() - begun)
                self._ctx.metrics.warmup_requests.labels(
                    (Outcome.SUCCESS if ok else Outcome.FAILURE).value
                ).inc()
                return ok

        count = max(s.warmup_requests, len(models))  # every adapter answers at least once
        results = await asyncio.gather(*(one(i) for i in range(count)))
        succeeded = sum(results)
        return _AttemptResult(succeeded, len(results) - succeeded, errors[0] if errors else None)

    def _finish(
        self, ok: bool, attempts: int, outcome: _AttemptResult, started: float, model: str
    ) -> WarmupResult:
        result = WarmupResult(
            succeeded=ok,
            ran=True,
            attempts=attempts,
            requests_succeeded=outcome.succeeded,
            requests_failed=outcome.failed,
            duration_seconds=round(time.monotonic() - started, 3),
            model=model,
            last_error=None if ok else outcome.first_error,
            adapters_warmed=outcome.warmed,
            adapters_missing=outcome.missing,
        )
        self._last = result
        if ok:
            self._ctx.state.record_adapters(outcome.warmed, outcome.missing)
        if ok and outcome.missing:
            log.error("LoRA adapters not loaded", extra={"adapters": list(outcome.missing)})
            self._ctx.events.emit(
                EventReason.ADAPTER_NOT_LOADED,
                f"LoRA adapter(s) {', '.join(outcome.missing)} not served by vLLM (refused by "
                "the fetch-adapters init container: its log says why); serving the base "
                "model and the other adapters",
                EventType.WARNING,
            )
        self._ctx.metrics.warmup_runs.labels(
            (Outcome.SUCCESS if ok else Outcome.FAILURE).value
        ).inc()
        self._ctx.state.set_warmup(WarmupState.SUCCEEDED if ok else WarmupState.FAILED)
        fields = {"attempts": attempts, "duration_seconds": result.duration_seconds, "model": model}
        if ok:
            log.info("warmup succeeded", extra=fields)
            self._ctx.events.emit(
                EventReason.WARMUP_SUCCEEDED,
                f"warmup of {model} finished in {result.duration_seconds:.1f}s "
                f"after {attempts} attempt(s)",
            )
        else:
            log.error("warmup failed", extra={**fields, "error": result.last_error})
            self._ctx.events.emit(
                EventReason.WARMUP_FAILED,
                f"warmup of {model or '?'} failed after {attempts} attempt(s): {result.last_error}",
                EventType.WARNING,
            )
        return result
