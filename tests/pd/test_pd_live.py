"""Prefill/decode disaggregation for real: two vLLM CPU replicas of the tiny model with the
chart's NixlConnector configuration (`--kv-transfer-config`, NIXL's and UCX's environment read
from `helm template` of ci/pd-values.yaml) behind the real vllm-router with the chart's P/D
command line, its pool selectors swapped for the two local URLs (no Kubernetes API server runs
here). Each request is prefilled on one replica, whose KV cache the other pulls over NIXL (UCX
over TCP on loopback) before it decodes.

Checked against the colocated server every engine test shares (`vllm_server`): greedy token
ids identical and logprobs within float32 noise, plain and streamed; every transfer counted by
vLLM's own NIXL metrics on the decode replica, none failed; the names the dashboards and the
KV-transfer alerts query are exported; a read of KV whose lease had expired (made to happen by
pausing the decode replica) is counted and logged by the prefill replica. A module of its own:
two engines and a router, started once and shared by its tests in order.

Three tests kill a replica (SIGKILL of its process group, a crashed pod) under a steady
stream of plain and streamed requests and check what the client sees: every request ends
within the deadline, each as an answer identical to the colocated server's or as an error the
client can see (an HTTP error status, a stream ending with an error event or cut short). The
prefill replica dies with requests held at both stages: some inside it (its engine core
paused), some on the decode replica waiting to pull their KV from it (the decode's engine core
paused until the kill, so that every run has both kinds instead of whatever the timing gives).
Under the chart's `kvLoadFailurePolicy` (`fail`) the decode replica fails those and counts the
failed NIXL transfers; restarted with `recompute` (the chart's other value) it answers them.
In three runs of six those pulls hung instead, until UCX reported the peer gone; in the one
such hang seen with the sockets listed, the killed replica's worker process had outlived the
SIGKILL and held them open. The kill now waits until every process is gone and names any
survivor; the hang, and only it, is an expected failure (`PullHung`, docs/fleet.md).
Each killed replica is started again on its ports and the router takes it back. They restart
what they kill, so the fleet stays usable: the fleet's decode replica runs `recompute` after
them, and the last one leaves the prefill replica dead.

Last, a prefill replica stopped as the kubelet stops it (SIGTERM, with the chart's
`--shutdown-timeout`) while the decode replica has yet to pull KV it holds: it stays up until
the pull, and the held requests are answered as the colocated server answers them. It starts
the prefill replica the kill tests left dead, with a KV lease that outlasts the pause it
needs (`KV_LEASE_S`); every other replica runs the chart's.

UCX's transports come from the chart (disaggregation.nixl.ucxTransports, `tcp,self`). What
made early runs stall here was CPU starvation, not the transport: each replica now gets a core
of its own (docs/fleet.md, "Prefill/decode disaggregation").
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from ministream_observability import catalog
from ministream_sidecar.engine_client import LOAD_TRACKING_FLAG
from ministream_testkit.net import free_port
from ministream_testkit.outcomes import (
    Ask,
    Outcome,
    Seen,
    Stream,
    attempt,
    in_flight,
    read_stream,
    sent_after,
)
from ministream_testkit.pd import PD_VALUES, PDEngine, chart_pd_engine, chart_shutdown_timeout
from ministream_testkit.processes import kill_group
from ministream_testkit.router import RouterProcess, chart_router_args
from ministream_testkit.vllm_server import (
    TINY_ENGINE_ARGS,
    VLLMServer,
    engine_core,
    metrics_text,
    server_load,
    sum_samples,
)
from ministream_testkit.waiting import wait_until
from tests.support import tools

pytestmark = [pytest.mark.engine, pytest.mark.network]

# Fixed local ports (NIXL's side channel and UCX's data ports must differ between two replicas
# on one host; in a cluster each pod has its own IP and the chart's fixed ports).
SIDE_CHANNEL = {"prefill": 18500, "decode": 18501}
UCX_PORTS = {"prefill": (18520, 18559), "decode": (18560, 18599)}
# Long enough to fill whole KV blocks: NIXL moves full blocks only.
PROMPTS = (
    "The history of the printing press begins in the fifteenth century, when a goldsmith "
    "in Mainz combined a screw press, oil-based ink and movable metal type into one",
    "A tiny model served by two engines: one computes the prompt, the other pulls its cache "
    "over the network and writes the answer, token after token, until it is done with it",
)
MAX_TOKENS = 8
XFER_COUNT = catalog.NIXL_XFER_TIME.name + "_count"
# vLLM's line when a decode worker read KV blocks after their lease expired
# (kv_connector/v1/nixl/pull_worker.py): the answer then comes from released blocks.
LATE_READ = "Potentially invalid KV blocks"
# The requests a replica ended with finished_reason="error" (its finished-request counter).
ERRORED = "finished_reason=error"
# Tokens of the streams the decode kill cuts: enough that a stream is still going when the
# kill lands after its first token (ignore_eos: the tiny model may stop early otherwise).
LONG_TOKENS = 64
# The chart's other kvLoadFailurePolicy, for the decode replica the last test restarts.
RECOMPUTE = "disaggregation.kvLoadFailurePolicy=recompute"
# One core each: both replicas' OpenMP threads spinning on both cores of a 2-core runner, next
# to NIXL's progress threads, made a first forward pass take minutes here.
CORE = {"prefill": "0", "decode": "1"}
# Hang detector, not a performance bound: a tiny model answers in seconds on an idle runner,
# but the first pass of a fresh engine on a loaded one took over a minute.
DEADLINE = 300.0
# Hang detector of the kill tests: their engines are warm, and every request in flight when a
# replica dies ends within seconds (an answer or an error) unless something waits forever.
KILL_DEADLINE = 120.0
# How long the stopped prefill replica keeps KV nobody pulled (NIXL's kv_lease_duration;
# vLLM's default, 30 s, is the chart's and every other replica's here). A running decode
# replica extends it every lease/6 s; the stop test pauses the decode replica's engine core,
# which stops those heartbeats, and on a loaded runner one such pause outlasted 30 s, so the
# prefill replica released the KV before the test's SIGTERM and the pull failed. Longer for
# that test, so the pause tests the drain and not the lease.
KV_LEASE_S = 300


@dataclass
class PDFleet:
    prefill: VLLMServer
    decode: VLLMServer
    router: RouterProcess
    model: str
    # Each replica's P/D arguments and environment, as the chart rendered them.
    engine: dict[str, PDEngine]
    # A replica of the pool with the engine's arguments (not started); the port: the old
    # replica's when it is started again (the router's URL for it).
    replica: Callable[[str, PDEngine, int | None], VLLMServer]

    def restart(self, pool: str, engine: PDEngine | None = None) -> None:
        """The pool's replica, stopped if it runs, started again on its ports, with `engine`
        (default: the one it had), and the pair's new handshake made."""
        old: VLLMServer = getattr(self, pool)
        old.stop()
        engine = engine or self.engine[pool]
        new = self.replica(pool, engine, old.port)
        setattr(self, pool, new)
        self.engine[pool] = engine
        new.start().wait_healthy()
        self.handshake()

    def handshake(self, attempts: int = 3) -> None:
        """A pair's first request makes NIXL's handshake (the decode replica fetches the
        prefill replica's metadata over the side channel), made here so that the tests count
        only their own transfers; asked again if it fails: vLLM waits 5 s for the side channel
        to answer (`zmq.RCVTIMEO` in its NIXL worker), which a loaded 2-core runner missed
        once; the request then fails with a 500 and the next one handshakes anew. Each failed
        handshake is counted in the decode replica's failed-transfer counter, hence the
        tests' deltas."""
        self.router.wait_workers_healthy(DEADLINE)
        ask = Ask(_body(self.model, PROMPTS[1]))
        for _ in range(attempts):
            outcome = attempt(self.router.url, ask, DEADLINE)
            if outcome.seen is Seen.COMPLETED:
                return
            print(f"P/D handshake request failed ({outcome.label()}), asking again")
        raise AssertionError(f"the pair's first request failed {attempts} times: {outcome}")


