"""The bad-release experiment: `helm upgrade` to a release whose new pod never turns ready,
under load, then `helm rollback`, on the rolling-restart experiment's fleet (`rollout.py`).

Each bad release (`BadKind`) is one pod template that differs from the good one in what an
upgrade would change:
- `missing-model`: the model location names a directory that does not exist;
- `wrong-tp`: a shard set made for another tensor-parallel size (`ministream shard -tp N`),
  loaded with `--load-format sharded_state` (the load guard refuses it);
- `crash`: an engine flag vLLM rejects after it started: `--max-model-len` above the model's
  `max_position_embeddings`, which vLLM's config check refuses.

The upgrade follows the chart's rollout mode as `rollout.py` does (`surge`: the new pod
starts in the spare slot and no old pod stops until it is ready, so none stops; `inPlace`: one
old pod is drained and stopped first). The bad pod's vLLM exits; the kubelet restarts it with
its crash-loop back-off (10 s doubling to 300 s), replayed here. The stall phase lasts the
Deployment's progressDeadlineSeconds (read from the rendered chart) unless `--stall-seconds`
shortens it; then the Deployment would report Progressing=False/ProgressDeadlineExceeded.
The rollback stops the bad pod (preStop, SIGTERM, as the Deployment's scale-down does) and, in
`inPlace` mode, starts a good pod in the freed slot. Old pods must stay in service throughout.

Both runtimes of `rollout.py` run it: what differs between them (how a bad pod is made, how
its vLLM's exit is seen and how it is restarted) is behind the fleet's pod (`fleet.Pod`,
`podman_fleet.PodmanPod`: `vllm_exit_code`, `restart_vllm`, `vllm_state`); under podman a
bad template is rendered into the chart's pod through its values (`podman_fleet`).

The report is the rolling-restart report (every request, failures traced to a pod) plus one
entry per bad release: requests sent/failed during its stall and its rollback, the old pods'
restarts and load-balancer state changes, the first failed start and the deadline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, get_args

from ministream_testkit.results import write_json

from .fleet import Pod, PodTemplate
from .records import RequestRecord, failure_counts
from .rollout import Rollout, RolloutConfig
from .rollout_plan import Replacement

BadKind = Literal["missing-model", "wrong-tp", "crash"]
BAD_KINDS: tuple[BadKind, ...] = get_args(BadKind)
# The kubelet's crash-loop back-off (pkg/kubelet: 10 s initial, doubling, 5 min cap).
BACKOFF_INITIAL_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 300.0
_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class BadReleaseConfig:
    rollout: RolloutConfig  # the fleet, load and chart (restarts and drain are not used)
    kinds: tuple[BadKind, ...] = BAD_KINDS
    shards: str | None = None  # wrong-tp: a shard set made for another TP than the pods'
    stall_seconds: float | None = None  # None: the rendered progressDeadlineSeconds


def _say(message: str) -> None:
    print(f"ministream-loadtest bad-release: {message}", file=sys.stderr, flush=True)


def bad_template(kind: BadKind, good: PodTemplate, shards: str | None) -> PodTemplate:
    """The pod template of a bad release of `kind`: the good one with what the upgrade
    changed. Raises ValueError naming what is missing to make it."""
    if kind == "missing-model":
        missing = Path(good.model).with_name(Path(good.model).name + "-missing")
        if missing.exists():
            raise ValueError(f"missing-model: {missing} exists; remove it or rename the model")
        return dataclasses.replace(good, model=str(missing))
    if kind == "wrong-tp":
        if not shards:
            raise ValueError(
                "wrong-tp needs --shards DIR: a shard set made for another tensor-parallel "
                "size than the pods' (`ministream shard --model MODEL -tp 2 --output DIR`)"
            )
        if not Path(shards).is_dir():
            raise ValueError(f"--shards {shards}: no such directory")
        return dataclasses.replace(
            good, model=shards, vllm_args=(*good.vllm_args, "--load-format", "sharded_state")
        )
    config = Path(good.model) / "config.json"
    try:
        max_len = int(json.loads(config.read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(
            f"crash: cannot read max_position_embeddings from {config}: {exc}"
        ) from None
    # Last on the command line, so it wins over the caller's own --max-model-len.
    return dataclasses.replace(
        good, vllm_args=(*good.vllm_args, "--max-model-len", str(2 * max_len))
    )


def sidecar_events(log: Path, wall_t0: float) -> list[dict[str, Any]]:
    """The Events the pod's sidecar recorded (its events feature logs each one; outside a
    cluster it only logs them), as seconds after the run's t0 (`wall_t0`, wall clock)."""
    events = []
    with contextlib.suppress(FileNotFoundError):
        for line in log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and entry.get("message") == "event":
                    t = datetime.fromisoformat(entry["time"]).timestamp()
                    events.append(
                        {
                            "t_s": round(t - wall_t0, 3),
                            "reason": entry.get("reason"),
                            "type": entry.get("event_type"),
                            "message": entry.get("event_message"),
                        }
                    )
    return events


