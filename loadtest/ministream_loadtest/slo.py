"""The SLO report: one entry per scenario and sweep point, every figure taken from the engine.

Latency percentiles, throughputs, goodput and the failed count are read from the engine's
own aggregate fields (`p99_ttft_ms`, `request_goodput`, ...); error causes and the good-request
share come from its per-request records (records.py), which are also checked against its
counters. Nothing here re-measures anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ministream_testkit.provenance import vllm_version

from .engine import ENGINE_NAME, PERCENTILE_METRICS, PERCENTILES
from .records import failure_counts, failure_examples, load_records
from .scenarios import Scenario


def _metric(result: dict[str, Any], metric: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {"mean": result.get(f"mean_{metric}_ms")}
    for p in PERCENTILES:
        out[f"p{p}"] = result.get(f"p{p}_{metric}_ms")
    return out


def point_report(
    result: dict[str, Any],
    *,
    scenario: Scenario,
    value: float,
    raw_file: Path,
    report_dir: Path,
) -> dict[str, Any]:
    spec_prefix = f"{scenario.name}-{scenario.sweep.mode}{value:g}-"
    records = load_records(result, request_id_prefix=spec_prefix)
    sent = len(records)
    duration = float(result["duration"])
    goodput = result.get("request_goodput")
    good = None if goodput is None else round(goodput * duration)
    attainment = None if good is None or sent == 0 else good / sent
    return {
        "load": {scenario.sweep.mode: value},
        "raw": str(raw_file.relative_to(report_dir))
        if raw_file.is_relative_to(report_dir)
        else str(raw_file),
        "requests": {
            "sent": sent,
            "completed": int(result["completed"]),
            "failed": int(result["failed"]),
        },
        "errors": failure_counts(records),
        "error_examples": failure_examples(records),
        "duration_s": round(duration, 3),
        **{f"{m}_ms": _metric(result, m) for m in PERCENTILE_METRICS},
        "throughput": {
            "requests_per_s": result["request_throughput"],
            "output_tokens_per_s": result["output_throughput"],
            "total_tokens_per_s": result["total_token_throughput"],
        },
        "goodput": {
            "requests_per_s": goodput,
            "good_requests": good,
            "attainment": attainment,
            "passed": None if attainment is None else attainment >= scenario.attainment,
        },
        "tokens": {
            "input": int(result["total_input_tokens"]),
            "output": int(result["total_output_tokens"]),
        },
    }


def scenario_report(scenario: Scenario, points: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": scenario.name,
        "description": scenario.description,
        "file": scenario.path,
        "api": scenario.api,
        "input_tokens": scenario.input_tokens,
        "output_tokens": scenario.output_tokens,
        "range_ratio": scenario.range_ratio,
        "requests_per_point": scenario.requests,
        "sweep": {"mode": scenario.sweep.mode, "values": list(scenario.sweep.values)},
        "slo": {**scenario.slo.as_dict(), "attainment": scenario.attainment},
        "points": points,
    }


def report(
    scenarios: list[dict[str, Any]],
    *,
    base_url: str,
    model: str,
    command: list[str],
) -> dict[str, Any]:
    return {
        "engine": {"name": ENGINE_NAME, "version": vllm_version()},
        "target": {"base_url": base_url, "model": model},
        "command": command,
        "scenarios": scenarios,
    }