@pytest.fixture(scope="module")
def fleet(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PDFleet]:
    tools.python_module("nixl", "NIXL is not installed: run `make setup-test` (the `pd` extra)")
    workdir = tmp_path_factory.mktemp("pd-live")
    starts = itertools.count()
    shutdown_timeout = {pool: str(chart_shutdown_timeout(PD_VALUES, pool)) for pool in CORE}

    def replica(pool: str, engine: PDEngine, port: int | None = None) -> VLLMServer:
        return VLLMServer(
            str(tiny_model_dir),
            workdir / f"{pool}-{next(starts)}.log",
            served_name=vllm_server.served_name,
            # The sidecar starts every pod's vLLM with load tracking (GET /load, its drain
            # counts it): the kill tests wait on it.
            args=[
                *TINY_ENGINE_ARGS,
                *engine.args,
                *("--shutdown-timeout", shutdown_timeout[pool]),
                LOAD_TRACKING_FLAG,
            ],
            env={
                **engine.local_env(SIDE_CHANNEL[pool], UCX_PORTS[pool]),
                "VLLM_CPU_OMP_THREADS_BIND": CORE[pool],
            },
            port=free_port() if port is None else port,
        )

    engine = chart_pd_engine()
    replicas = {pool: replica(pool, engine) for pool in ("prefill", "decode")}
    router: RouterProcess | None = None
    try:
        for r in replicas.values():
            r.start()
        for r in replicas.values():
            r.wait_healthy()
        router = RouterProcess(
            [],
            workdir / "router.log",
            chart_args=chart_router_args(PD_VALUES),
            pd=(replicas["prefill"].url, replicas["decode"].url),
            # The chart's 5 s health-check timeout (three misses eject a worker) is for pods
            # with cores of their own; on the loaded 2-core runner a replica's /health took
            # longer and the router answered 503 "0 decode".
            extra={"health_check_timeout_secs": "60"},
        ).start()
        fleet = PDFleet(
            replicas["prefill"],
            replicas["decode"],
            router,
            vllm_server.served_name,
            {pool: engine for pool in replicas},
            replica,
        )
        fleet.handshake()
        yield fleet
        replicas = {"prefill": fleet.prefill, "decode": fleet.decode}
    finally:
        if router:
            router.stop()
        for r in replicas.values():
            r.stop()


