"""Overload: one pod driven at 1x, 2x and 5x its measured capacity, its probes replayed.

What it answers: does a saturated pod keep its liveness and readiness, or would
the kubelet restart a healthy-but-busy engine (and unready it), moving its queue onto the
other pods? The pod is the chart's (vLLM + sidecar, the rendered sidecar settings, as in the
rollout experiment); the kubelet's probes are replayed against its sidecar with the rendered
probe settings (`probes.py`).

1. Capacity: requests/s the engine completes with `capacity_concurrency` requests held in
   flight (closed loop; the requests' shape is the levels').
2. Each level L: Poisson arrivals at L x capacity for `level_seconds`; the run lasts until
   every request ended (at 5x the queue drains at 1x). Per level: requests succeeded /
   rejected (an HTTP error answer, e.g. 429/503 from an admission limit) / timed out (E2E
   over `request_timeout`: a client with that deadline would have given up), TTFT
   percentiles, liveness failures and the restarts they would cause, readiness flips, the
   probes' p99 latency, the sidecar's busy and failed health checks, vLLM /health after.
3. Between levels the engine goes idle, so levels do not overlap.

The load engine is `vllm bench serve` (engine.py), as in every other report here.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from ministream_sidecar.engine_client import parse_request_counts
from ministream_testkit.net import free_port
from ministream_testkit.results import write_json

from .chart_pod import ChartPod
from .engine import LoadSpec, run_engine
from .fleet import Pod
from .haproxy import Slot
from .pod_run import PodRun
from .probes import PodProbes
from .records import latency_summary, load_records

SIDECAR_COUNTERS = (
    "ministream_upstream_busy_checks_total",
    "ministream_upstream_health_failures_total",
)


@dataclass(frozen=True)
class OverloadConfig:
    pod: PodRun  # the model, the chart and where results go (shared with rollout and soak)
    levels: tuple[float, ...] = (1.0, 2.0, 5.0)
    level_seconds: float = 60.0
    input_tokens: int = 64
    output_tokens: int = 64
    capacity_concurrency: int = 32
    capacity_requests: int = 96
    request_timeout: float = 60.0


def _sidecar_counters(pod: Pod) -> dict[str, float]:
    text = httpx.get(f"{pod.sidecar_url}/metrics", timeout=10).text
    values = dict.fromkeys(SIDECAR_COUNTERS, 0.0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in values:
            values[name] = float(value)
    return values


def _wait_idle(pod: Pod, timeout: float = 600) -> None:
    """Until vLLM reports nothing running or waiting (its own gauges, as the drain reads them)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod.check_alive()
        text = httpx.get(f"{pod.api_url}/metrics", timeout=30).text
        if parse_request_counts(text).idle:
            return
        time.sleep(0.5)
    raise TimeoutError(f"vLLM still busy {timeout:.0f}s after the load ended")


