"""The kubelet's startup, liveness and readiness probes of one pod, replayed against it.

The probe settings come from the chart's rendered Deployment (`ChartPod.probes`): path, port,
`periodSeconds`, `timeoutSeconds`, `initialDelaySeconds`, `failureThreshold` and
`successThreshold`, Kubernetes' defaults filling what the chart leaves unset. What the
kubelet does, and this replay with it (docs/loadtest.md, "How the probes are replayed"):

- Each probe is one HTTP GET on a new connection with ONE deadline, `timeoutSeconds`, over
  connecting, sending, the status line, the headers and at most 10 KiB of body (the
  kubelet's Go client has `Timeout: timeoutSeconds` for the whole exchange and reads at most
  10 KiB of the body). An answer that drips past the deadline fails, however steadily its
  bytes arrive; a per-read timeout (what `httpx.get(timeout=...)` applies) would pass it.
  A status in [200, 400) passes.
- A probe runs every `periodSeconds`, the first one `initialDelaySeconds` after the
  container started; a probe that outlasts the period delays the next (ticks are dropped,
  as Go's ticker drops them), never two at once.
- While the startup probe has not passed, liveness and readiness are not run (and the pod is
  not ready). `failureThreshold` consecutive startup or liveness failures restart the
  container: the replay cannot restart a process, so it counts the restart and starts the
  streak afresh.
- Readiness starts unready; `successThreshold` consecutive passes make the pod ready,
  `failureThreshold` consecutive failures take it out of its Service's endpoints (a flip).

`ProbeLog` holds those rules (pure, unit-tested); `http_probe` is one probe; `PodProbes` runs
the three of a pod in threads from the container's start.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .chart_pod import ChartPod, ProbeSpec
from .records import percentiles_ms

# The kubelet reads at most this much of a probe's body (Kubernetes' maxRespBodyLength).
BODY_LIMIT = 10 * 1024
_USER_AGENT = "kube-probe/replay"


@dataclass
class ProbeLog:
    """The outcomes of one probe and what the kubelet made of them."""

    spec: ProbeSpec
    results: list[tuple[float, bool, float, str]] = field(default_factory=list)
    # (seconds since the container started, passed, latency s, "200" | "timeout" | error name)
    restart_times: list[float] = field(default_factory=list)  # startup, liveness
    flip_times: list[float] = field(default_factory=list)  # readiness: ready -> unready
    ready: bool = False  # readiness as the endpoints controller sees it
    passed_once: bool = False  # startup: the kubelet has let liveness and readiness begin
    _failures: int = 0
    _successes: int = 0

    @property
    def restarts(self) -> int:
        return len(self.restart_times)

    @property
    def flips(self) -> int:
        return len(self.flip_times)

    def record(self, at: float, passed: bool, latency: float, outcome: str) -> None:
        self.results.append((at, passed, latency, outcome))
        if passed:
            self._failures, self._successes = 0, self._successes + 1
            self.passed_once = True
            if not self.ready and self._successes >= self.spec.success_threshold:
                self.ready = True
            return
        self._failures, self._successes = self._failures + 1, 0
        if self._failures == self.spec.failure_threshold:
            if self.spec.kind == "readiness":
                if self.ready:
                    self.ready = False
                    self.flip_times.append(at)
            else:
                self.restart_times.append(at)
                self._failures = 0  # the kubelet restarts the container and counts afresh

    def summary(self, start: float = float("-inf"), end: float = float("inf")) -> dict[str, Any]:
        """Probes, failures, outcomes and latency of the probes begun in [start, end), and the
        restarts or flips that happened then."""
        window = [r for r in self.results if start <= r[0] < end]
        outcomes: dict[str, int] = {}
        for _, _, _, outcome in window:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        out: dict[str, Any] = {
            "probes": len(window),
            "failures": sum(1 for r in window if not r[1]),
            "outcomes": dict(sorted(outcomes.items())),
            "latency_ms": percentiles_ms([r[2] for r in window], (50, 99, 100)),
        }
        if self.spec.kind == "readiness":
            out["flips"] = sum(1 for t in self.flip_times if start <= t < end)
        else:
            out["restarts"] = sum(1 for t in self.restart_times if start <= t < end)
        return out


def _request(parts: urllib.parse.SplitResult) -> bytes:
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return (
        f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nUser-Agent: {_USER_AGENT}\r\n"
        "Accept: */*\r\nConnection: close\r\n\r\n"
    ).encode()


def _answer_complete(buffer: bytes) -> tuple[int, bool] | None:
    """(status, whole) once the status line and headers are in: whole when the body the
    kubelet would read (Content-Length, the end of a chunked body, or 10 KiB) is in too."""
    head, sep, body = buffer.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    if len(body) >= BODY_LIMIT:
        return status, True
    if "content-length" in headers:
        return status, len(body) >= int(headers["content-length"])
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, body.endswith(b"0\r\n\r\n")
    return status, False  # read to the end of the connection


def http_probe(url: str, timeout: float) -> tuple[bool, str]:
    """One HTTP GET as the kubelet makes it: (passed, outcome) with one deadline of `timeout`
    seconds over connect, request, status line, headers and up to 10 KiB of body."""
    parts = urllib.parse.urlsplit(url)
    deadline = time.monotonic() + timeout

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left

    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 80), timeout=remaining()
        ) as sock:
            sock.settimeout(remaining())
            sock.sendall(_request(parts))
            buffer = b""
            answer = None
            while True:
                sock.settimeout(remaining())
                chunk = sock.recv(4096)
                if chunk:
                    buffer += chunk
                    answer = _answer_complete(buffer)
                if answer is not None and (answer[1] or not chunk):
                    break
                if not chunk:
                    return False, "no_answer"
            assert answer is not None
            status = answer[0]
    except TimeoutError:  # socket.timeout is TimeoutError since Python 3.10
        return False, "timeout"
    except (ValueError, IndexError):
        return False, "bad_answer"
    except OSError as exc:
        return False, type(exc).__name__
    return 200 <= status < 400, str(status)


class PodProbes:
    """The pod's three probes, each in a thread, from the container's start until `stop()`.

    `urls` maps a probe target ("api", "sidecar") to its base URL; `started_at` is the
    container's start on `clock` (initial delays count from it, and every result's time is
    seconds since it)."""

    def __init__(
        self,
        probes: tuple[ProbeSpec, ...],
        urls: Mapping[str, str],
        started_at: float,
        clock: Callable[[], float] = time.perf_counter,
        probe: Callable[[str, float], tuple[bool, str]] = http_probe,
    ) -> None:
        self.logs: dict[str, ProbeLog] = {spec.kind: ProbeLog(spec) for spec in probes}
        self.urls: dict[str, str] = {s.kind: urls[s.target].rstrip("/") + s.path for s in probes}
        self.started_at = started_at
        self.clock = clock
        self._probe = probe
        self._stop = threading.Event()
        self._started = threading.Event()  # the startup probe has passed (or there is none)
        if "startup" not in self.logs:
            self._started.set()
        self._threads = [
            threading.Thread(target=self._run, args=(kind,), name=f"probe-{kind}", daemon=True)
            for kind in self.logs
        ]

    @classmethod
    def for_chart(
        cls,
        chart: ChartPod,
        urls: Mapping[str, str],
        started_at: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> PodProbes:
        return cls(chart.probes, urls, started_at, clock)

    def now(self) -> float:
        """Seconds since the container started."""
        return self.clock() - self.started_at

    def start(self) -> PodProbes:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> dict[str, ProbeLog]:
        self._stop.set()
        self._started.set()  # release the gated threads
        longest = max((log.spec.timeout_seconds for log in self.logs.values()), default=0)
        for thread in self._threads:
            thread.join(longest + 5)
        return self.logs

    def summary(self, start: float, end: float) -> dict[str, dict[str, Any]]:
        """Each probe's summary over [start, end) seconds since the container started."""
        return {kind: log.summary(start, end) for kind, log in self.logs.items()}

    def _run(self, kind: str) -> None:
        log = self.logs[kind]
        spec = log.spec
        if kind != "startup":
            self._started.wait()
        next_at = max(spec.initial_delay_seconds, self.now())
        while not self._stop.wait(max(0.0, next_at - self.now())):
            began = self.now()
            passed, outcome = self._probe(self.urls[kind], spec.timeout_seconds)
            log.record(began, passed, self.now() - began, outcome)
            if kind == "startup" and log.passed_once:
                self._started.set()
                return  # the kubelet stops the startup probe once it passed
            next_at = max(next_at + spec.period_seconds, self.now())