def _leased(engine: PDEngine) -> PDEngine:
    return engine.with_kv_extra(kv_lease_duration=KV_LEASE_S)


def _body(model: str, prompt: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logprobs": 1,
        "return_token_ids": True,
        **extra,
    }


def _complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=DEADLINE)
    assert response.status_code == 200, response.text
    choice: dict[str, Any] = response.json()["choices"][0]
    return choice


def _stream(url: str, body: dict[str, Any]) -> tuple[str, list[int], list[float]]:
    """A streamed completion: its text, token ids and logprobs, joined over the chunks."""
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=DEADLINE
    ) as response:
        assert response.status_code == 200, response.read()
        read = read_stream(response.iter_lines())
    assert read.done and read.error is None, read
    return read.text, read.ids, read.logprobs


def _idle(server: VLLMServer) -> bool:
    page = metrics_text(server.url)
    return sum_samples(page, catalog.RUNNING.name) + sum_samples(page, catalog.WAITING.name) == 0


def _counts(server: VLLMServer) -> dict[str, float]:
    """The replica's transfer, failure and finished-request counters, once it is idle (a
    request the router still has in flight would land in the next test's count)."""
    wait_until(lambda: _idle(server), DEADLINE, 0.5, what=f"no request running at {server.url}")
    page = metrics_text(server.url)
    counts = {
        name: sum_samples(page, name)
        for name in (XFER_COUNT, catalog.NIXL_FAILED.name, catalog.REQUEST_SUCCESS.name)
    }
    counts[ERRORED] = sum_samples(page, catalog.REQUEST_SUCCESS.name, finished_reason="error")
    return counts


def _assert_same_numerics(
    got: tuple[str, list[int], list[float]], want: tuple[str, list[int], list[float]]
) -> None:
    assert got[1] == want[1] and len(got[1]) == MAX_TOKENS, (got[1], want[1])
    assert got[0] == want[0]
    assert got[2] == pytest.approx(want[2], abs=1e-4), (got[2], want[2])


def _numerics(choice: dict[str, Any]) -> tuple[str, list[int], list[float]]:
    return choice["text"], choice["token_ids"], choice["logprobs"]["token_logprobs"]


