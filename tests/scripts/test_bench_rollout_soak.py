"""scripts/bench_rollout_soak.py without engines: a stand-in for `ministream-loadtest rollout`
(a small Python program that writes the report a run would and a work directory with a log and
a socket, as HAProxy's admin socket is) exercises what the soak itself does: one run per front
and mode, failures summed by cause, every losing run's files kept, and --resume.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.scripts import ScriptImporter

# Fails its requests when run with --no-drain behind the router, like the control would.
STAND_IN = r"""
import json, socket, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("--output") + 1])
work = Path(args[args.index("--workdir") + 1])
work.mkdir(parents=True)
(work / "vllm-v1-0.log").write_text("a pod's log\n")
sock = socket.socket(socket.AF_UNIX)
sock.bind(str(work / "haproxy.sock"))
lose = "--no-drain" in args and args[args.index("--front") + 1] == "router"
failures = [{"request_id": "rollout-7", "cause": "http_500"}] if lose else []
out.write_text(json.dumps({
    "sent": 100, "failed": len(failures),
    "failures_by_cause": {"http_500": 1} if lose else {},
    "failures": failures, "restart_window": {"sent": 90},
    "front": {"router_counters": {"vllm_router_retries_total": 2.0}} if "router" in args else {},
}))
"""


@pytest.fixture
def soak(
    import_script: ScriptImporter, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> ModuleType:
    module = import_script("bench_rollout_soak")
    program = tmp_path / "stand_in_rollout.py"
    program.write_text(STAND_IN)
    monkeypatch.setattr(module, "loadtest_command", lambda: [sys.executable, str(program)])
    return module


def test_runs_every_front_and_mode_and_keeps_what_lost(soak: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    argv = [
        "--out",
        str(out),
        "--rollouts",
        "2",
        "--control-rollouts",
        "1",
        "--",
        "--replicas",
        "2",
    ]
    assert soak.main(argv) == 0
    report = json.loads(out.read_text())
    assert "provenance" in report
    assert set(report["runs"][0]["provenance"]) == {"commit", "dirty", "machine"}
    rows = {(r["front"], r["mode"]): r for r in report["summary"]}
    assert rows["haproxy", "drain"]["rollouts"] == 2 and rows["haproxy", "drain"]["sent"] == 200
    assert rows["router", "no-drain"]["failed"] == 1
    assert rows["router", "no-drain"]["failures_by_cause"] == {"http_500": 1}
    assert sum(r["failed"] for r in report["summary"]) == 1
    (failure,) = report["failures"]
    kept = Path(failure["artifacts"])
    assert (
        failure["run"] == "router-nodrain-00"
        and kept == out.with_name("soak.json.d") / failure["run"]
    )
    assert (kept / "vllm-v1-0.log").read_text() == "a pod's log\n"
    assert (kept / "report.json").is_file() and not (kept / "haproxy.sock").exists()
    # A run that lost nothing keeps only its summary and its report; the router's counters
    # are in the run's record.
    assert [r["name"] for r in report["runs"] if r["artifacts"]] == ["router-nodrain-00"]
    reports = sorted(p.name for p in out.with_name("soak.json.d").glob("*.report.json"))
    assert reports == sorted(f"{r['name']}.report.json" for r in report["runs"])
    counters = {r["name"]: r["router_counters"] for r in report["runs"]}
    assert counters["router-drain-00"] == {"vllm_router_retries_total": 2.0}
    assert counters["haproxy-drain-00"] is None


def test_resume_runs_only_what_is_missing_and_refuses_another_soak(
    soak: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "soak.json"
    base = ["--out", str(out), "--fronts", "haproxy", "--control-rollouts", "0"]
    assert soak.main([*base, "--rollouts", "1", "--", "--replicas", "2"]) == 0
    # A run that ended with an error (a pod that never started) is run again.
    report = json.loads(out.read_text())
    report["runs"].append({**report["runs"][0], "name": "haproxy-drain-01", "exit_code": 1})
    out.write_text(json.dumps(report))
    ran: list[str] = []
    run_one = soak.run_one
    monkeypatch.setattr(soak, "run_one", lambda name, *a: ran.append(name) or run_one(name, *a))
    assert soak.main([*base, "--rollouts", "2", "--resume", "--", "--replicas", "2"]) == 0
    assert ran == ["haproxy-drain-01"]
    assert [r["name"] for r in json.loads(out.read_text())["runs"]] == [
        "haproxy-drain-00",
        "haproxy-drain-01",
    ]
    with pytest.raises(SystemExit, match="other rollout arguments"):
        soak.main([*base, "--rollouts", "3", "--resume", "--", "--replicas", "3"])