def window(records: Sequence[RequestRecord], start: float, end: float, t0: float) -> dict[str, Any]:
    """Requests sent in [start, end): counts and causes (times as seconds after t0)."""
    sent = [r for r in records if start <= r.start < end]
    return {
        "start_s": round(start - t0, 3),
        "end_s": round(end - t0, 3),
        "sent": len(sent),
        "failed": sum(not r.ok for r in sent),
        "failures_by_cause": failure_counts(sent),
    }


@dataclass
class CrashLoop:
    """The kubelet's restarts of a bad pod's vLLM container, with their back-off."""

    pod: Pod
    failed_starts: list[float] = dataclasses.field(default_factory=list)
    restart_at: float | None = None

    def poll(self, now: float) -> None:
        if self.restart_at is None and self.pod.vllm_exit_code() is not None:
            self.failed_starts.append(now)
            backoff = BACKOFF_INITIAL_SECONDS * 2 ** (len(self.failed_starts) - 1)
            self.restart_at = now + min(backoff, BACKOFF_MAX_SECONDS)
        elif self.restart_at is not None and now >= self.restart_at:
            self.pod.restart_vllm(len(self.failed_starts))
            self.restart_at = None


class BadRelease(Rollout):
    """The rollout's fleet and load; `_replace_all` runs the bad releases and their
    rollbacks instead of a rollout."""

    def __init__(self, cfg: BadReleaseConfig) -> None:
        super().__init__(dataclasses.replace(cfg.rollout, restarts=1))
        if not cfg.kinds:
            raise ValueError("name at least one --kind")
        self.bad_cfg = cfg
        self.bad = {k: bad_template(k, self.template, cfg.shards) for k in cfg.kinds}
        deadline = self.chart.progress_deadline_seconds
        self.stall_seconds = deadline if cfg.stall_seconds is None else cfg.stall_seconds
        if not 0 <= self.stall_seconds <= deadline:
            raise ValueError(
                f"--stall-seconds must be between 0 and the progress deadline ({deadline} s)"
            )
        if cfg.rollout.duration is None:  # room for every stall and rollback at its longest
            per_release = (
                self.chart.progress_deadline_seconds
                + self.chart.termination_grace_period_seconds
                + 2 * self.chart.readiness_probe.period_seconds
                + (self.cfg.pod.startup_timeout if self.mode == "inPlace" else 0)
            )
            self.cfg = dataclasses.replace(
                self.cfg,
                duration=self.cfg.lead_in + len(cfg.kinds) * per_release + self.cfg.tail,
            )
        self.phases: list[dict[str, Any]] = []
        self.old: list[Pod] = []

    def _replace_all(self, old: list[Pod]) -> tuple[float, float]:
        self.old = list(old)
        t_start = time.perf_counter()
        for n, kind in enumerate(self.bad_cfg.kinds):
            self.phases.append(self._bad_release(n, kind))
        return t_start, time.perf_counter()

    def _bad_release(self, n: int, kind: BadKind) -> dict[str, Any]:
        timeout = self.cfg.pod.startup_timeout
        lag = self.cfg.endpoint_lag
        upgrade = time.perf_counter()
        stopped = None
        if self.mode == "inPlace":  # maxUnavailable 1: one old pod goes before the new starts
            stopped = self.old.pop(0)
            self._terminate_async(stopped, True, lag)
        name = f"bad-{n}-{kind}"
        self.replacements.append(
            Replacement(stopped.name if stopped else "-", name, True, lag, upgrade)
        )
        bad = self.fleet.pod(name, self._wait_free_slot(timeout), self.bad[kind])
        self.pods.append(bad)
        self.slot_owner[bad.slot.index] = bad
        assert self.front is not None and self.watcher is not None
        self.front.add_endpoint(bad.slot)
        bad.start()
        _say(f"[{self.rel(bad.events['created']):8.1f}s] upgrade to a {kind} release: {name}")
        loop = CrashLoop(bad)
        deadline = upgrade + self.chart.progress_deadline_seconds
        stall_end = upgrade + self.stall_seconds
        ready = None
        while True:
            now = time.perf_counter()
            if now >= deadline or (now >= stall_end and loop.failed_starts):
                break
            self._raise_thread_errors()
            for pod in self.old:
                pod.check_alive()  # an old pod that dies fails the run, with its log
            loop.poll(now)
            if ready is None and self.watcher.current.get(bad.slot.server) == "UP":
                ready = now  # a bad release that turns ready is no bad release: reported
            time.sleep(_POLL_SECONDS)
        stall_seen = time.perf_counter()
        _say(
            f"[{self.rel(stall_seen):8.1f}s] {name}: {len(loop.failed_starts)} failed start(s), "
            f"ready: {ready is not None}; rollback"
        )
        self.replacements.append(Replacement(name, "rollback", True, lag, stall_seen))
        self._terminate_async(bad, True, lag)
        restored = None
        if stopped is not None:  # the rollback brings the stopped replica back
            restored = self.fleet.pod(f"v1-rb-{n}", self._wait_free_slot(timeout), self.template)
            self.pods.append(restored)
            self.slot_owner[restored.slot.index] = restored
            self.front.add_endpoint(restored.slot)
            restored.start()
            self._wait_pod_ready(restored)
            self.old.append(restored)
        self._wait_slot_freed(bad, timeout)
        done = time.perf_counter()
        _say(f"[{self.rel(done):8.1f}s] rollback done in {done - stall_seen:.1f}s")
        return {
            "kind": kind,
            "pod": name,
            "model": self.bad[kind].model,
            "vllm_args": list(self.bad[kind].vllm_args),
            "upgrade": upgrade,
            "stall_seen": stall_seen,
            "rollback_done": done,
            "failed_starts": list(loop.failed_starts),
            "ready": ready,
            "old_pod_stopped": stopped.name if stopped else None,
            "restored": restored.name if restored else None,
        }

    def _wait_slot_freed(self, pod: Pod, timeout: float) -> None:
        end = time.monotonic() + timeout
        while not self._slot_free(pod.slot):
            self._raise_thread_errors()
            if time.monotonic() > end:
                raise TimeoutError(f"pod {pod.name} not gone after {timeout:.0f}s")
            time.sleep(_POLL_SECONDS)

    def _run(self) -> dict[str, Any]:
        report = super()._run()
        t0 = self.t0
        wall_t0 = time.time() - (time.perf_counter() - t0)
        access = (self.front.access_log() if self.front else None) or {}
        releases = []
        for p in self.phases:
            old = [pod for pod in self.old if pod.name not in (p["old_pod_stopped"],)]
            served = {
                pod.name: sum(
                    1
                    for r in self.records
                    if p["upgrade"] <= r.start < p["rollback_done"]
                    and (e := access.get(r.request_id)) is not None
                    and e.server == pod.slot.server
                    and r.ok
                )
                for pod in old
            }
            changes = [
                {"t_s": round(t - t0, 3), "server": s, "from": a, "to": b}
                for t, s, a, b in self.watcher.changes  # type: ignore[union-attr]
                if p["upgrade"] <= t <= p["rollback_done"] and s in {pod.slot.server for pod in old}
            ]
            first = p["failed_starts"][0] if p["failed_starts"] else None
            releases.append(
                {
                    "kind": p["kind"],
                    "pod": p["pod"],
                    "model": p["model"],
                    "vllm_args": p["vllm_args"],
                    "stall": window(self.records, p["upgrade"], p["stall_seen"], t0),
                    "rollback": {
                        **window(self.records, p["stall_seen"], p["rollback_done"], t0),
                        "duration_s": round(p["rollback_done"] - p["stall_seen"], 3),
                    },
                    "became_ready": p["ready"] is not None,
                    "first_failed_start_s": None
                    if first is None
                    else round(first - p["upgrade"], 3),
                    "failed_starts": len(p["failed_starts"]),
                    "progress_deadline_s": self.chart.progress_deadline_seconds,
                    "stall_observed_s": round(p["stall_seen"] - p["upgrade"], 3),
                    "progress_deadline_replayed": p["stall_seen"] - p["upgrade"]
                    >= self.chart.progress_deadline_seconds,
                    "old_pods_served": served,
                    "old_pods_lb_changes": changes,
                    "old_pod_stopped": p["old_pod_stopped"],
                    "restored": p["restored"],
                    "sidecar_events": sidecar_events(
                        self.template.log_dir / f"{p['pod']}-sidecar.log", wall_t0
                    ),
                }
            )
        # The old pods' vLLM processes, started once: still the same, still running.
        old_pods = {pod.name: pod.vllm_state() for pod in self.old}
        report["bad_releases"] = releases
        report["old_pods"] = old_pods
        report["stall_seconds"] = self.stall_seconds
        report["goal_met"] = (
            report["failed"] == 0
            and all(not r["became_ready"] and r["failed_starts"] > 0 for r in releases)
            and all(not r["old_pods_lb_changes"] for r in releases)
            and all(all(v > 0 for v in r["old_pods_served"].values()) for r in releases)
        )
        return report