def test_greedy_answers_match_the_colocated_server_and_each_is_one_transfer(
    fleet: PDFleet, vllm_server: VLLMServer
) -> None:
    fleet.router.wait_workers_healthy(DEADLINE)
    before = {"prefill": _counts(fleet.prefill), "decode": _counts(fleet.decode)}
    for prompt in PROMPTS:
        body = _body(fleet.model, prompt)
        _assert_same_numerics(
            _numerics(_complete(fleet.router.url, body)),
            _numerics(_complete(vllm_server.url, body)),
        )
    after = {"prefill": _counts(fleet.prefill), "decode": _counts(fleet.decode)}
    n = len(PROMPTS)
    # Each request was prefilled on one replica and decoded on the other, whose KV came over
    # NIXL: one transfer per request, observed by the replica that pulled it.
    for pool in ("prefill", "decode"):
        served = (
            after[pool][catalog.REQUEST_SUCCESS.name] - before[pool][catalog.REQUEST_SUCCESS.name]
        )
        assert served == n, (pool, served)
    assert after["decode"][XFER_COUNT] - before["decode"][XFER_COUNT] == n
    assert after["prefill"][XFER_COUNT] == before["prefill"][XFER_COUNT]
    assert after["decode"][catalog.NIXL_FAILED.name] == before["decode"][catalog.NIXL_FAILED.name]


def test_streamed_answer_matches_the_colocated_server(
    fleet: PDFleet, vllm_server: VLLMServer
) -> None:
    fleet.router.wait_workers_healthy(DEADLINE)
    before = _counts(fleet.decode)[XFER_COUNT]
    body = _body(fleet.model, PROMPTS[0])
    _assert_same_numerics(
        _stream(fleet.router.url, body), _numerics(_complete(vllm_server.url, body))
    )
    assert _counts(fleet.decode)[XFER_COUNT] - before == 1


def test_the_dashboards_nixl_series_are_exported(fleet: PDFleet) -> None:
    """The names the dashboards' P/D row and MiniStreamKVTransfersFailing query, in the two
    replicas' scrapes (the decode replica observes transfers, the prefill one expiries)."""
    names = set()
    for server in (fleet.prefill, fleet.decode):
        for line in metrics_text(server.url).splitlines():
            if line and not line.startswith("#"):
                names.add(line.split("{", 1)[0].split(" ", 1)[0])
    assert names >= catalog.PD_ONLY, sorted(catalog.PD_ONLY - names)


def _late_reads(server: VLLMServer) -> tuple[float, float]:
    """The prefill replica's counts of KV it released unfetched and of reads of such KV."""
    page = metrics_text(server.url)
    return (
        sum_samples(page, catalog.NIXL_KV_EXPIRED.name),
        sum_samples(page, catalog.NIXL_LATE_READ.name),
    )


def test_a_read_after_the_lease_expired_is_counted_on_the_prefill_replica(
    fleet: PDFleet,
) -> None:
    """What MiniStreamKVReadAfterLeaseExpired queries, made to happen: the decode replica's
    engine core paused (no pull, no heartbeat) until the prefill replica released a request's
    KV at the end of its lease (the chart's 30 s); resumed, the decode replica reads the
    released blocks anyway, and the prefill replica logs and counts that read. It counts it
    on its next engine step (an idle engine steps for nothing), hence the request after. The
    answer is not judged: nothing reused the released blocks here."""
    fleet.router.wait_workers_healthy(DEADLINE)
    expired, late = _late_reads(fleet.prefill)
    decode_core = engine_core(fleet.decode)
    decode_core.suspend()
    try:
        ask = Ask(_body(fleet.model, PROMPTS[0]))
        held = Stream(fleet.router.url, (ask,), DEADLINE, once=True).start()
        wait_until(
            lambda: _late_reads(fleet.prefill)[0] > expired,
            DEADLINE,
            0.5,
            what="the prefill replica releasing the held request's KV at the end of its lease",
        )
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            decode_core.resume()
    (outcome,) = held.join(DEADLINE)
    assert outcome.seen is Seen.COMPLETED, outcome

    def counted() -> bool:
        _complete(fleet.router.url, _body(fleet.model, PROMPTS[1]))  # a step on each replica
        return _late_reads(fleet.prefill)[1] > late

    wait_until(counted, DEADLINE, 0.5, what="the prefill replica counting the late read")
    assert _late_reads(fleet.prefill)[1] == late + 1
    assert LATE_READ in fleet.prefill.log_path.read_text(errors="replace")


