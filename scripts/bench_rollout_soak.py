#!/usr/bin/env python3
"""Drained rolling restarts back to back, behind each front, with the no-drain control beside
them: enough rollouts and requests to see a 1-in-1 000 loss, every failure kept with its
artifacts.

Each rollout is one run of the rolling-restart experiment (`ministream-loadtest rollout`: a
fresh fleet, every replica replaced under load, the report with each request's outcome), so
runs share nothing but the machine. Per front, `--rollouts` drained runs, then
`--control-rollouts` runs with `--no-drain`. A run with a failed request keeps its whole work
directory (the pods' vLLM and sidecar logs, the front's log, the engine's per-request result)
under `<out>.d/<run>/`, and each failure is listed with its run, its record from the run's
report and that directory; a run without one keeps only its report.

    scripts/bench_rollout_soak.py --out docs/results/serve/rollout-soak.json \\
        --rollouts 10 --control-rollouts 2 -- --replicas 2 --rate 12 \\
        --model .artifacts/models/ministream-tiny --served-model-name ministream-tiny \\
        -- --dtype float32 --max-model-len 512 --enforce-eager

Everything after the first `--` goes to every `ministream-loadtest rollout` (its own `--`
then passes engine arguments to vLLM). Prints one row per front and mode and writes JSON
with provenance (ministream_testkit.results.write_json); `make bench-rollout-soak` runs the
documented size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ministream_testkit.results import write_json

FRONTS = ("haproxy", "router")


def loadtest_command() -> list[str]:
    script = Path(sys.executable).with_name("ministream-loadtest")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ministream_loadtest"]


def _not_regular(directory: str, names: list[str]) -> set[str]:
    base = Path(directory)
    return {n for n in names if not (base / n).is_dir() and not (base / n).is_file()}


def run_one(
    name: str, front: str, drain: bool, rollout_args: Sequence[str], scratch: Path, keep: Path
) -> dict[str, Any]:
    """One rollout; its report kept as `keep`/NAME.report.json (a control's router counters
    say what the router's retries hid), and its work directory moved under `keep` if it
    lost a request (or failed outright)."""
    workdir = scratch / name
    report_path = scratch / f"{name}.json"
    command = [
        *loadtest_command(),
        "rollout",
        "--front",
        front,
        "--output",
        str(report_path),
        "--workdir",
        str(workdir),
        *([] if drain else ["--no-drain"]),
        *rollout_args,
    ]
    print(f"==> {name}: {' '.join(command)}", flush=True)
    proc = subprocess.run(command, check=False)
    report: dict[str, Any] = json.loads(report_path.read_text()) if report_path.exists() else {}
    lost = proc.returncode != 0 or not report or report.get("failed", 0) > 0
    if report_path.exists():
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy2(report_path, keep / f"{name}.report.json")
    kept = None
    if lost and workdir.exists():
        kept = keep / name
        shutil.rmtree(kept, ignore_errors=True)
        # Files only: the work directory also holds sockets (HAProxy's admin socket).
        shutil.copytree(workdir, kept, ignore=_not_regular)
        if report_path.exists():
            shutil.copy2(report_path, kept / "report.json")
    return {
        "name": name,
        "front": front,
        "drain": drain,
        "exit_code": proc.returncode,
        "sent": report.get("sent", 0),
        "failed": report.get("failed", 0),
        "failures_by_cause": report.get("failures_by_cause", {}),
        "failures": [
            {**f, "run": name, "artifacts": str(kept)} for f in report.get("failures", [])
        ],
        "restart_window": report.get("restart_window"),
        # Behind the router: what its counters gained (retries, circuit breaker), which is
        # where a failure the router retried on another replica shows.
        "router_counters": report.get("front", {}).get("router_counters"),
        "artifacts": str(kept) if kept else None,
        # Each run's own provenance: a soak can outlast a commit (--resume).
        "provenance": {
            k: report.get("provenance", {}).get(k) for k in ("commit", "dirty", "machine")
        },
    }


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per front and mode: runs, requests, failures by cause."""
    rows = []
    for front in dict.fromkeys(r["front"] for r in runs):
        for drain in (True, False):
            mine = [r for r in runs if r["front"] == front and r["drain"] is drain]
            if not mine:
                continue
            causes: Counter[str] = Counter()
            for r in mine:
                causes.update(r["failures_by_cause"])
            rows.append(
                {
                    "front": front,
                    "mode": "drain" if drain else "no-drain",
                    "rollouts": len(mine),
                    "rollouts_completed": sum(r["exit_code"] == 0 for r in mine),
                    "sent": sum(r["sent"] for r in mine),
                    "failed": sum(r["failed"] for r in mine),
                    "failures_by_cause": dict(sorted(causes.items())),
                }
            )
    return rows


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    print(f"{'front':<8} {'mode':<9} {'rollouts':>8} {'sent':>7} {'failed':>6}  causes")
    for r in rows:
        causes = ", ".join(f"{k} {v}" for k, v in r["failures_by_cause"].items()) or "-"
        done = f"{r['rollouts_completed']}/{r['rollouts']}"
        print(f"{r['front']:<8} {r['mode']:<9} {done:>8} {r['sent']:>7} {r['failed']:>6}  {causes}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    own, rollout_args = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the soak's JSON report")
    parser.add_argument("--rollouts", type=int, default=10, help="drained rollouts per front")
    parser.add_argument("--control-rollouts", type=int, default=2, help="--no-drain per front")
    parser.add_argument("--fronts", default=",".join(FRONTS), help="comma-separated")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs already in --out (same rollout arguments) and run only the rest",
    )
    args = parser.parse_args(own)
    fronts = [f for f in args.fronts.split(",") if f]
    if unknown := set(fronts) - set(FRONTS):
        parser.error(f"unknown front(s) {sorted(unknown)}; known: {', '.join(FRONTS)}")
    if not rollout_args:
        parser.error("pass the rollout's arguments after `--` (--replicas, --model, ...)")
    keep = args.out.with_name(args.out.name + ".d")
    runs = resumed_runs(args.out, rollout_args) if args.resume else []
    done = {r["name"] for r in runs}
    with tempfile.TemporaryDirectory(prefix="rollout-soak-") as tmp:
        for front in fronts:
            plan = [(True, i) for i in range(args.rollouts)]
            plan += [(False, i) for i in range(args.control_rollouts)]
            for drain, i in plan:
                name = f"{front}-{'drain' if drain else 'nodrain'}-{i:02d}"
                if name in done:
                    continue
                runs.append(run_one(name, front, drain, rollout_args, Path(tmp), keep))
                # Written after every run: an interrupted soak keeps what it measured.
                write_json(args.out, report(args, fronts, rollout_args, runs))
    rows = summarize(runs)
    print_table(rows)
    return 0 if all(r["exit_code"] == 0 for r in runs) else 1


def resumed_runs(out: Path, rollout_args: Sequence[str]) -> list[dict[str, Any]]:
    """The completed runs of an interrupted soak with the same rollout arguments (a run that
    ended with an error, e.g. a pod that never started, is run again); none if no report."""
    if not out.exists():
        return []
    earlier = json.loads(out.read_text())
    if earlier["config"]["rollout_args"] != list(rollout_args):
        raise SystemExit(
            f"{out} was written with other rollout arguments "
            f"({' '.join(earlier['config']['rollout_args'])}): --resume only continues the "
            "same soak; pass another --out to start a new one"
        )
    return [r for r in earlier["runs"] if r["exit_code"] == 0]


def report(
    args: argparse.Namespace, fronts: Sequence[str], rollout_args: Sequence[str], runs: list
) -> dict[str, Any]:
    return {
        "config": {
            "rollouts_per_front": args.rollouts,
            "control_rollouts_per_front": args.control_rollouts,
            "fronts": sorted({*fronts, *(r["front"] for r in runs)}),
            "rollout_args": list(rollout_args),
        },
        "summary": summarize(runs),
        "failures": [f for r in runs for f in r["failures"]],
        "runs": runs,
    }


if __name__ == "__main__":
    sys.exit(main())
