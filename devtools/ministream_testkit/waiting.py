"""The test suite's one polling loop: wait for a condition, with a deadline.

A fixed `sleep` either wastes time or, on a loaded machine, is too short; tests wait for
what they need instead, and a condition that never comes fails with what was awaited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def _timed_out(what: str, timeout: float, detail: Callable[[], str] | None) -> TimeoutError:
    extra = f"\n{detail()}" if detail is not None else ""
    return TimeoutError(f"timed out after {timeout:g} s waiting for {what}{extra}")


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.1,
    *,
    what: str,
    detail: Callable[[], str] | None = None,
) -> T:
    """Call `predicate` every `interval` s until it returns something truthy; return that.

    It is called once more at the deadline, so a slow last interval cannot cause a false
    timeout. Exceptions from `predicate` propagate: a predicate may fail fast (a process
    exited) instead of waiting out the deadline. On timeout: TimeoutError naming `what`,
    followed by `detail()` (a log tail, the last state seen) when given.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timed_out(what, timeout, detail)
        time.sleep(min(interval, remaining))


async def wait_until_async(
    predicate: Callable[[], Awaitable[T]],
    timeout: float,
    interval: float = 0.1,
    *,
    what: str,
    detail: Callable[[], str] | None = None,
) -> T:
    """`wait_until` for an event loop: awaits `predicate()` and sleeps without blocking it."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timed_out(what, timeout, detail)
        await asyncio.sleep(min(interval, remaining))