# --- A replica killed mid-load ---------------------------------------------------------------


def _asks(model: str, **extra: Any) -> tuple[Ask, Ask]:
    """A plain and a streamed request, one per prompt."""
    return Ask(_body(model, PROMPTS[0], **extra)), Ask(_body(model, PROMPTS[1], **extra), True)


def _references(server: VLLMServer) -> Callable[[Ask], list[int]]:
    """The colocated server's token ids for an ask's body (asked once per body)."""
    known: dict[str, list[int]] = {}

    def ids(ask: Ask) -> list[int]:
        key = json.dumps(ask.body, sort_keys=True)
        if key not in known:
            known[key] = list(_complete(server.url, ask.body)["token_ids"])
        return known[key]

    return ids


def _judge(outcomes: list[Outcome], reference: Callable[[Ask], list[int]]) -> Counter[str]:
    """Every request ended (none hung), as an answer identical to the colocated server's or
    as an error the client sees, before which no other tokens than the answer's came: the
    counts by what the client saw."""
    for o in outcomes:
        want = reference(o.ask)
        assert o.seen is not Seen.TIMED_OUT, o
        if o.seen is Seen.COMPLETED:
            assert list(o.ids) == want, (o, want)
            continue
        assert list(o.ids) == want[: len(o.ids)], (o, want)
        if o.seen is Seen.HTTP_ERROR:
            assert o.status is not None and o.status >= 500, o
    return Counter(o.label() for o in outcomes)


def _wait_load(server: VLLMServer, n: int) -> None:
    """Until the replica's HTTP server holds `n` requests. A GET /load that outlives its 30 s
    (one did, the replica's engine core paused, on a loaded runner) is asked again."""

    def holds() -> bool:
        try:
            return server_load(server.url) == n
        except httpx.TimeoutException:
            return False

    wait_until(holds, DEADLINE, 0.1, what=f"{n} requests at {server.url}")


def _running(fleet: PDFleet) -> None:
    """Both replicas running: one an earlier kill test left dead (it failed before starting
    it again) is started again, so that each test fails for its own reasons only."""
    for pool in ("prefill", "decode"):
        process = getattr(fleet, pool).process
        if process is None or process.poll() is not None:
            fleet.restart(pool)
    fleet.router.wait_workers_healthy(DEADLINE)


def _readmitted(fleet: PDFleet, reference: Callable[[Ask], list[int]]) -> None:
    """The router routes to both replicas again and answers plain and streamed requests as
    the colocated server does."""
    fleet.router.wait_workers_healthy(DEADLINE)
    for ask in _asks(fleet.model):
        outcome = attempt(fleet.router.url, ask, DEADLINE)
        assert outcome.seen is Seen.COMPLETED and list(outcome.ids) == reference(ask), outcome


@dataclass
class PrefillKill:
    """The prefill replica SIGKILLed with requests held at both stages, and what followed."""

    at_prefill: list[Outcome]  # inside it (its engine core paused)
    at_decode: list[Outcome]  # prefilled, then held on the decode replica before their pull
    steady: list[Outcome]  # the steady stream's, before, at and after the kill
    killed_at: float
    decode: dict[str, float]  # the decode replica's counters, after minus before
    prefill_log: Path  # the killed replica's log
    log_from: int  # its size when the test began: the lines before are earlier tests'

    def on_decode(self) -> list[Outcome]:
        """The requests on the decode replica when the prefill replica died: the held ones
        and the steady stream's in flight (held there too once its engine core paused)."""
        return self.at_decode + in_flight(self.steady, self.killed_at)

    def summary(self) -> str:
        groups = {
            "held in the prefill replica": self.at_prefill,
            "on the decode replica": self.on_decode(),
            "sent after the kill": sent_after(self.steady, self.killed_at),
        }
        return "; ".join(f"{k}: {dict(Counter(o.label() for o in v))}" for k, v in groups.items())


