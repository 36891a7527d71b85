"""vLLM's start, phase by phase: the plugin stamps vLLM's log lines into a file
(startup_log.attach), the sidecar reads them back (startup_log.read) and splits them
(startup_phases.parse) into `ministream_cold_start_phase_seconds`.

The real engine's log goes through this in tests/service/test_sidecar_launcher.py
(`ministream up`) and tests/images/test_chart_pod.py (the chart's rendered pod)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ministream import startup_log
from ministream_sidecar import startup_phases as phases
from ministream_sidecar.metrics import ColdStartPhase, SidecarMetrics
from ministream_sidecar.state import ServingState

E = "(EngineCore pid=1) INFO "
SAMPLE_LOG = [
    (0.5, "INFO [api_utils.py:273] non-default args: {'model': '/m'}"),
    (4.0, E + "[core.py:115] Initializing a V1 LLM engine (v0.25.1) with config: x"),
    (8.0, E + "[default_loader.py:431] Loading weights took 1.54 seconds"),
    (8.2, E + "[model_runner.py:303] Model loading took 2.25 GiB and 1.790000 seconds"),
    (9.0, E + "[backends.py:1149] Dynamo bytecode transform time: 3.10 s"),
    (12.0, E + "[backends.py:394] Compiling a graph for compile range (1, 8192) takes 2.50 s"),
    (12.5, E + "[monitor.py:52] torch.compile took 6.20 s in total"),
    (13.2, E + "[gpu_worker.py:539] Available KV cache memory: 30.1 GiB"),
    (17.0, E + "[model_runner.py:723] Graph capturing finished in 4 secs, took 0.5 GiB"),
    (17.3, E + "[core.py:345] init engine (profile, create kv cache, warmup model) took 9.0 s"),
    (19.0, "INFO [api_server.py:616] Starting vLLM server on http://0.0.0.0:8000"),
]


def test_startup_phases_add_up_to_the_total() -> None:
    result = phases.parse(SAMPLE_LOG, health_ok=19.4, ready=21.0)
    ph = result["phases"]
    assert ph["imports"] == pytest.approx(0.5)
    assert ph["weights"] == pytest.approx(4.2)
    assert ph["compile"] == pytest.approx(6.2)
    assert ph["profiling"] == pytest.approx(5.0 - 6.2)  # compile ran inside that window
    assert ph["graph_capture"] == pytest.approx(3.8)
    assert ph["warmup"] == pytest.approx(1.6)
    assert ph["total"] == pytest.approx(21.0)
    consecutive = [p for p, _, _ in phases.PHASES]
    assert sum(ph[p] for p in consecutive) == pytest.approx(21.0)
    assert result["logged"]["weights_read_s"] == pytest.approx(1.54)
    assert result["logged"]["model_load_s"] == pytest.approx(1.79)
    assert result["logged"]["graph_capture_logged_s"] == pytest.approx(4.0)
    assert result["compile_cache_hit"] is False


def test_startup_phases_missing_marker_gives_none_not_a_wrong_number() -> None:
    without_graphs = [line for line in SAMPLE_LOG if "Graph capturing" not in line[1]]
    ph = phases.parse(without_graphs, health_ok=19.4, ready=None)["phases"]
    assert ph["graph_capture"] is None
    # The next phase spans the gap instead: KV cache ready -> engine ready.
    assert ph["engine_finish"] == pytest.approx(17.3 - 13.2)
    assert ph["warmup"] is None
    assert ph["total"] == pytest.approx(19.4)


def test_every_engine_phase_is_a_metric_label() -> None:
    """The sidecar reports each phase the parser computes (health and warmup it measures
    itself; total it measures from its own start)."""
    computed = {p for p, _, _ in phases.PHASES} | {"compile", "profiling"}
    labels = {p.value for p in ColdStartPhase}
    assert computed - labels == {"health"}


def test_state_records_the_log_phases_once() -> None:
    metrics = SidecarMetrics()
    state = ServingState(metrics=metrics, process_start=100.0, liveness_failure_threshold=3)
    parsed = phases.parse(SAMPLE_LOG)["phases"]
    state.record_engine_phases(parsed)
    state.record_engine_phases({"imports": 99.0})  # a later start: the first one stays
    assert state.phases[ColdStartPhase.IMPORTS] == pytest.approx(0.5)
    assert state.phases[ColdStartPhase.WEIGHTS] == pytest.approx(4.2)
    assert ColdStartPhase.TOTAL not in state.phases  # the sidecar's own, from its clock
    text = metrics.render()[0].decode()
    assert 'ministream_cold_start_phase_seconds{phase="graph_capture"} 3.8' in text


def _log_into(path: Path, message: str) -> None:
    startup_log.attach(path)
    logging.getLogger("vllm.test").warning(message)


def test_attach_stamps_the_top_process_and_its_children(tmp_path: Path) -> None:
    """The top-level process starts the file with its start time; a multiprocessing child
    (vLLM's engine core, spawned) appends; read() gives seconds since the process start."""
    path = tmp_path / "startup.log"
    dead = subprocess.Popen(["true"])  # an earlier start, its process gone
    dead.wait()
    path.write_text(f"1.000 {startup_log.START_MARKER} pid={dead.pid}\n1.500 an old start\n")
    code = (
        "import logging, multiprocessing, sys\n"
        "from pathlib import Path\n"
        "from ministream import startup_log\n"
        "from tests.service.test_startup_log import _log_into\n"
        "if __name__ == '__main__':\n"
        "    p = Path(sys.argv[1])\n"
        "    _log_into(p, 'parent: non-default args')\n"
        "    child = multiprocessing.get_context('spawn').Process(\n"
        "        target=_log_into, args=(p, 'child: Initializing a V1 LLM engine'))\n"
        "    child.start(); child.join()\n"
        "    assert child.exitcode == 0\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, cwd=Path.cwd())
    lines = startup_log.read(path)
    assert lines is not None
    assert [text for _, text in lines] == [
        "parent: non-default args",
        "child: Initializing a V1 LLM engine",
    ]
    head = path.read_text().splitlines()[0]
    assert startup_log.START_MARKER in head and "old start" not in path.read_text()
    # Seconds since the parent started, not epoch stamps: no later than now is from it.
    started = float(head.split(" ", 1)[0])
    assert 0 < lines[0][0] <= lines[1][0] <= time.time() - started


def test_a_process_joining_a_live_start_appends(tmp_path: Path) -> None:
    """A second top-level process (a Ray worker on the same node) must not restart the
    file while the process that started it lives; one with the dead starter's pid does."""
    path = tmp_path / "startup.log"
    live = os.getppid()
    path.write_text(f"5.000 {startup_log.START_MARKER} pid={live}\n6.000 first line\n")
    assert multiprocessing.parent_process() is None
    assert not startup_log._starts_the_server(path)
    path.write_text(f"5.000 {startup_log.START_MARKER} pid={os.getpid()}\n")
    assert startup_log._starts_the_server(path)  # our own pid: a restarted container


def test_the_file_stops_growing_at_its_cap(tmp_path: Path) -> None:
    path = tmp_path / "startup.log"
    code = (
        "import logging, sys\n"
        "from ministream import startup_log\n"
        "startup_log.attach(sys.argv[1], max_bytes=200)\n"
        "logging.config.dictConfig({'version': 1, 'incremental': False})  # as vLLM does\n"
        "for i in range(100): logging.getLogger('vllm.x').warning('line %d with text', i)\n"
        "logging.getLogger('transformers').warning('not vLLM')\n"
    )
    subprocess.run([sys.executable, "-c", "import logging.config\n" + code, str(path)], check=True)
    text = path.read_text()
    assert 200 <= len(text) < 300 and "line 0 with text" in text and "not vLLM" not in text


def test_read_without_a_start_line_is_none(tmp_path: Path) -> None:
    path = tmp_path / "startup.log"
    assert startup_log.read(path) is None
    path.write_text("12.0 a line\nnot stamped\n")
    assert startup_log.read(path) is None


def test_attach_to_an_unwritable_place_leaves_vllm_running(tmp_path: Path) -> None:
    assert startup_log.attach(tmp_path / "missing-dir" / "startup.log") is False
