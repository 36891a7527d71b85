"""The sidecar's HTTP surface and state rules, against `FakeVLLM` (no engine needed).

The fake stands in for vLLM here because these tests are about the sidecar's own rules
(tokens, readiness reasons, retries, thresholds, drain timing) and need upstream behaviour
a real engine cannot be told to show on demand (fail /health, report 2 running requests).
The same behaviours against the real CPU engine are in test_sidecar_vllm.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from sidecarkit import FakeVLLM, SidecarFactory, SidecarThread, sample

from ministream_sidecar.events import EventReason, EventType
from ministream_testkit.waiting import wait_until

# Each test runs the sidecar under uvicorn on a loopback port.
pytestmark = pytest.mark.network


class RecordingEvents:
    def __init__(self) -> None:
        self.events: list[tuple[EventReason, EventType, str]] = []

    def emit(self, reason: EventReason, message: str, type_: EventType = EventType.NORMAL) -> None:
        self.events.append((reason, type_, message))

    async def aclose(self) -> None:
        return None

    @property
    def reasons(self) -> list[EventReason]:
        return [reason for reason, _, _ in self.events]


def with_fake(
    start_sidecar: SidecarFactory, fake: FakeVLLM, events: Any = None, **overrides: Any
) -> SidecarThread:
    app_kwargs: dict[str, Any] = {"transport": fake.transport()}
    if events is not None:
        app_kwargs["event_recorder"] = events
    return start_sidecar(
        app_kwargs=app_kwargs, vllm_url="http://fake-vllm:8000", drain_idle_polls=1, **overrides
    )


@pytest.mark.parametrize("path", ["/warmup", "/drain"])
def test_token_missing_is_401_wrong_is_403(start_sidecar: SidecarFactory, path: str) -> None:
    sidecar = with_fake(start_sidecar, FakeVLLM(), token="s3cret")
    missing = sidecar.post(path)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["type"] == "token_missing"
    assert sidecar.post(path, headers={"Authorization": "Basic czNjcmV0"}).status_code == 401
    wrong = sidecar.post(path, headers={"Authorization": "Bearer s3cre"})
    assert wrong.status_code == 403
    assert wrong.json()["error"]["type"] == "token_invalid"
    assert sidecar.post(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_no_token_configured_means_open_and_probes_are_never_guarded(
    start_sidecar: SidecarFactory,
) -> None:
    sidecar = with_fake(start_sidecar, FakeVLLM(), warmup_on_start=False)
    assert sidecar.post("/warmup").status_code == 200
    guarded = with_fake(start_sidecar, FakeVLLM(), token="t")
    for path in ("/livez", "/readyz", "/metrics"):
        assert guarded.get(path).status_code in (200, 503)  # never 401/403


def test_api_key_is_sent_to_vllm(start_sidecar: SidecarFactory) -> None:
    fake = FakeVLLM()
    sidecar = with_fake(start_sidecar, fake, api_key="vllm-key", warmup_on_start=False)
    assert sidecar.post("/warmup").status_code == 200
    assert fake.seen_auth and set(fake.seen_auth) == {"Bearer vllm-key"}


def test_readiness_reasons_follow_health_warmup_and_drain(start_sidecar: SidecarFactory) -> None:
    fake = FakeVLLM(healthy=False)
    sidecar = with_fake(start_sidecar, fake, warmup_on_start=False)
    body = sidecar.get("/readyz").json()
    assert body["reasons"] == ["upstream_unhealthy", "warmup_pending"]
    assert sidecar.post("/warmup").status_code == 503  # vLLM not healthy: nothing to warm

    fake.healthy = True
    wait_until(lambda: sidecar.get("/readyz").json()["upstream_up"], 10, what="upstream up")
    assert sidecar.get("/readyz").json()["reasons"] == ["warmup_pending"]
    assert sidecar.post("/warmup").json()["succeeded"]
    assert sidecar.get("/readyz").status_code == 200

    fake.healthy = False  # /readyz checks vLLM itself: unready at this very probe
    dead = sidecar.get("/readyz")
    assert dead.status_code == 503
    assert dead.json()["reasons"] == ["upstream_unhealthy"]
    fake.healthy = True
    wait_until(sidecar.ready, 10, what="ready again")

    assert sidecar.post("/drain").json()["outcome"] == "idle"
    assert sidecar.get("/readyz").json()["reasons"] == ["draining"]
    assert sidecar.post("/warmup").status_code == 409  # a draining pod is never warmed again


def test_warmup_is_shared_and_idempotent(start_sidecar: SidecarFactory) -> None:
    fake = FakeVLLM()
    events = RecordingEvents()
    sidecar = with_fake(start_sidecar, fake, events, warmup_on_start=False, warmup_requests=6)
    wait_until(lambda: sidecar.get("/readyz").json()["upstream_up"], 10, what="upstream up")
    results: list[httpx.Response] = []
    callers = [
        threading.Thread(target=lambda: results.append(sidecar.post("/warmup"))) for _ in range(3)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert [r.status_code for r in results] == [200, 200, 200]
    assert fake.completions == 6  # one run, shared by the three callers
    again = sidecar.post("/warmup").json()
    assert again["succeeded"] and not again["ran"]
    assert fake.completions == 6
    assert events.reasons == [EventReason.WARMUP_SUCCEEDED]


def test_warmup_retries_with_backoff_stays_unready_and_counts(
    start_sidecar: SidecarFactory,
) -> None:
    fake = FakeVLLM(completion_status=400)
    events = RecordingEvents()
    sidecar = with_fake(
        start_sidecar,
        fake,
        events,
        warmup_max_attempts=3,
        warmup_requests=2,
        warmup_backoff_initial_seconds=0.2,
        warmup_backoff_max_seconds=0.3,
    )
    wait_until(
        lambda: sidecar.get("/readyz").json()["warmup"] == "failed", 20, what="warmup failed"
    )
    assert sidecar.get("/readyz").json()["reasons"] == ["warmup_failed"]
    assert fake.completions == 6  # 3 attempts x 2 requests
    text = sidecar.metrics()
    assert sample(text, "ministream_warmup_requests_total", outcome="failure") == 6
    assert sample(text, "ministream_warmup_runs_total", outcome="failure") == 1
    assert sample(text, "ministream_ready") == 0
    assert events.events[-1][:2] == (EventReason.WARMUP_FAILED, EventType.WARNING)

    started = time.monotonic()
    failed = sidecar.post("/warmup")  # an explicit call runs again (0.2 s + 0.3 s backoff)
    assert failed.status_code == 503
    assert failed.json()["error"]["details"]["attempts"] == 3
    assert time.monotonic() - started >= 0.5
    fake.completion_status = 200
    assert sidecar.post("/warmup").json()["succeeded"]
    assert sidecar.ready()


def test_drain_flips_readiness_at_once_and_waits_for_idle(start_sidecar: SidecarFactory) -> None:
    fake = FakeVLLM()
    events = RecordingEvents()
    sidecar = with_fake(start_sidecar, fake, events, drain_poll_interval_seconds=0.05)
    wait_until(sidecar.ready, 10, what="ready")
    fake.running, fake.waiting = 2, 1
    answer: list[httpx.Response] = []
    drainer = threading.Thread(target=lambda: answer.append(sidecar.post("/drain")))
    drainer.start()
    wait_until(lambda: sidecar.get("/readyz").status_code == 503, 2, 0.01, what="unready")
    unready_at = time.monotonic()  # the drain began before this
    assert sample(sidecar.metrics(), "ministream_draining") == 1
    busy_polls = fake.metrics_polls + 3
    wait_until(lambda: fake.metrics_polls >= busy_polls, 10, 0.01, what="three busy drain polls")
    assert drainer.is_alive()  # it saw 2 running, 1 waiting three times, and still waits
    fake.running, fake.waiting = 0, 0
    idle_at = time.monotonic()  # the drain cannot end idle before this
    drainer.join(5)
    body = answer[0].json()
    assert body["outcome"] == "idle" and body["running"] == 0 and body["waiting"] == 0
    assert body["duration_seconds"] >= idle_at - unready_at - 0.001  # reported in whole ms
    assert events.reasons[-2:] == [EventReason.DRAIN_STARTED, EventReason.DRAIN_FINISHED]
    assert sample(sidecar.metrics(), "ministream_drains_total", outcome="idle") == 1


def test_drain_times_out_and_reports_what_it_saw(start_sidecar: SidecarFactory) -> None:
    fake = FakeVLLM(running=3)
    sidecar = with_fake(start_sidecar, fake, drain_poll_interval_seconds=0.05)
    body = sidecar.post("/drain", params={"timeout_seconds": 0.4}).json()
    assert body["outcome"] == "timeout"
    assert (body["running"], body["waiting"]) == (3, 0)
    # vLLM never goes idle here: the drain returned because of its timeout, not before it.
    assert body["duration_seconds"] >= 0.4
    assert sample(sidecar.metrics(), "ministream_drains_total", outcome="timeout") == 1


def test_drain_waits_for_a_request_vllms_engine_gauges_do_not_show(
    start_sidecar: SidecarFactory,
) -> None:
    """vLLM's HTTP server holds a request its engine core has not scheduled (or whose response
    it is still writing): the gauges say idle, GET /load says 1. The drain must wait for it;
    SIGTERM would cut it (docs/sidecar.md#what-the-drain-counts)."""
    fake = FakeVLLM(in_flight=1)
    sidecar = with_fake(start_sidecar, fake, drain_poll_interval_seconds=0.05)
    wait_until(sidecar.ready, 10, what="ready")
    body = sidecar.post("/drain", params={"timeout_seconds": 0.4}).json()
    assert body["outcome"] == "timeout", body
    assert (body["running"], body["waiting"], body["in_flight"]) == (0, 0, 1)
    fake.in_flight = 0
    body = sidecar.post("/drain", params={"timeout_seconds": 5}).json()
    assert body["outcome"] == "idle" and body["in_flight"] == 0


def test_drain_without_vllms_load_endpoint_counts_the_gauges_alone(
    start_sidecar: SidecarFactory,
) -> None:
    """A vLLM without /load (older than the sidecar's pinned one): the gauges decide, as before."""
    fake = FakeVLLM(in_flight=None)
    sidecar = with_fake(start_sidecar, fake, drain_poll_interval_seconds=0.05)
    body = sidecar.post("/drain", params={"timeout_seconds": 5}).json()
    assert body["outcome"] == "idle" and body["in_flight"] is None and body["scrape_errors"] == 0


def test_drain_of_a_pod_whose_vllm_never_came_up_ends_at_once(
    start_sidecar: SidecarFactory,
) -> None:
    """A bad release: vLLM never answers, so the pod never took a request; the drain must not
    hold the pod for its whole timeout (it did, 60 s a rollback, before `never_up`)."""
    fake = FakeVLLM(healthy=False)
    events = RecordingEvents()
    sidecar = with_fake(start_sidecar, fake, events, drain_poll_interval_seconds=0.05)
    body = sidecar.post("/drain", params={"timeout_seconds": 300}).json()
    assert body["outcome"] == "never_up" and body["scrape_errors"] == 1
    assert events.reasons[-2:] == [EventReason.DRAIN_STARTED, EventReason.DRAIN_FINISHED]
    assert sample(sidecar.metrics(), "ministream_drains_total", outcome="never_up") == 1


def test_drain_waits_when_a_vllm_that_served_stops_answering(
    start_sidecar: SidecarFactory,
) -> None:
    """Once vLLM has been up, unreadable metrics may hide requests in flight: wait as before."""
    fake = FakeVLLM()
    sidecar = with_fake(start_sidecar, fake, drain_poll_interval_seconds=0.05)
    wait_until(sidecar.ready, 10, what="ready")
    fake.healthy = False
    body = sidecar.post("/drain", params={"timeout_seconds": 0.4}).json()
    assert body["outcome"] == "timeout" and body["scrape_errors"] >= 2


def test_liveness_fails_after_threshold_and_a_restarted_vllm_is_warmed_again(
    start_sidecar: SidecarFactory,
) -> None:
    fake = FakeVLLM()
    sidecar = with_fake(
        start_sidecar, fake, health_interval_seconds=0.1, liveness_failure_threshold=3
    )
    wait_until(sidecar.ready, 10, what="ready")
    assert fake.completions == 4
    fake.healthy = False
    wait_until(lambda: sidecar.get("/livez").status_code == 503, 5, what="livez 503")
    assert sidecar.get("/livez").json()["consecutive_upstream_failures"] >= 3
    fake.healthy = True  # the kubelet restarted vLLM: a cold process
    wait_until(sidecar.ready, 10, what="ready after restart")
    assert sidecar.get("/livez").status_code == 200
    assert fake.completions == 8  # warmed up again


def saturated(start_sidecar: SidecarFactory) -> tuple[FakeVLLM, SidecarThread]:
    """A ready sidecar whose vLLM then stops answering /health while tokens flow."""
    fake = FakeVLLM()
    sidecar = with_fake(
        start_sidecar,
        fake,
        health_interval_seconds=0.05,
        liveness_failure_threshold=2,
        progress_window_seconds=0.05,
    )
    wait_until(sidecar.ready, 10, what="ready")
    fake.health_stalls, fake.generating = True, True
    return fake, sidecar


def test_saturated_vllm_is_busy_not_dead_and_stays_ready(start_sidecar: SidecarFactory) -> None:
    """/health times out while tokens flow: neither liveness nor readiness fails."""
    _, sidecar = saturated(start_sidecar)
    seen: list[tuple[int, int]] = []

    def busy_checks() -> float:
        seen.append((sidecar.get("/livez").status_code, sidecar.get("/readyz").status_code))
        return sample(sidecar.metrics(), "ministream_upstream_busy_checks_total")

    wait_until(lambda: busy_checks() >= 5, 10, 0.02, what="five busy checks")
    assert set(seen) == {(200, 200)}, seen  # probes taken all along: never a flip
    assert sample(sidecar.metrics(), "ministream_upstream_health_failures_total") == 0


def test_hung_vllm_fails_liveness_though_it_was_busy_before(
    start_sidecar: SidecarFactory,
) -> None:
    """The control: /health times out and the counters stand still (a stopped process)."""
    fake, sidecar = saturated(start_sidecar)
    wait_until(
        lambda: sample(sidecar.metrics(), "ministream_upstream_busy_checks_total") >= 1,
        10,
        what="a busy check",
    )
    fake.generating = False  # hung: /metrics still answers, its counters stand still
    wait_until(lambda: sidecar.get("/livez").status_code == 503, 10, what="livez 503")
    assert sidecar.get("/readyz").status_code == 503
    assert sample(sidecar.metrics(), "ministream_upstream_health_failures_total") >= 2