def _hold_and_kill_prefill(
    fleet: PDFleet, asks: tuple[Ask, ...]
) -> tuple[Stream, Stream, float, list[str]]:
    """Pause the decode replica's engine core and send `asks` (prefilled, then held there
    before pulling their KV), pause the prefill replica's and send them again (held inside
    it), SIGKILL the prefill replica, wait until all its processes are gone, resume the
    decode replica. Also returns the processes that outlived the SIGKILL (`kill_group`)."""
    url, cores = fleet.router.url, (engine_core(fleet.decode), engine_core(fleet.prefill))
    cores[0].suspend()
    try:
        at_decode = Stream(url, asks, DEADLINE, once=True).start()
        # The steady stream's clients end there too, one request each.
        _wait_load(fleet.decode, 2 * len(asks))
        cores[1].suspend()
        at_prefill = Stream(url, asks, DEADLINE, once=True).start()
        _wait_load(fleet.prefill, len(asks))
        killed_at = time.monotonic()
        assert fleet.prefill.process is not None
        survivors = kill_group(fleet.prefill.process)
    finally:
        for core in cores:
            with contextlib.suppress(psutil.NoSuchProcess):
                core.resume()
    return at_decode, at_prefill, killed_at, survivors


class PullHung(Exception):
    """The decode replica still waits, KILL_DEADLINE after the kill, on KV it was pulling
    from the dead prefill replica (vLLM's pull has no timeout of its own; it ends when UCX
    reports the peer gone), and so do its clients. The message names the prefill replica's
    processes that outlived the SIGKILL, if any: one that did held the sockets open."""


def _ended(streams: list[Stream], decode: VLLMServer, survivors: list[str]) -> list[list[Outcome]]:
    """Each stream's outcomes, once all its clients stopped and the decode replica is idle;
    PullHung when that is not so KILL_DEADLINE after the kill, or a request went unanswered."""
    deadline = time.monotonic() + KILL_DEADLINE
    alive = f"; outlived the SIGKILL: {survivors or 'none'}"
    try:
        ended = [s.join(max(0.0, deadline - time.monotonic())) for s in streams]
        left = max(1.0, deadline - time.monotonic())
        wait_until(lambda: _idle(decode), left, 0.5, what=f"no request running at {decode.url}")
    except TimeoutError as exc:
        raise PullHung(f"{exc}{alive}") from exc
    hung = [o for outcomes in ended for o in outcomes if o.seen is Seen.TIMED_OUT]
    if hung:
        raise PullHung(f"{len(hung)} unanswered after {KILL_DEADLINE:g} s: {hung}{alive}")
    return ended


def _kill_prefill_mid_load(fleet: PDFleet) -> PrefillKill:
    asks = _asks(fleet.model)
    before = _counts(fleet.decode)
    log_from = fleet.prefill.log_path.stat().st_size
    with Stream(fleet.router.url, asks, KILL_DEADLINE) as steady:
        wait_until(lambda: steady.completed() >= len(asks), DEADLINE, what="steady answers")
        at_decode, at_prefill, killed_at, survivors = _hold_and_kill_prefill(fleet, asks)
        steady.finish_after(killed_at)
        outcomes, held_prefill, held_decode = _ended(
            [steady, at_prefill, at_decode], fleet.decode, survivors
        )
    after = _counts(fleet.decode)
    delta = {name: after[name] - before[name] for name in after}
    return PrefillKill(
        held_prefill, held_decode, outcomes, killed_at, delta, fleet.prefill.log_path, log_from
    )


class LateRead(Exception):
    """A pull that outlived the prefill replica's KV lease read blocks the replica had already
    released: vLLM logs it there ("Potentially invalid KV blocks … were retrieved by a decode
    worker") and the decode replica answers from them anyway, with other tokens than the
    colocated server's (seen in a fresh-clone CI run: a 0.125 MB pull stalled 30 s on the
    loaded runner; docs/fleet.md, "A pull that outlives the lease")."""


def _late_read(kill: PrefillKill, reference: Callable[[Ask], list[int]]) -> None:
    """LateRead when an answer differs from the colocated server's and the prefill replica
    logged a late read during the test; without that line, `_judge` fails the test as it
    should."""
    outcomes = kill.at_prefill + kill.at_decode + kill.steady
    differ = [o for o in outcomes if o.seen is Seen.COMPLETED and list(o.ids) != reference(o.ask)]
    with kill.prefill_log.open("rb") as log:
        log.seek(kill.log_from)
        logged = [
            line for line in log.read().decode(errors="replace").splitlines() if LATE_READ in line
        ]
    if differ and logged:
        raise LateRead(f"{len(differ)} answers differ: {differ}; the prefill replica: {logged}")


