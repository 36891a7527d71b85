"""The rolling-restart experiment: N local pods behind HAProxy, constant streaming load, and a
Deployment-style rollout that replaces every pod the way the chart's rollout does.

The rollout follows the Deployment controller for the chart's `rollout.mode`:
- `surge` (maxSurge 1, maxUnavailable 0): start a new pod, wait until it is ready, then
  terminate one old pod; the next new pod waits for a free slot, i.e. a cluster with exactly
  the one spare set of accelerators that maxSurge 1 needs;
- `inPlace` (maxSurge 0, maxUnavailable 1): terminate one old pod, start its replacement in
  the freed slot, wait until it is ready.
A pod is ready when HAProxy's readiness check (the chart's readiness probe) passes.

The load is one `vllm bench serve` run at a constant Poisson rate through HAProxy, sized to
outlast the rollout; the report counts every request it sent and puts latency percentiles of
the requests sent during the restart window next to those sent before it.

A paired control (`control_restarts`): the last K replacements of the same run skip the
preStop drain (and may use their own endpoint lag), so the drained and the undrained
replacements share one fleet, one load and one machine state; the report splits the
restart window per replacement and traces every failure to a pod.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import platform
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ministream_testkit.provenance import vllm_version

from .chart_pod import DEFAULT_CHART, ChartPod, RolloutMode, chart_pod
from .engine import ENGINE_NAME, EngineProcess, LoadSpec
from .fleet import Pod, PodTemplate, ProcessFleet
from .haproxy import HAProxy, Slot, StateWatcher
from .records import (
    RequestRecord,
    failure_counts,
    failure_examples,
    latency_summary,
    load_records,
)
from .reports import write_json

if TYPE_CHECKING:
    from .podman_fleet import PodmanFleet

REQUEST_ID_PREFIX = "rollout-"
# process: each pod is a local vLLM and sidecar process (fleet.Pod); podman: each pod is the
# chart's rendered pod run from the images by `podman kube play` (podman_fleet.PodmanPod).
Runtime = Literal["process", "podman"]


@dataclass(frozen=True)
class RolloutConfig:
    model: str
    output: Path
    replicas: int = 2
    served_name: str = "ministream"
    tokenizer: str | None = None  # default: the model directory
    vllm_args: tuple[str, ...] = ()
    drain: bool = True  # False: every replacement is a control (no preStop drain)
    control_restarts: int = 0  # the last K replacements skip the drain (a paired control)
    control_endpoint_lag: float | None = None  # the controls' endpoint lag; None: endpoint_lag
    rollout_mode: RolloutMode | None = None  # None: the chart's rollout.mode
    restarts: int | None = None  # pods to replace; None: all of them
    rate: float = 2.0
    input_tokens: int = 32
    output_tokens: int = 32
    duration: float | None = None  # most seconds of load; None: see max_load_seconds
    lead_in: float = 10.0  # seconds of load before the first restart
    tail: float = 15.0  # seconds of load after the rollout
    endpoint_lag: float = 2.0  # seconds before a terminating pod leaves the endpoints
    chart: Path = DEFAULT_CHART  # the Helm chart whose rendered pod the experiment runs
    chart_values: tuple[Path, ...] = ()  # extra values files (helm -f)
    helm: str | None = None  # helm binary; None: chart_pod.find_helm's default
    startup_timeout: float = 900.0
    workdir: Path | None = None
    seed: int = 0
    env: dict[str, str] = field(default_factory=dict)
    runtime: Runtime = "process"


def _say(message: str) -> None:
    print(f"ministream-loadtest rollout: {message}", file=sys.stderr, flush=True)


def max_load_seconds(
    chart: ChartPod, restarts: int, startup_timeout: float, lead_in: float, tail: float
) -> float:
    """A cap on the load that no rollout within its own timeouts can outlast: each replaced
    pod may take its whole startup timeout, and its predecessor the whole grace period. The
    load itself ends `tail` seconds after the rollout (the engine's SIGUSR1 hook)."""
    per_pod = (
        startup_timeout
        + chart.termination_grace_period_seconds
        + 2 * chart.readiness_probe.period_seconds
    )
    return lead_in + restarts * per_pod + tail


def drain_summary(restarts: int, controls: int) -> str:
    """How a run's replacements stop their old pods, for logs and plot titles."""
    if controls == 0:
        return "with preStop /drain"
    if controls == restarts:
        return "WITHOUT drain (control)"
    return f"{restarts - controls} with preStop /drain, {controls} WITHOUT (paired control)"


def machine() -> dict[str, Any]:
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    return {
        "cpus": os.cpu_count(),
        "memory_gib": mem_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


class Rollout:
    def __init__(self, cfg: RolloutConfig) -> None:
        if cfg.replicas < 1:
            raise ValueError("--replicas must be at least 1")
        self.cfg = cfg
        sets: dict[str, Any] = {"rollout.mode": cfg.rollout_mode} if cfg.rollout_mode else {}
        if cfg.runtime == "podman":
            from .podman_fleet import podman_chart_values

            sets.update(podman_chart_values(cfg.model, cfg.served_name, cfg.vllm_args, cfg.env))
        self.chart = chart_pod(cfg.chart, cfg.chart_values, sets, cfg.helm)
        self.mode: RolloutMode = self.chart.rollout_mode
        self.restarts = cfg.replicas if cfg.restarts is None else cfg.restarts
        if not 1 <= self.restarts <= cfg.replicas:
            raise ValueError(f"--restarts must be between 1 and --replicas ({cfg.replicas})")
        self.controls = cfg.control_restarts if cfg.drain else self.restarts
        if not 0 <= self.controls <= self.restarts:
            raise ValueError(
                f"--control-restarts must be between 0 and --restarts ({self.restarts})"
            )
        self.workdir = cfg.workdir or cfg.output.with_name(cfg.output.stem + "-artifacts")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.fleet: ProcessFleet | PodmanFleet
        if cfg.runtime == "podman":
            from .podman_fleet import PodmanFleet

            self.fleet = PodmanFleet(cfg.chart, cfg.chart_values, sets, cfg.helm, self.workdir)
        else:
            self.fleet = ProcessFleet()
        n_slots = cfg.replicas + (1 if self.mode == "surge" else 0)
        self.slots = self.fleet.slots(n_slots)
        self.template = PodTemplate(
            model=cfg.model,
            served_name=cfg.served_name,
            vllm_args=cfg.vllm_args,
            chart=self.chart,
            log_dir=self.workdir / "pods",
            env=dict(cfg.env),
        )
        self.pods: list[Pod] = []
        self.slot_owner: dict[int, Pod] = {}
        self.released: set[str] = set()  # pods whose endpoint removal has happened
        self.replacements: list[dict[str, Any]] = []  # per replacement: pods, drain, times
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self.t0 = time.perf_counter()  # replaced by the engine's first send
        self.haproxy: HAProxy | None = None
        self.watcher: StateWatcher | None = None
        self._engine: EngineProcess | None = None
        self._records: list[RequestRecord] = []

    def rel(self, t: float | None) -> float | None:
        return None if t is None else round(t - self.t0, 3)

    # --- pods and slots -------------------------------------------------------------------
    def _slot_free(self, slot: Slot) -> bool:
        owner = self.slot_owner.get(slot.index)
        return owner is None or (
            owner.exited
            and (owner.name in self.released or math.isinf(self._endpoint_lag(owner.name)))
        )

    def _endpoint_lag(self, pod_name: str) -> float:
        """The endpoint lag planned for `pod_name`'s replacement (the default if none)."""
        planned = (rep["endpoint_lag"] for rep in self.replacements if rep["old"] == pod_name)
        return next(planned, self.cfg.endpoint_lag)

    def _wait_free_slot(self, timeout: float) -> Slot:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._raise_thread_errors()
            for slot in self.slots:
                if self._slot_free(slot):
                    return slot
            time.sleep(0.2)
        raise TimeoutError(f"no slot freed within {timeout:.0f}s")

    def _create_pod(self, name: str, slot: Slot) -> Pod:
        assert self.haproxy is not None
        pod = self.fleet.pod(name, slot, self.template)
        self.pods.append(pod)
        self.slot_owner[slot.index] = pod
        self.haproxy.add_endpoint(slot)
        pod.start()
        _say(f"[{self.rel(pod.events['created']):8.1f}s] pod {name} created in {slot.server}")
        return pod

    def _wait_pod_ready(self, pod: Pod) -> None:
        """Ready = the readiness check (HAProxy's, on /readyz) passes: the pod is in service."""
        assert self.watcher is not None
        deadline = time.monotonic() + self.cfg.startup_timeout
        pod.wait_ready(self.cfg.startup_timeout)  # the sidecar says ready; now the probe
        while not self.watcher.wait_for(lambda s: s.get(pod.slot.server) == "UP", 1.0):
            pod.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"pod {pod.name} not ready after {self.cfg.startup_timeout}s")
        pod.events["ready"] = time.perf_counter()
        _say(
            f"[{self.rel(pod.events['ready']):8.1f}s] pod {pod.name} ready (in service) after "
            f"{pod.events['ready'] - pod.events['created']:.1f}s"
        )
        time.sleep(self.chart.min_ready_seconds)

    def _plan(self, i: int) -> tuple[bool, float]:
        """Replacement i's drain and endpoint lag: the last `controls` ones are the control."""
        if i < self.restarts - self.controls:
            return True, self.cfg.endpoint_lag
        lag = self.cfg.control_endpoint_lag
        return False, self.cfg.endpoint_lag if lag is None else lag

    def _terminate_async(self, pod: Pod, drain: bool, endpoint_lag: float) -> None:
        def endpoint_removal() -> None:
            if not math.isinf(endpoint_lag):
                time.sleep(endpoint_lag)
                assert self.haproxy is not None
                self.haproxy.remove_endpoint(pod.slot)
                pod.events["endpoint_removed"] = time.perf_counter()
                self.released.add(pod.name)

        def shutdown() -> None:
            try:
                pod.terminate(drain=drain)
                _say(
                    f"[{self.rel(pod.events['exited']):8.1f}s] pod {pod.name} gone "
                    f"(vLLM status {pod.exit_code}{', SIGKILLed' if pod.killed else ''}; "
                    f"preStop {pod.prestop and pod.prestop.get('seconds')}s)"
                )
            except BaseException as exc:  # surfaced in the main thread
                self.errors.append(exc)

        _say(
            f"[{self.rel(time.perf_counter()):8.1f}s] pod {pod.name} terminating "
            f"({'preStop /drain, then ' if drain else 'no preStop (control), '}SIGTERM; "
            f"endpoint lag {endpoint_lag:g}s)"
        )
        for target in (endpoint_removal, shutdown):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self.threads.append(thread)

    def _raise_thread_errors(self) -> None:
        if self.errors:
            raise RuntimeError(f"pod shutdown failed: {self.errors[0]!r}") from self.errors[0]

    # --- the experiment -------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        try:
            return self._run()
        finally:
            self._cleanup()

    def _run(self) -> dict[str, Any]:
        cfg = self.cfg
        enabled = set(range(cfg.replicas))
        self.haproxy = HAProxy(self.workdir, self.slots, enabled, self.chart).start()
        for i in enabled:
            self.haproxy.mark_unready(self.slots[i])
        self.watcher = StateWatcher(self.haproxy).start()
        _say(
            f"HAProxy on {self.haproxy.url}; {len(self.slots)} slots, rollout mode "
            f"{self.mode}, {drain_summary(self.restarts, self.controls)}; logs in "
            f"{self.workdir}"
        )
        old = []
        for i in range(cfg.replicas):
            pod = self.fleet.pod(f"v1-{i}", self.slots[i], self.template)
            self.pods.append(pod)
            self.slot_owner[i] = pod
            old.append(pod.start())
        for pod in old:
            self._wait_pod_ready(pod)
        cold = max(p.events["ready"] - p.events["created"] for p in old)
        duration = cfg.duration or max_load_seconds(
            self.chart, self.restarts, cfg.startup_timeout, cfg.lead_in, cfg.tail
        )
        spec = LoadSpec(
            base_url=self.haproxy.url,
            model=cfg.served_name,
            tokenizer=cfg.tokenizer or cfg.model,
            api="completions",
            input_tokens=cfg.input_tokens,
            output_tokens=cfg.output_tokens,
            range_ratio=0.0,
            num_prompts=max(1, math.ceil(cfg.rate * duration)),
            request_rate=cfg.rate,
            seed=cfg.seed,
            temperature=0.0,
            request_id_prefix=REQUEST_ID_PREFIX,
            label="rollout",
        )
        engine = EngineProcess(
            [(spec, self.workdir / "engine-result.json")], self.workdir / "engine.log"
        )
        self._engine = engine.start()
        _say(
            f"all {cfg.replicas} pods ready (cold start {cold:.1f}s); load: {cfg.rate:g} "
            f"requests/s through {ENGINE_NAME} until {cfg.tail:g}s after the rollout "
            f"(at most {spec.num_prompts} requests)"
        )
        self.t0 = engine.wait_main_run(timeout=900)
        time.sleep(cfg.lead_in)

        t_start = time.perf_counter()
        for i in range(self.restarts):
            old_pod = old[i]
            drain, lag = self._plan(i)
            new_name = f"v2-{i}"
            self.replacements.append(
                {
                    "old": old_pod.name,
                    "new": new_name,
                    "drain": drain,
                    "endpoint_lag": lag,
                    "start": t_start if i == 0 else time.perf_counter(),
                }
            )
            if self.mode == "surge":
                new = self._create_pod(new_name, self._wait_free_slot(cfg.startup_timeout))
                self._wait_pod_ready(new)
                self._terminate_async(old_pod, drain, lag)
            else:
                self._terminate_async(old_pod, drain, lag)
                new = self._create_pod(new_name, self._wait_free_slot(cfg.startup_timeout))
                self._wait_pod_ready(new)
        for thread in self.threads:
            while thread.is_alive():
                thread.join(1.0)
        self._raise_thread_errors()
        t_end = time.perf_counter()
        _say(
            f"[{self.rel(t_end):8.1f}s] rollout finished in {t_end - t_start:.1f}s; "
            f"{cfg.tail:g}s more load"
        )
        time.sleep(cfg.tail)
        engine.stop_arrivals()
        result = engine.wait(timeout=900)[0]
        return self._report(result, spec, t_start, t_end, duration, cold)

    def _cleanup(self) -> None:
        if self._engine is not None:
            self._engine.kill()
        for pod in self.pods:
            pod.kill()
        self.fleet.close()
        if self.watcher is not None:
            self.watcher.stop()
        if self.haproxy is not None:
            self.haproxy.stop()

    # --- the report -----------------------------------------------------------------------
    def _pod_at(self, server: str, t: float) -> str | None:
        """The pod behind HAProxy's `server` at `t`: the slot's latest pod created by then.

        A pod owns its slot's endpoint from its creation until the next pod takes the slot,
        which is after the endpoint's removal, not at its exit: a pod that exits before its
        endpoint goes (no drain) still has requests routed to it, and they fail as its own.
        """
        owners = [
            pod
            for pod in self.pods
            if pod.slot.server == server and pod.events.get("created", math.inf) <= t
        ]
        return max(owners, key=lambda pod: pod.events["created"]).name if owners else None

    def _window(self, records: list[RequestRecord]) -> dict[str, Any]:
        return {
            "sent": len(records),
            "succeeded": sum(r.ok for r in records),
            "failed": sum(not r.ok for r in records),
            "failures_by_cause": failure_counts(records),
            **latency_summary(records),
        }

    def _report(
        self,
        result: dict[str, Any],
        spec: LoadSpec,
        t_start: float,
        t_end: float,
        duration: float,
        cold: float,
    ) -> dict[str, Any]:
        assert self.haproxy is not None and self.watcher is not None
        self.watcher.stop()
        self.haproxy.stop()  # flushes the access log
        records = load_records(
            result, request_id_prefix=REQUEST_ID_PREFIX, expected_output_len=spec.output_tokens
        )
        access = self.haproxy.access_log()
        failed = [r for r in records if not r.ok]
        by_pod: dict[str, int] = {}
        failures = []
        for r in failed:
            entry = access.get(r.request_id)
            pod = self._pod_at(entry.server, r.start) if entry else None
            by_pod[pod or "none"] = by_pod.get(pod or "none", 0) + 1
            failures.append(
                {
                    "request_id": r.request_id,
                    "sent_s": self.rel(r.start),
                    "cause": r.cause,
                    "haproxy_server": entry.server if entry else None,
                    "haproxy_status": entry.status if entry else None,
                    "pod": pod,
                }
            )
        matched = [r for r in records if r.request_id in access]
        # HAProxy logs each request it parsed: these never reached it as requests.
        unlogged = [r for r in records if r.request_id not in access]
        mismatched = [
            r.request_id for r in matched if not r.agrees_with_status(access[r.request_id].status)
        ]
        inside = [r for r in records if t_start <= r.start <= t_end]
        # Each request of the restart window belongs to the replacement under way when it was
        # sent: from that replacement's start to the next one's (the last: to the rollout's end).
        starts = [rep["start"] for rep in self.replacements]
        by_replacement: list[list[RequestRecord]] = [[] for _ in starts]
        for r in inside:
            by_replacement[max(0, bisect.bisect_right(starts, r.start) - 1)].append(r)
        ends = [*starts[1:], t_end]
        before = [r for r in records if r.start < t_start]
        after = [r for r in records if r.start > t_end]
        last_send = max((r.start for r in records), default=self.t0)
        report: dict[str, Any] = {
            "sent": len(records),
            "succeeded": sum(r.ok for r in records),
            "failed": len(failed),
            "failures_by_cause": failure_counts(records),
            "failure_examples": failure_examples(records),
            "failures_by_pod": dict(sorted(by_pod.items())),
            "restart_window": {
                "start_s": self.rel(t_start),
                "end_s": self.rel(t_end),
                "duration_s": round(t_end - t_start, 3),
                **self._window(inside),
            },
            "replacements": [
                {
                    "old": rep["old"],
                    "new": rep["new"],
                    "drain": rep["drain"],
                    "endpoint_lag_s": None
                    if math.isinf(rep["endpoint_lag"])
                    else rep["endpoint_lag"],
                    "window": {
                        "start_s": self.rel(rep["start"]),
                        "end_s": self.rel(end),
                        **self._window(sent),
                    },
                }
                for rep, end, sent in zip(self.replacements, ends, by_replacement, strict=True)
            ],
            "before_window": self._window(before),
            "after_window": self._window(after),
            "load_covered_rollout": last_send >= t_end,
            # Every *_s figure is seconds after this instant: the engine's first send, on
            # the engine's clock (perf_counter, CLOCK_MONOTONIC), so raw `start_times` map
            # onto the window as start_time - t0.
            "t0_perf_counter": self.t0,
            "drain": self.controls == 0,  # every replacement drained
            "control_restarts": self.controls,
            "rollout_mode": self.mode,
            "replicas": self.cfg.replicas,
            "restarts": self.restarts,
            "endpoint_lag_s": None if math.isinf(self.cfg.endpoint_lag) else self.cfg.endpoint_lag,
            "load": {
                "engine": ENGINE_NAME,
                "engine_version": vllm_version(),
                "api": spec.api,
                "request_rate": spec.request_rate,
                "max_requests": spec.num_prompts,
                "max_duration_s": round(duration, 1),
                "input_tokens": spec.input_tokens,
                "output_tokens": spec.output_tokens,
                "engine_completed": int(result["completed"]),
                "engine_failed": int(result["failed"]),
                "engine_duration_s": round(float(result["duration"]), 3),
                "raw_result": str(self.workdir / "engine-result.json"),
            },
            "access_log_check": {
                "records": len(records),
                "matched": len(matched),
                "status_disagreements": mismatched[:20],
                "unlogged": [
                    {"request_id": r.request_id, "sent_s": self.rel(r.start), "cause": r.cause}
                    for r in unlogged
                ],
            },
            "cold_start_s": round(cold, 1),
            "chart_pod": self.chart.as_dict(),
            "runtime": self.fleet.describe(),
            "pods": [self._pod_report(p) for p in self.pods],
            "lb_events": [
                {"t_s": self.rel(t), "server": s, "from": a, "to": b}
                for t, s, a, b in self.watcher.changes
                if t >= self.t0
            ],
            "failures": failures[:200],
            "config": {
                k: str(v) if isinstance(v, Path) else v
                for k, v in asdict(self.cfg).items()
                if k != "env"
            },
            "machine": machine(),
            "artifacts_dir": str(self.workdir),
        }
        self._records = records
        return report

    def _pod_report(self, pod: Pod) -> dict[str, Any]:
        ev = pod.events
        return {
            "name": pod.name,
            "slot": pod.slot.server,
            **{
                f"{k}_s": self.rel(ev.get(k))
                for k in (
                    "created",
                    "ready",
                    "terminating",
                    "endpoint_removed",
                    "sigterm",
                    "exited",
                )
            },
            "cold_start_s": round(ev["ready"] - ev["created"], 1) if "ready" in ev else None,
            "prestop": pod.prestop,
            "vllm_exit_code": pod.exit_code,
            "sigkilled": pod.killed,
        }


def run_rollout(cfg: RolloutConfig) -> dict[str, Any]:
    """Run the experiment; write the JSON report to cfg.output and a timeline PNG beside it."""
    from .plots import plot_rollout

    rollout = Rollout(cfg)
    report = rollout.run()
    cfg.output.parent.mkdir(parents=True, exist_ok=True)
    png = cfg.output.with_suffix(".png")
    report["plot"] = str(plot_rollout(report, rollout._records, rollout.t0, png))
    write_json(cfg.output, report)
    return report
