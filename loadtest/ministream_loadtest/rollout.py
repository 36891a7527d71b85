"""The rolling-restart experiment: N local pods behind a front (HAProxy standing in for the
Service, or vLLM's router with its discovery: fronts.py), constant streaming load, and a
Deployment-style rollout that replaces every pod the way the chart's rollout does.

The rollout follows the Deployment controller for the chart's `rollout.mode`:
- `surge` (maxSurge 1, maxUnavailable 0): start a new pod, wait until it is ready, then
  terminate one old pod; the next new pod waits for a free slot, i.e. a cluster with exactly
  the one spare set of accelerators that maxSurge 1 needs;
- `inPlace` (maxSurge 0, maxUnavailable 1): terminate one old pod, start its replacement in
  the freed slot, wait until it is ready.
A pod is ready when the front routes to it: HAProxy's readiness check (the chart's readiness
probe) passes, or the router's discovery added it once that probe passed.

The load is one `vllm bench serve` run at a constant Poisson rate through the front, sized to
outlast the rollout; the report counts every request it sent and puts latency percentiles of
the requests sent during the restart window next to those sent before it.

A paired control (`control_restarts`): the last K replacements of the same run skip the
preStop drain (and may use their own endpoint lag), so the drained and the undrained
replacements share one fleet, one load and one machine state; the report splits the
restart window per replacement and traces every failure to a pod.

Prefill/decode disaggregation (`pd_pool`, router front only): the chart rendered with
`disaggregation.enabled`, one pool rolled as above and the other kept at one pod, every pod
on a loopback address of its own with its pool's rendered vLLM arguments and NIXL
environment, the router's own discovery finding each pool by its selector (pd_pools.py).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ministream_testkit.provenance import vllm_version
from ministream_testkit.results import write_json

from .chart_pod import RolloutMode
from .engine import ENGINE_NAME, EngineProcess, LoadSpec
from .fleet import Pod, ProcessFleet
from .fronts import Front, FrontKind, front_chart_values, open_front
from .haproxy import Slot, StateWatcher
from .pd_pools import (
    NixlSampler,
    PDPool,
    PoolSlots,
    other_pool,
    paired_count,
    pd_chart_values,
    pool_slots,
    running_pd_pods,
    scrape,
    warm_up,
)
from .pod_run import PodRun
from .records import RequestRecord, load_records
from .rollout_plan import Replacement, drain_summary, max_load_seconds, replacement_plan
from .rollout_report import PodSnapshot, RolloutFacts, build_report

if TYPE_CHECKING:
    from .podman_fleet import PodmanFleet

REQUEST_ID_PREFIX = "rollout-"
# process: each pod is a local vLLM and sidecar process (fleet.Pod); podman: each pod is the
# chart's rendered pod run from the images by `podman kube play` (podman_fleet.PodmanPod).
Runtime = Literal["process", "podman"]


@dataclass(frozen=True)
class RolloutConfig:
    pod: PodRun  # the model, the chart and where results go (shared with overload and soak)
    replicas: int = 2
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
    runtime: Runtime = "process"
    front: FrontKind = "haproxy"  # what takes the load: a Service (HAProxy) or vLLM's router
    router_policy: str | None = None  # the router's --policy; None: the chart's router.policy
    pd_pool: PDPool | None = None  # P/D: the pool that rolls (the other runs one pod)


def _say(message: str) -> None:
    print(f"ministream-loadtest rollout: {message}", file=sys.stderr, flush=True)


class Rollout:
    """Runs the plan (rollout_plan.py) on a fleet and hands what it saw to the report builder
    (rollout_report.py). Everything it starts is stopped in one place, `_teardown`."""

    def __init__(self, cfg: RolloutConfig) -> None:
        if cfg.replicas < 1:
            raise ValueError("--replicas must be at least 1")
        self.cfg = cfg
        run = cfg.pod
        if cfg.pd_pool and (cfg.front != "router" or cfg.runtime != "process"):
            raise ValueError("--pd-pool needs --front router and --runtime process")
        if cfg.front == "router":
            from .router_front import require_router

            require_router()  # before any pod starts
        sets: dict[str, Any] = front_chart_values(cfg.front, cfg.router_policy)
        if cfg.rollout_mode:
            sets["rollout.mode"] = cfg.rollout_mode
        if cfg.pd_pool:
            sets.update(pd_chart_values(cfg.pd_pool, cfg.replicas))
        if cfg.runtime == "podman":
            from .podman_fleet import podman_chart_values

            sets.update(podman_chart_values(run.model, run.served_name, run.vllm_args, {}))
        self.chart = run.render(sets, pool=cfg.pd_pool)
        self.mode: RolloutMode = self.chart.rollout_mode
        self.restarts = cfg.replicas if cfg.restarts is None else cfg.restarts
        if not 1 <= self.restarts <= cfg.replicas:
            raise ValueError(f"--restarts must be between 1 and --replicas ({cfg.replicas})")
        self.controls = cfg.control_restarts if cfg.drain else self.restarts
        if not 0 <= self.controls <= self.restarts:
            raise ValueError(
                f"--control-restarts must be between 0 and --restarts ({self.restarts})"
            )
        self.plan = replacement_plan(
            self.restarts, self.controls, cfg.endpoint_lag, cfg.control_endpoint_lag
        )
        self.workdir = run.work_dir("-artifacts")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.fleet: ProcessFleet | PodmanFleet
        if cfg.runtime == "podman":
            from .podman_fleet import PodmanFleet

            self.fleet = PodmanFleet(
                run.chart, run.chart_values, {**run.chart_sets, **sets}, run.helm, self.workdir
            )
        else:
            self.fleet = ProcessFleet(loopback=cfg.pd_pool is not None)
        n_slots = cfg.replicas + (1 if self.mode == "surge" else 0)
        self.template = run.template(self.chart, self.workdir / "pods")
        # P/D: the other pool's pods, in slots of their own that never roll.
        self.pools: PoolSlots | None = None
        self.fixed_template = self.template
        if cfg.pd_pool:
            self.pools = pool_slots(cfg.pd_pool, n_slots)
            fixed_chart = run.render(sets, pool=other_pool(cfg.pd_pool))
            self.fixed_template = run.template(fixed_chart, self.workdir / "pods")
            all_slots = self.fleet.slots(self.pools.count)
            self.fixed_slots = [all_slots[i] for i in self.pools.fixed]
            self.slots = [all_slots[i] for i in self.pools.rolling]
        else:
            self.fixed_slots = []
            self.slots = self.fleet.slots(n_slots)
        self.nixl: NixlSampler | None = None
        self.warm_up: dict[str, Any] | None = None
        self.pods: list[Pod] = []
        self.slot_owner: dict[int, Pod] = {}
        self.released: set[str] = set()  # pods whose endpoint removal has happened
        self.replacements: list[Replacement] = []
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self.t0 = time.perf_counter()  # replaced by the engine's first send
        self.front: Front | None = None
        self.watcher: StateWatcher | None = None
        self._engine: EngineProcess | None = None
        self.records: list[RequestRecord] = []

    def rel(self, t: float) -> float:
        return round(t - self.t0, 3)

    # --- pods and slots -------------------------------------------------------------------
    def _slot_free(self, slot: Slot) -> bool:
        owner = self.slot_owner.get(slot.index)
        return owner is None or (
            owner.exited
            and (owner.name in self.released or math.isinf(self._endpoint_lag(owner.name)))
        )

    def _endpoint_lag(self, pod_name: str) -> float:
        """The endpoint lag planned for `pod_name`'s replacement (the default if none)."""
        planned = (rep.endpoint_lag for rep in self.replacements if rep.old == pod_name)
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
        assert self.front is not None
        pod = self.fleet.pod(name, slot, self.template)
        self.pods.append(pod)
        self.slot_owner[slot.index] = pod
        self.front.add_endpoint(slot)
        pod.start()
        _say(f"[{self.rel(pod.events['created']):8.1f}s] pod {name} created in {slot.server}")
        return pod

    def _wait_pod_ready(self, pod: Pod) -> None:
        """Ready = the front routes to it (the readiness probe on /readyz passed): the pod is
        in service."""
        assert self.watcher is not None
        timeout = self.cfg.pod.startup_timeout
        deadline = time.monotonic() + timeout
        pod.wait_ready(timeout)  # the sidecar says ready; now the probe
        while not self.watcher.wait_for(lambda s: s.get(pod.slot.server) == "UP", 1.0):
            pod.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"pod {pod.name} not ready after {timeout}s")
        pod.events["ready"] = time.perf_counter()
        _say(
            f"[{self.rel(pod.events['ready']):8.1f}s] pod {pod.name} ready (in service) after "
            f"{pod.events['ready'] - pod.events['created']:.1f}s"
        )
        time.sleep(self.chart.min_ready_seconds)

    def _terminate_async(self, pod: Pod, drain: bool, endpoint_lag: float) -> None:
        def endpoint_removal() -> None:
            if not math.isinf(endpoint_lag):
                time.sleep(endpoint_lag)
                assert self.front is not None
                self.front.remove_endpoint(pod.slot)
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
            self._teardown()

    def _start_fleet(self) -> list[Pod]:
        """The front with every replica's endpoint, then the replicas, until all are in
        service."""
        slots = [*self.fixed_slots, *self.slots]
        enabled = {s.index for s in [*self.fixed_slots, *self.slots[: self.cfg.replicas]]}
        self.front = open_front(
            self.cfg.front,
            self.workdir,
            slots,
            enabled,
            self.chart,
            discovery="kube-api" if self.pools else "worker-api",
            slot_labels={s.index: self.fixed_template.chart.pod_labels for s in self.fixed_slots},
        )
        self.watcher = StateWatcher(self.front).start()
        pools = f"{self.cfg.pd_pool} pool rolls, " if self.cfg.pd_pool else ""
        _say(
            f"{self.front.name} on {self.front.url}; {len(slots)} slots, {pools}rollout mode "
            f"{self.mode}, {drain_summary(self.restarts, self.controls)}; logs in "
            f"{self.workdir}"
        )
        fixed = [
            self.fleet.pod(self._pod_name(f"v1-{i}", fixed=True), slot, self.fixed_template)
            for i, slot in enumerate(self.fixed_slots)
        ]
        old = []
        for i in range(self.cfg.replicas):
            pod = self.fleet.pod(self._pod_name(f"v1-{i}"), self.slots[i], self.template)
            self.slot_owner[self.slots[i].index] = pod
            old.append(pod)
        for pod in [*fixed, *old]:
            self.pods.append(pod.start())
        for pod in [*fixed, *old]:
            self._wait_pod_ready(pod)
        if self.pools:
            self._warm_up_pd()
        return old

    def _pod_name(self, name: str, fixed: bool = False) -> str:
        """P/D: a pod's name carries its pool (`prefill-v1-0`)."""
        pool = self.cfg.pd_pool
        if pool is None:
            return name
        return f"{other_pool(pool) if fixed else pool}-{name}"

    def _warm_up_pd(self) -> None:
        """Every pod of both pools serves once before the load (each pair's NIXL handshake),
        then the decode pods' NIXL counters are read from here on."""
        running = [p for p in self.pods if not p.exited]

        def counts() -> list[float]:
            return [paired_count(p.pool, scrape(p.api_url)) for p in running]

        ready = counts()

        def warm() -> bool:
            return all(now > then for now, then in zip(counts(), ready, strict=True))

        self.warm_up = warm_up(
            self.front_url, self.cfg.pod.served_name, self.cfg.input_tokens, warm, 8 * len(running)
        )
        _say(f"P/D fleet warm: {self.warm_up['sent']} requests ({self.warm_up['failed']} failed)")
        self.nixl = NixlSampler(lambda: running_pd_pods(self.pods))
        self.nixl.baseline()
        self.nixl.start()

    @property
    def front_url(self) -> str:
        assert self.front is not None
        return self.front.url

    def _load_spec(self, duration: float) -> LoadSpec:
        cfg, run = self.cfg, self.cfg.pod
        assert self.front is not None
        return LoadSpec(
            base_url=self.front.url,
            model=run.served_name,
            tokenizer=run.tokenizer_path,
            api="completions",
            input_tokens=cfg.input_tokens,
            output_tokens=cfg.output_tokens,
            range_ratio=0.0,
            num_prompts=max(1, math.ceil(cfg.rate * duration)),
            request_rate=cfg.rate,
            seed=run.seed,
            temperature=0.0,
            request_id_prefix=REQUEST_ID_PREFIX,
            label="rollout",
        )

    def _replace_all(self, old: list[Pod]) -> tuple[float, float]:
        """Replace the first `restarts` old pods as the chart's rollout mode does; (start, end)."""
        timeout = self.cfg.pod.startup_timeout
        t_start = time.perf_counter()
        for i, (drain, lag) in enumerate(self.plan):
            old_pod, new_name = old[i], self._pod_name(f"v2-{i}")
            start = t_start if i == 0 else time.perf_counter()
            self.replacements.append(Replacement(old_pod.name, new_name, drain, lag, start))
            if self.mode == "surge":
                new = self._create_pod(new_name, self._wait_free_slot(timeout))
                self._wait_pod_ready(new)
                self._terminate_async(old_pod, drain, lag)
            else:
                self._terminate_async(old_pod, drain, lag)
                new = self._create_pod(new_name, self._wait_free_slot(timeout))
                self._wait_pod_ready(new)
        for thread in self.threads:
            while thread.is_alive():
                thread.join(1.0)
        self._raise_thread_errors()
        return t_start, time.perf_counter()

    def _run(self) -> dict[str, Any]:
        cfg = self.cfg
        old = self._start_fleet()
        cold = max(p.events["ready"] - p.events["created"] for p in old)
        duration = cfg.duration or max_load_seconds(
            self.chart, self.restarts, cfg.pod.startup_timeout, cfg.lead_in, cfg.tail
        )
        spec = self._load_spec(duration)
        engine = EngineProcess(
            [(spec, self.workdir / "engine-result.json")], self.workdir / "engine.log"
        )
        self._engine = engine.start()
        _say(
            f"all {len(old) + len(self.fixed_slots)} pods ready (cold start {cold:.1f}s); "
            f"load: {cfg.rate:g} requests/s through {ENGINE_NAME} until {cfg.tail:g}s after "
            f"the rollout (at most {spec.num_prompts} requests)"
        )
        self.t0 = engine.wait_main_run(timeout=900)
        time.sleep(cfg.lead_in)
        t_start, t_end = self._replace_all(old)
        _say(
            f"[{self.rel(t_end):8.1f}s] rollout finished in {t_end - t_start:.1f}s; "
            f"{cfg.tail:g}s more load"
        )
        time.sleep(cfg.tail)
        engine.stop_arrivals()
        result = engine.wait(timeout=900)[0]
        pd = self._pd_report()
        self._stop_load_balancer()  # flushes HAProxy's access log, reads the router's counters
        assert self.front is not None and self.watcher is not None
        self.records = load_records(
            result, request_id_prefix=REQUEST_ID_PREFIX, expected_output_len=spec.output_tokens
        )
        facts = RolloutFacts(
            records=self.records,
            access=self.front.access_log(),
            front=self.front.describe(self.t0),
            pods=[_snapshot(p) for p in self.pods],
            replacements=self.replacements,
            t0=self.t0,
            t_start=t_start,
            t_end=t_end,
            lb_changes=self.watcher.changes,
            engine_result=result,
            load={
                "engine": ENGINE_NAME,
                "engine_version": vllm_version(),
                "api": spec.api,
                "request_rate": spec.request_rate,
                "max_requests": spec.num_prompts,
                "max_duration_s": round(duration, 1),
                "input_tokens": spec.input_tokens,
                "output_tokens": spec.output_tokens,
                "raw_result": str(self.workdir / "engine-result.json"),
            },
            settings=self._settings(),
            cold_start_s=cold,
            extra={
                "chart_pod": self.chart.as_dict(),
                "runtime": self.fleet.describe(),
                "config": self._config(),
                "artifacts_dir": str(self.workdir),
                **({"pd": pd} if pd else {}),
            },
        )
        return build_report(facts)

    def _pd_report(self) -> dict[str, Any] | None:
        """P/D: the rolled pool, each pool's pods, the warm-up and the pods' NIXL counts over
        the load."""
        if self.cfg.pd_pool is None or self.nixl is None:
            return None
        pools: dict[str, list[str]] = {}
        for pod in self.pods:
            pools.setdefault(str(pod.pool), []).append(pod.name)
        return {
            "rolled_pool": self.cfg.pd_pool,
            "pods_by_pool": pools,
            "warm_up": self.warm_up,
            "nixl": self.nixl.stop(),
        }

    def _settings(self) -> dict[str, Any]:
        lag = self.cfg.endpoint_lag
        return {
            "pd_pool": self.cfg.pd_pool,
            "drain": self.controls == 0,  # every replacement drained
            "control_restarts": self.controls,
            "rollout_mode": self.mode,
            "replicas": self.cfg.replicas,
            "restarts": self.restarts,
            "endpoint_lag_s": None if math.isinf(lag) else lag,
        }

    def _config(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            **cfg.pod.as_report(),
            **{k: getattr(cfg, k) for k in cfg.__dataclass_fields__ if k != "pod"},
        }

    # --- stopping -------------------------------------------------------------------------
    def _stop_load_balancer(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self.front is not None:
            self.front.stop()

    def _teardown(self) -> None:
        """Stop everything this run started, whatever state it is in (idempotent)."""
        if self._engine is not None:
            self._engine.kill()
        if self.nixl is not None:
            self.nixl.stop()
        for pod in self.pods:
            pod.kill()
        self.fleet.close()
        self._stop_load_balancer()


def _snapshot(pod: Pod) -> PodSnapshot:
    return PodSnapshot(
        name=pod.name,
        server=pod.slot.server,
        pool=pod.pool,
        events=dict(pod.events),
        prestop=pod.prestop,
        exit_code=pod.exit_code,
        killed=pod.killed,
    )


def run_rollout(cfg: RolloutConfig) -> dict[str, Any]:
    """Run the experiment; write the JSON report to the run's output and a timeline PNG
    beside it."""
    from .plots import plot_rollout

    rollout = Rollout(cfg)
    report = rollout.run()
    output = cfg.pod.output
    output.parent.mkdir(parents=True, exist_ok=True)
    report["plot"] = str(
        plot_rollout(report, rollout.records, rollout.t0, output.with_suffix(".png"))
    )
    write_json(output, report)
    return report