def _assert_prefill_kill(
    kill: PrefillKill, policy: str, reference: Callable[[Ask], list[int]]
) -> None:
    _late_read(kill, reference)
    _judge(kill.at_prefill + kill.at_decode + kill.steady, reference)
    # Inside the dead replica, or sent to it afterwards: the router answers with an error.
    for o in kill.at_prefill + sent_after(kill.steady, kill.killed_at):
        assert o.seen is Seen.HTTP_ERROR, o
    failed = [o for o in kill.on_decode() if o.seen is not Seen.COMPLETED]
    # The decode replica counts as errors exactly the failures its clients saw, and a
    # failed NIXL transfer at least for each request whose pull failed (the counter also
    # takes handshake and notification failures: 6 for 4 such requests in one run).
    assert kill.decode[ERRORED] == len(failed), (kill.decode, kill.summary())
    nixl_failed = kill.decode[catalog.NIXL_FAILED.name]
    assert nixl_failed >= max(len(kill.at_decode), len(failed)), kill.decode
    if policy == "fail":
        # vLLM's own error (GenerationError): a 500 when plain, an error event when streamed.
        seen = {(o.ask.streamed, o.seen) for o in kill.at_decode}
        assert seen == {(False, Seen.HTTP_ERROR), (True, Seen.ERROR_EVENT)}, kill.summary()
    else:
        assert not failed, kill.summary()


# Seen in three runs of six: the held requests' pulls neither failed nor finished until a new
# process took the dead replica's ports minutes later; in the one such hang seen since, the
# killed replica's worker process had outlived the SIGKILL (docs/fleet.md, "A replica killed
# mid-load"). That hang, and a late read (LateRead) that vLLM itself logs, are expected;
# any other failure fails the test.
KNOWN_HANG = pytest.mark.xfail(
    raises=(PullHung, LateRead),
    strict=False,
    reason="a KV pull from a SIGKILLed prefill replica can wait until UCX reports it gone; "
    "a pull that stalls past the KV lease reads released blocks (vLLM logs it)",
)


@KNOWN_HANG
def test_prefill_replica_killed_mid_load_under_the_charts_policy(
    fleet: PDFleet, vllm_server: VLLMServer
) -> None:
    """The chart's kvLoadFailurePolicy (`fail`): the decode replica fails the requests whose
    KV died with the prefill replica, the client sees each fail, nothing hangs; the prefill
    replica, started again, is taken back by the router."""
    _running(fleet)
    reference = _references(vllm_server)
    kill = _kill_prefill_mid_load(fleet)
    print(f"prefill killed ({fleet.engine['decode'].kv_load_failure_policy}): {kill.summary()}")
    _assert_prefill_kill(kill, fleet.engine["decode"].kv_load_failure_policy, reference)
    fleet.restart("prefill")
    _readmitted(fleet, reference)


def _kill_decode_mid_stream(fleet: PDFleet) -> tuple[list[Outcome], float]:
    asks = _asks(fleet.model, max_tokens=LONG_TOKENS, ignore_eos=True)
    streams = [i for i, ask in enumerate(asks) if ask.streamed]
    with Stream(fleet.router.url, asks, DEADLINE) as steady:
        wait_until(lambda: steady.completed() >= len(asks), DEADLINE, what="steady answers")
        wait_until(
            lambda: any(0 < steady.tokens[i] < LONG_TOKENS for i in streams),
            DEADLINE,
            0.005,
            what="a stream under way",
        )
        killed_at = time.monotonic()
        assert fleet.decode.process is not None
        if survivors := kill_group(fleet.decode.process):
            print(f"the decode replica's processes that outlived the SIGKILL: {survivors}")
        steady.finish_after(killed_at)
        return steady.join(DEADLINE), killed_at