def run_bad_release(cfg: BadReleaseConfig) -> dict[str, Any]:
    """Run the experiment; write the JSON report to the run's output."""
    report = BadRelease(cfg).run()
    output = cfg.rollout.pod.output
    output.parent.mkdir(parents=True, exist_ok=True)
    write_json(output, report)
    return report


def table(report: dict[str, Any]) -> str:
    """One line per bad release: the figures docs/benchmarks.md shows."""
    head = (
        f"{'kind':<14} {'sent':>5} {'failed':>6} {'1st failed start s':>18} "
        f"{'stall observed s':>16} {'deadline s':>10} {'old pods ok':>11} "
        f"{'rollback sent/failed':>20} {'rollback s':>10}"
    )
    lines = [head]
    for r in report["bad_releases"]:
        ok = not r["old_pods_lb_changes"] and all(v > 0 for v in r["old_pods_served"].values())
        lines.append(
            f"{r['kind']:<14} {r['stall']['sent']:>5} {r['stall']['failed']:>6} "
            f"{r['first_failed_start_s']!s:>18} {r['stall_observed_s']:>16} "
            f"{r['progress_deadline_s']:>10} {'yes' if ok else 'NO':>11} "
            f"{str(r['rollback']['sent']) + '/' + str(r['rollback']['failed']):>20} "
            f"{r['rollback']['duration_s']:>10}"
        )
    return "\n".join(lines)