class Overload:
    def __init__(self, cfg: OverloadConfig) -> None:
        self.cfg = cfg
        run = cfg.pod
        self.workdir = run.work_dir("-work")
        self.chart: ChartPod = run.render()
        self.template = run.template(self.chart, self.workdir / "logs")
        self.pod = Pod("overload", Slot(0, free_port(), free_port()), self.template)
        self.probes: PodProbes | None = None

    def spec(self, label: str, **kwargs: Any) -> LoadSpec:
        cfg = self.cfg
        return LoadSpec(
            base_url=self.pod.api_url,
            model=cfg.pod.served_name,
            tokenizer=cfg.pod.tokenizer_path,
            input_tokens=cfg.input_tokens,
            output_tokens=cfg.output_tokens,
            seed=cfg.pod.seed,
            request_id_prefix=f"{label}-",
            label=label,
            **kwargs,
        )

    def _engine(self, label: str, spec: LoadSpec) -> dict[str, Any]:
        result_file = self.workdir / f"{label}.json"
        (result,) = run_engine([(spec, result_file)], self.workdir / f"{label}-engine.log")
        return result

    def capacity(self) -> dict[str, Any]:
        cfg = self.cfg
        spec = self.spec(
            "capacity",
            num_prompts=cfg.capacity_requests,
            max_concurrency=cfg.capacity_concurrency,
        )
        result = self._engine("capacity", spec)
        records = load_records(result, expected_output_len=cfg.output_tokens)
        ok = [r for r in records if r.ok]
        if not ok:
            raise RuntimeError("no request succeeded while measuring capacity")
        span = max(r.end for r in ok) - min(r.start for r in ok)
        return {
            "requests_per_s": len(ok) / span,
            "concurrency": cfg.capacity_concurrency,
            "requests": len(records),
            "succeeded": len(ok),
        }

    def level(self, multiple: float, capacity: float) -> dict[str, Any]:
        cfg = self.cfg
        rate = multiple * capacity
        label = f"level-{multiple:g}x"
        spec = self.spec(
            label, num_prompts=max(1, round(rate * cfg.level_seconds)), request_rate=rate
        )
        assert self.probes is not None
        before = _sidecar_counters(self.pod)
        began = self.probes.now()
        result = self._engine(label, spec)
        ended = self.probes.now()
        logs = self.probes.summary(began, ended)
        duration = ended - began
        after = _sidecar_counters(self.pod)
        health = httpx.get(f"{self.pod.api_url}/health", timeout=30).status_code
        records = load_records(result, expected_output_len=cfg.output_tokens)
        ok = [r for r in records if r.ok]
        timed_out = [r for r in ok if r.latency > cfg.request_timeout]
        rejected = [r for r in records if not r.ok and (r.cause or "").startswith("http_")]
        _wait_idle(self.pod)
        return {
            "multiple": multiple,
            "rate_per_s": rate,
            "sent": len(records),
            "succeeded": len(ok) - len(timed_out),
            "timed_out": len(timed_out),
            "rejected": len(rejected),
            "failed_other": len(records) - len(ok) - len(rejected),
            "run_seconds": round(duration, 1),
            "latency": latency_summary(records),
            "probes": logs,
            "sidecar": {
                name.removeprefix("ministream_").removesuffix("_total"): after[name] - before[name]
                for name in SIDECAR_COUNTERS
            },
            "vllm_health_after": health,
        }

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.workdir.mkdir(parents=True, exist_ok=True)
        print(f"starting the pod (logs in {self.template.log_dir})", file=sys.stderr, flush=True)
        self.pod.start()
        # The kubelet probes from the container's start: startup first, then the other two.
        self.probes = PodProbes.for_chart(
            self.chart,
            {"api": self.pod.api_url, "sidecar": self.pod.sidecar_url},
            started_at=self.pod.events["created"],
            clock=self.pod.clock,
        ).start()
        try:
            ready_at = self.pod.wait_ready(cfg.pod.startup_timeout)
            print(f"ready after {ready_at - self.pod.events['created']:.1f}s", file=sys.stderr)
            capacity = self.capacity()
            print(f"capacity: {capacity['requests_per_s']:.2f} requests/s", file=sys.stderr)
            _wait_idle(self.pod)
            levels = []
            for multiple in cfg.levels:
                levels.append(self.level(multiple, capacity["requests_per_s"]))
                print(summary_line(levels[-1]), file=sys.stderr, flush=True)
        finally:
            logs = self.probes.stop()
            self.pod.kill()
        report = {
            "config": {
                **cfg.pod.as_report(),
                **{k: v for k, v in asdict(cfg).items() if k != "pod"},
            },
            "chart_pod": self.chart.as_dict(),
            "probes": [asdict(p) for p in self.chart.probes],
            "probe_replay": "kubelet: one deadline per probe over connect, request and answer",
            "startup": {
                "ready_seconds": round(ready_at - self.pod.events["created"], 1),
                "probes": {
                    k: log.summary(0, ready_at - self.pod.events["created"])
                    for k, log in logs.items()
                },
            },
            "whole_run": {k: log.summary() for k, log in logs.items()},
            "capacity": capacity,
            "levels": levels,
            "goal_met": all(goal_met(level) for level in levels),
        }
        write_json(cfg.pod.output, report)
        return report


def goal_met(level: dict[str, Any]) -> bool:
    """The overload goal for a level: no liveness failure, no readiness flip, vLLM healthy."""
    probes = level["probes"]
    return (
        probes["liveness"]["failures"] == 0
        and probes["readiness"]["flips"] == 0
        and level["vllm_health_after"] == 200
    )


def summary_line(level: dict[str, Any]) -> str:
    p = level["probes"]
    ttft = level["latency"]["ttft_ms"]
    return (
        f"{level['multiple']:g}x ({level['rate_per_s']:.2f}/s): {level['succeeded']} ok, "
        f"{level['timed_out']} timed out, {level['rejected']} rejected, "
        f"{level['failed_other']} other; TTFT p50 {ttft['p50']} p99 {ttft['p99']} ms; "
        f"liveness failures {p['liveness']['failures']}, readiness flips "
        f"{p['readiness']['flips']}, probe p99 {p['readiness']['latency_ms']['p99']} ms; "
        f"sidecar busy checks {level['sidecar']['upstream_busy_checks']:g}"
    )


def table(report: dict[str, Any]) -> str:
    """The report as a Markdown table (docs/benchmarks.md)."""
    rows = [
        "| load | sent | ok | timed out | rejected | TTFT p50 / p99 ms | liveness failures "
        "(restarts) | readiness failures (flips) | probe p99 ms (live / ready) | busy checks |",
        "|---|---:|---:|---:|---:|---|---:|---:|---|---:|",
    ]
    for lv in report["levels"]:
        p, ttft = lv["probes"], lv["latency"]["ttft_ms"]
        rows.append(
            f"| {lv['multiple']:g}x ({lv['rate_per_s']:.2f}/s) | {lv['sent']} | {lv['succeeded']} "
            f"| {lv['timed_out']} | {lv['rejected']} | {ttft['p50']} / {ttft['p99']} "
            f"| {p['liveness']['failures']} ({p['liveness']['restarts']}) "
            f"| {p['readiness']['failures']} ({p['readiness']['flips']}) "
            f"| {p['liveness']['latency_ms']['p99']} / "
            f"{p['readiness']['latency_ms']['p99']} | {lv['sidecar']['upstream_busy_checks']:g} |"
        )
    return "\n".join(rows)


def run_overload(cfg: OverloadConfig) -> dict[str, Any]:
    return Overload(cfg).run()