def test_decode_replica_killed_mid_stream(fleet: PDFleet, vllm_server: VLLMServer) -> None:
    """A stream under way ends before its last token, as the client can see, after tokens
    identical to the colocated server's; nothing hangs; the decode replica, started again
    (with kvLoadFailurePolicy `recompute`, for the next test), is taken back."""
    _running(fleet)
    reference = _references(vllm_server)
    outcomes, killed_at = _kill_decode_mid_stream(fleet)
    groups = {
        "in flight": in_flight(outcomes, killed_at),
        "after": sent_after(outcomes, killed_at),
    }
    print("decode killed:", {k: dict(Counter(o.label() for o in v)) for k, v in groups.items()})
    _judge(outcomes, reference)
    cut = [o for o in groups["in flight"] if o.ask.streamed and o.seen is not Seen.COMPLETED]
    assert cut and all(0 < len(o.ids) < LONG_TOKENS for o in cut), groups
    assert groups["after"] and all(o.seen is Seen.HTTP_ERROR for o in groups["after"]), groups
    fleet.restart("decode", chart_pd_engine(PD_VALUES, "decode", RECOMPUTE))
    _readmitted(fleet, reference)


@KNOWN_HANG
def test_recompute_answers_what_the_dead_prefill_replica_left_to_pull(
    fleet: PDFleet, vllm_server: VLLMServer
) -> None:
    """kvLoadFailurePolicy `recompute` (the chart's other value) on the decode replica: the
    requests whose KV died with the prefill replica are answered, computed on the decode
    replica, identical to the colocated server's; the failed pulls are still counted."""
    recompute = chart_pd_engine(PD_VALUES, "decode", RECOMPUTE)
    if fleet.engine["decode"] != recompute:  # run on its own: the previous test sets it
        fleet.restart("decode", recompute)
    _running(fleet)
    reference = _references(vllm_server)
    kill = _kill_prefill_mid_load(fleet)
    print(f"prefill killed ({recompute.kv_load_failure_policy}): {kill.summary()}")
    _assert_prefill_kill(kill, recompute.kv_load_failure_policy, reference)


# --- A prefill replica stopped as the kubelet stops it ---------------------------------------

# vLLM's engine core on SIGTERM with a shutdown timeout (vllm/v1/engine/core.py): from here it
# keeps stepping while it has requests, finished ones whose KV waits to be pulled included.
ENGINE_DRAINS = "[shutdown] EngineCore: start mode=drain"


def test_a_stopped_prefill_replica_keeps_the_kv_until_the_decode_replica_pulled_it(
    fleet: PDFleet, vllm_server: VLLMServer
) -> None:
    """SIGTERM, as the kubelet sends it after the preStop drain, which a prefill replica
    passes as soon as it has answered (the KV it still holds is no HTTP request): with the
    chart's `--shutdown-timeout`, vLLM's engine stays up until the decode replica pulled that
    KV. The requests held on the decode replica meanwhile (its engine core paused) are
    answered identical to the colocated server's, one transfer each, none failed; then the
    prefill replica exits. (Routing: the leaving replica is the only prefill one here, so
    nothing new is sent; in a cluster the router drops a pod on its deletion.) Last in the
    module: the prefill replica the recompute test left dead is started here with the long
    lease (`_leased`), which no other test runs."""
    fleet.restart("prefill", _leased(fleet.engine["prefill"]))
    _running(fleet)
    reference = _references(vllm_server)
    asks = _asks(fleet.model)
    for ask in asks:
        reference(ask)  # asked now: the colocated server is not part of the held window
    before = _counts(fleet.decode)
    prefill, decode_core = fleet.prefill, engine_core(fleet.decode)
    assert prefill.process is not None
    decode_core.suspend()
    try:
        held = Stream(fleet.router.url, asks, DEADLINE, once=True).start()
        _wait_load(fleet.decode, len(asks))
        assert server_load(prefill.url) == 0  # what the preStop drain counts: nothing
        prefill.process.send_signal(signal.SIGTERM)
        wait_until(
            lambda: ENGINE_DRAINS in prefill.log_path.read_text(errors="replace"),
            DEADLINE,
            0.1,
            what="the prefill replica's engine draining",
        )
        # Still up, holding the KV the decode replica (paused) has not pulled yet.
        assert prefill.process.poll() is None, prefill.log_tail()
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            decode_core.resume()
    outcomes = held.join(DEADLINE)
    for o in outcomes:
        assert o.seen is Seen.COMPLETED and list(o.ids) == reference(o.ask), o
    prefill.process.wait(DEADLINE)
    after = _counts(fleet.decode)
    assert after[XFER_COUNT] - before[XFER_COUNT] == len(asks), (before, after)
    assert after[catalog.NIXL_FAILED.name] == before[catalog.NIXL_FAILED.name], (before, after)
