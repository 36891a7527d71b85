"""Soak: one pod under moderate load for a bounded time, its memory sampled all along.

The sidecar's memory must stay flat over a long run. The pod is the chart's
(vLLM + sidecar, the rendered settings, as in the overload and rollout runs); `vllm bench
serve` sends Poisson arrivals at `rate` requests/s for `minutes`; every `interval` seconds
the resident set size (VmRSS) of the sidecar process and of vLLM's whole process group (API
server, engine core) is recorded, with the sidecar's /metrics scraped as Prometheus would (a
leak often sits in what a scrape touches). The verdict compares the median RSS of the first
and the last `window` minutes (after a warm-up minute) and fits a slope: the sidecar passes
when it grew by less than `max_growth_mib` MiB.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ministream_testkit.net import free_port
from ministream_testkit.results import write_json

from .engine import LoadSpec, run_engine
from .fleet import Pod
from .haproxy import Slot
from .pod_run import PodRun
from .records import latency_summary, load_records


@dataclass(frozen=True)
class SoakConfig:
    pod: PodRun  # the model, the chart and where results go (shared with rollout and overload)
    minutes: float = 30.0
    rate: float = 2.0
    input_tokens: int = 64
    output_tokens: int = 32
    interval: float = 10.0
    window: float = 5.0
    max_growth_mib: float = 8.0


def rss_mib(pid: int) -> float:
    """VmRSS of one process in MiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def group_pids(pgid: int) -> list[int]:
    """Every process whose process group is `pgid` (a Child leads its own group)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # after the command: state, ppid, pgrp
            pids.append(int(entry.name))
    return pids


def growth(samples: list[tuple[float, float]], warmup_s: float, window_s: float) -> dict[str, Any]:
    """Median of the first and the last `window_s` after `warmup_s`, and a fitted slope."""
    kept = [(t, v) for t, v in samples if t >= warmup_s]
    if len(kept) < 2:
        return {"first_mib": None, "last_mib": None, "growth_mib": None, "slope_mib_per_h": None}
    start, end = kept[0][0], kept[-1][0]
    first = [v for t, v in kept if t <= start + window_s]
    last = [v for t, v in kept if t >= end - window_s]
    ts, vs = np.array([t for t, _ in kept]), np.array([v for _, v in kept])
    slope = float(np.polyfit(ts, vs, 1)[0]) * 3600 if len(set(ts)) > 1 else 0.0
    return {
        "first_mib": round(statistics.median(first), 2),
        "last_mib": round(statistics.median(last), 2),
        "growth_mib": round(statistics.median(last) - statistics.median(first), 2),
        "slope_mib_per_h": round(slope, 2),
    }


class Sampler:
    def __init__(self, pod: Pod, interval: float) -> None:
        self.pod, self.interval = pod, interval
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-rss", daemon=True)
        self._t0 = 0.0  # set by start()

    def _run(self) -> None:
        assert self.pod.vllm is not None and self.pod.sidecar is not None
        while not self._stop.is_set():
            with contextlib.suppress(httpx.HTTPError):  # a scrape, as Prometheus makes them
                httpx.get(f"{self.pod.sidecar_url}/metrics", timeout=10)
            self.samples.append(
                {
                    "t": round(time.monotonic() - self._t0, 1),
                    "sidecar_mib": round(rss_mib(self.pod.sidecar.pid), 2),
                    "vllm_mib": round(sum(rss_mib(p) for p in group_pids(self.pod.vllm.pid)), 2),
                }
            )
            self._stop.wait(self.interval)

    def start(self) -> Sampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, float]]:
        self._stop.set()
        self._thread.join(30)
        return self.samples


def run_soak(cfg: SoakConfig) -> dict[str, Any]:
    run = cfg.pod
    workdir = run.work_dir("-work")
    template = run.template(run.render(), workdir / "logs")
    pod = Pod("soak", Slot(0, free_port(), free_port()), template)
    spec = LoadSpec(
        base_url=pod.api_url,
        model=run.served_name,
        tokenizer=run.tokenizer_path,
        input_tokens=cfg.input_tokens,
        output_tokens=cfg.output_tokens,
        num_prompts=max(1, round(cfg.rate * cfg.minutes * 60)),
        request_rate=cfg.rate,
        seed=run.seed,
        request_id_prefix="soak-",
        label="soak",
    )
    print(f"starting the pod (logs in {template.log_dir})", file=sys.stderr, flush=True)
    pod.start()
    try:
        pod.wait_ready(run.startup_timeout)
        sampler = Sampler(pod, cfg.interval).start()
        try:
            (result,) = run_engine([(spec, workdir / "soak.json")], workdir / "soak-engine.log")
        finally:
            samples = sampler.stop()
    finally:
        pod.kill()
    records = load_records(result, expected_output_len=cfg.output_tokens)
    warmup, window = 60.0, cfg.window * 60
    verdict = {
        name: growth([(s["t"], s[f"{name}_mib"]) for s in samples], warmup, window)
        for name in ("sidecar", "vllm")
    }
    sidecar_growth = verdict["sidecar"]["growth_mib"]
    report = {
        "config": {
            **run.as_report(),
            **{k: v for k, v in asdict(cfg).items() if k != "pod"},
        },
        "requests": {
            "sent": len(records),
            "succeeded": sum(r.ok for r in records),
            "latency": latency_summary(records),
        },
        "rss": verdict,
        "samples": samples,
        "sidecar_flat": sidecar_growth is not None and sidecar_growth < cfg.max_growth_mib,
    }
    write_json(run.output, report)
    return report
