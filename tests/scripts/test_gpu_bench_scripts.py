"""The H200 benchmark scripts (scripts/gpu/) on the CPU build.

The GPU figures in docs/benchmarks.md#h200 come from these scripts on a lent H200; here CI
runs the same code paths on the tiny model so that a device call never fails on a typo.
Unit tests check the pure parts (statistics, log phases, shape figures); `engine` tests
run each script end to end and assert on the structure of what it writes, never on speed.
"""

from __future__ import annotations

import argparse
import http.server
import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ministream_sidecar import cpu_memory
from ministream_testkit.net import free_port
from ministream_testkit.vllm_server import IN_PROCESS_ENGINE
from tests.support import tools
from tests.support.scripts import GPU_SCRIPTS, SCRIPTS, ScriptImporter

ROOT = SCRIPTS.parent


def test_bootstrap_interval_brackets_the_median(import_script: ScriptImporter) -> None:
    stats = import_script("interval_stats")
    summary = stats.ratio_summary([1.0, 1.1, 0.9, 1.05, 0.95, 1.0], [1.0] * 6)
    lo, hi = summary["ci95"]
    assert summary["n"] == 6
    assert lo <= summary["median"] <= hi
    assert summary["min"] == pytest.approx(0.9)
    # Identical values: a zero-width interval.
    assert stats.bootstrap_median_ci([2.0] * 5) == (2.0, 2.0)
    assert stats.fmt_ratio({"n": 0}) == "n/a"


def test_instance_pair_range_shows_an_engine_offset(import_script: ScriptImporter) -> None:
    """Three engines per side, four rounds. Identical engines: the estimate is the true ratio
    and the range has no width. One engine 10 % slow: every per-round bootstrap of that pair
    would call it a difference; the range over engine pairs shows it as one engine's."""
    stats = import_script("interval_stats")
    rounds = [1.0, 1.02, 0.98, 1.01]
    same = stats.instance_pair_range([rounds] * 3, [[2 * x for x in rounds]] * 3)
    assert same["median"] == pytest.approx(0.5)
    assert same["pairs_min"] == pytest.approx(0.5) and same["pairs_max"] == pytest.approx(0.5)
    assert same["instances"] == [3, 3]
    offset = stats.instance_pair_range([rounds, rounds, [1.1 * x for x in rounds]], [rounds] * 3)
    assert offset["median"] == pytest.approx(3.1 / 3)
    assert offset["pairs_min"] == pytest.approx(1.0)
    assert offset["pairs_max"] == pytest.approx(1.1)
    assert stats.fmt_pair_range(offset) == "1.033 (1.000–1.100)"
    with pytest.raises(ValueError, match="at least one instance"):
        stats.instance_pair_range([[1.0, 2.0]], [[]])


def test_superseded_instance_bootstrap_still_answers_through_paired_stats(
    import_script: ScriptImporter,
) -> None:
    """The two-level bootstrap stays for the GPU scripts written against it (the docs report
    the range of pairs instead). Three engines per side, four paired rounds: identical engines
    give a tight interval; one engine 10 % slow widens it to that engine's offset."""
    stats = import_script("paired_stats")
    rounds = [1.0, 1.02, 0.98, 1.01]
    same = stats.instance_ratio_summary([rounds] * 3, [[2 * x for x in rounds]] * 3)
    assert same["median"] == pytest.approx(0.5)
    assert same["ci95"][0] == pytest.approx(0.5) and same["ci95"][1] == pytest.approx(0.5)
    offset = stats.instance_ratio_summary(
        [rounds, rounds, [1.1 * x for x in rounds]], [rounds] * 3, resamples=2000
    )
    lo, hi = offset["ci95"]
    assert lo == pytest.approx(1.0) and hi == pytest.approx(1.1)
    with pytest.raises(ValueError, match="same, non-zero number of rounds"):
        stats.instance_ratio_summary([[1.0, 2.0]], [[1.0]])


def test_parity_engines_and_their_order(import_script: ScriptImporter) -> None:
    parity = import_script("forward_parity")
    assert parity.engine_names(1) == {k: [k] for k in ("plugin", "llama_a", "llama_b")}
    names = parity.engine_names(3)
    assert names["llama_b"] == ["llama_b.0", "llama_b.1", "llama_b.2"]
    everyone = [n for group in names.values() for n in group]
    # Three engines cycle through all six permutations; nine get a shuffle per round.
    three = [tuple(parity.round_order(list(parity.KINDS), r)) for r in range(6)]
    assert len(set(three)) == 6
    orders = [parity.round_order(everyone, r) for r in range(4)]
    assert all(sorted(o) == sorted(everyone) for o in orders)
    assert len({tuple(o) for o in orders}) > 1
    with pytest.raises(ValueError, match="at least 1"):
        parity.engine_names(0)


def test_shape_figures_pick_decode_steps_and_sum_prefill(import_script: ScriptImporter) -> None:
    parity = import_script("forward_parity")
    assert parity.parse_shape("decode:16") == ("decode", 16, 0)
    assert parity.parse_shape("prefill:8x512") == ("prefill", 8, 512)
    with pytest.raises(ValueError, match="bad shape"):
        parity.parse_shape("decode:x")
    # Two prefill chunks, then four decode steps of batch 16.
    calls = [(4096, "model", 9.0), (4096, "model", 9.5)] + [
        (16, "full_graph", t) for t in (1, 2, 3, 4)
    ]
    assert parity.shape_figure("decode", calls) == (2.5, 4)
    assert parity.shape_figure("prefill", calls[:2]) == (18.5, 2)
    with pytest.raises(RuntimeError, match="no forward call"):
        parity.shape_figure("decode", [])


def _cold_run(name: str, ready: float, imports: float, ok: bool = True) -> dict:
    phases = {"imports": imports, "weights": 3.0, "compile": None}
    return {
        "name": name,
        "ok": ok,
        "phases": phases,
        "events": {"ready": ready if ok else None},
        "compile_cache_hit": ok,
    }


def test_cold_start_summary_groups_repeats_with_spreads(
    import_script: ScriptImporter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cold = import_script("cold_start")
    assert cold.variant_of("chart-graphs64-seeded.2-fork") == "chart-graphs64-seeded-fork"
    assert cold.variant_of("vllm-warm.3") == "vllm-warm"
    assert cold.variant_of("vllm-warm") == "vllm-warm"
    assert cold.spread([3.0, 1.0, 2.0]) == "2.0 [1.0–3.0]"
    assert cold.spread([1.0, 2.0]) == "1.5 [1.0–2.0]"
    assert cold.spread([4.0]) == "4.0" and cold.spread([]) == "–"
    runs = [
        _cold_run("seeded-fork", 26.0, 12.0),
        _cold_run("seeded.2-fork", 25.0, 11.0),
        _cold_run("seeded.3-fork", 27.0, 13.0),
        _cold_run("fresh", 65.0, 12.0, ok=False),
    ]
    (tmp_path / "a").mkdir()
    for r in runs:  # summary searches folders recursively (one per unpacked step)
        (tmp_path / "a" / f"{r['name']}.json").write_text(json.dumps(r))
    assert cold.main(["summary", str(tmp_path), "--order", "fresh,seeded-fork"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| fresh | 0/1 |")  # failed starts counted, not averaged
    seeded = rows[2].split(" | ")
    assert seeded[:3] == ["| seeded-fork", "3/3", "12.0 [11.0–13.0]"]
    assert "**26.0 [25.0–27.0]**" in seeded and "14.0 [14.0–14.0]" in seeded  # after imports
    assert rows[2].endswith("| 3/3 |")


def test_cold_start_pairs_matches_repeats_within_a_call(
    import_script: ScriptImporter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cold = import_script("cold_start")
    assert cold.repeat_of("warm-hide.3") == 3 and cold.repeat_of("warm-hide") == 1
    assert cold.repeat_of("seeded.2-fork") == 2
    calls = {
        "call1": [
            _cold_run("warm", 21.0, 10.0),
            _cold_run("warm-hide", 19.0, 8.0),
            _cold_run("warm.2", 22.0, 11.0),
            _cold_run("warm-hide.2", 21.5, 10.0),
            _cold_run("warm-hide.3", 15.0, 6.0),  # no partner: left out
        ],
        # Same repeat numbers in another call: paired within it, never across calls.
        "call2": [_cold_run("warm", 30.0, 9.0), _cold_run("warm-hide", 27.0, 8.5)],
    }
    for call, runs in calls.items():
        (tmp_path / call).mkdir()
        for r in runs:
            (tmp_path / call / f"{r['name']}.json").write_text(json.dumps(r))
    dirs = [str(tmp_path / c) for c in calls]
    assert cold.main(["pairs", *dirs, "--a", "warm-hide", "--b", "warm"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| warm")][1:]  # no header
    assert [r.split(" | ")[-1] for r in rows] == ["-2.0 |", "-0.5 |", "-3.0 |"]
    # mean -1.83, sd 1.258 over 3 pairs: ± t(0.975, 2) 4.303 × 1.258 / √3 = ± 3.13
    assert "3 pairs: mean A − B −1.83 s [−4.96, +1.29] (95 % t-interval over pairs)" in out
    assert "median -2.00 s; A lower in 3 of 3" in out
    assert cold.main(["pairs", *dirs, "--a", "warm-hide", "--b", "warm", "--phase", "imports"]) == 0
    assert "median -1.00 s" in capsys.readouterr().out
    assert cold.main(["pairs", *dirs, "--a", "cold", "--b", "warm"]) == 1  # nothing to pair


def test_cold_start_decode_probe_times_batches_and_pairs_in_tokens_per_s(
    import_script: ScriptImporter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cold = import_script("cold_start")
    with pytest.raises(argparse.ArgumentTypeError, match="BATCH:PROMPT_TOKENS:MAX_TOKENS"):
        cold.DecodeProbe.parse("64:128")
    with pytest.raises(argparse.ArgumentTypeError, match=">= 1"):
        cold.DecodeProbe.parse("0:128:128")
    bodies: list[dict] = []

    class Completions(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"choices": []}')

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        probe = cold.DecodeProbe.parse("4:16:8")
        result = probe.run(f"http://127.0.0.1:{server.server_address[1]}", "m")
    finally:
        server.shutdown()
    assert len(bodies) == 3 * 4  # three rounds of the batch
    assert {len(b["prompt"]) for b in bodies} == {16}
    assert {(b["max_tokens"], b["ignore_eos"], b["temperature"]) for b in bodies} == {
        (8, True, 0.0)
    }
    # no prefix-cache hits: every probe prompt opens with its own id, none of the warmup's
    firsts = [b["prompt"][0] for b in bodies]
    assert len(set(firsts)) == len(bodies) and min(firsts) > 97
    assert result["tokens_per_s"] == [4 * 8 / w for w in result["wall_s"]]
    assert result["median_tokens_per_s"] == sorted(result["tokens_per_s"])[1]
    runs = [
        _cold_run("warm", 21.0, 10.0) | {"decode_probe": {"median_tokens_per_s": 1000.0}},
        _cold_run("warm-mega", 17.0, 10.0) | {"decode_probe": {"median_tokens_per_s": 990.0}},
        _cold_run("warm.2", 22.0, 11.0) | {"decode_probe": {"median_tokens_per_s": 1010.0}},
        _cold_run("warm-mega.2", 18.0, 10.0) | {"decode_probe": {"median_tokens_per_s": 1012.0}},
    ]
    for r in runs:
        (tmp_path / f"{r['name']}.json").write_text(json.dumps(r))
    args = ["pairs", str(tmp_path), "--a", "warm-mega", "--b", "warm"]
    assert cold.main([*args, "--phase", "decode_tokens_per_s"]) == 0
    out = capsys.readouterr().out
    assert "2 pairs: mean A − B −4 tokens/s [" in out and "median -4 tokens/s" in out
    assert cold.main(args) == 0
    assert "2 pairs: mean A − B −4.00 s [" in capsys.readouterr().out


def test_chart_args_extract_reads_the_vllm_container(import_script: ScriptImporter) -> None:
    chart_args = import_script("chart_args")
    manifests = """
kind: Deployment
spec:
  template:
    spec:
      initContainers:
        - name: sidecar
          env:
            - {name: MINISTREAM_SIDECAR_WARMUP_REQUESTS, value: "8"}
            - {name: MINISTREAM_SIDECAR_WARMUP_CONCURRENCY, value: "2"}
            - {name: MINISTREAM_SIDECAR_WARMUP_PROMPT_TOKENS, value: "128"}
            - {name: MINISTREAM_SIDECAR_WARMUP_MAX_TOKENS, value: "16"}
      containers:
        - name: vllm
          command: [python3, -m, vllm.entrypoints.openai.api_server]
          args: [--model, /models/m]
          env:
            - {name: VLLM_CACHE_ROOT, value: /var/cache/vllm}
            - name: VLLM_API_KEY
              valueFrom: {secretKeyRef: {name: k, key: api-key}}
"""
    out = chart_args.extract(manifests)
    assert out["argv"][-2:] == ["--model", "/models/m"]
    assert out["env"] == {"VLLM_CACHE_ROOT": "/var/cache/vllm"}
    assert out["warmup"] == {
        "requests": 8,
        "concurrency": 2,
        "prompt_tokens": 128,
        "max_tokens": 16,
    }


@pytest.mark.parametrize(
    "name",
    ["chart-defaults.json", "chart-defaults-h200.json"],
)
def test_committed_chart_defaults_match_the_chart(name: str) -> None:
    """scripts/gpu/chart-defaults*.json are what `helm template` renders today (the H200 one
    with the `--set` values it records, which give h200.sh the chart's KV-cache size)."""
    tools.helm()
    committed = json.loads((GPU_SCRIPTS / name).read_text())
    sets = [a for kv in committed.get("set", []) for a in ("--set", kv)]
    fresh = subprocess.run(
        [sys.executable, str(GPU_SCRIPTS / "chart_args.py"), *sets],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(fresh) == committed, (
        f"re-render: python scripts/gpu/chart_args.py {' '.join(sets)} --out scripts/gpu/{name}"
    )
    if name == "chart-defaults-h200.json":  # what h200.sh reads as KV_BYTES
        argv = committed["argv"]
        assert int(argv[argv.index("--kv-cache-memory-bytes") + 1]) > 100 * 2**30


def test_chart_args_refused_value_says_why_and_keeps_the_file(tmp_path: Path) -> None:
    """A value the chart refuses: helm's reason on stderr, exit 2, `--out` left as it was."""
    tools.helm()
    out = tmp_path / "chart-defaults-h200.json"
    out.write_text("{}\n")
    args = ["--out", str(out), "--set", "accelerator.memoryGiB=1", "--set", "model.sizeGiB=3"]
    proc = subprocess.run(
        [sys.executable, str(GPU_SCRIPTS / "chart_args.py"), *args],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    assert "no room for a KV cache" in proc.stderr and proc.stdout == ""
    assert out.read_text() == "{}\n" and sorted(tmp_path.iterdir()) == [out]


# The GPU host's P/D arguments: the chart's for GPUs (the replicas here render for the CPU
# build), and with UCX's CUDA IPC transport as well (the documented ucxTransports opt-in).
GPU = ("--set", "accelerator.type=gpu")
CUDA_IPC = (*GPU, "--set", r"disaggregation.nixl.ucxTransports=cuda_ipc\,cuda_copy\,tcp\,self")


@pytest.mark.parametrize(
    ("script", "flag", "name", "key", "flag_in_router", "sets"),
    [
        ("bench_routing.py", "--write-chart-router", "chart-router.json", (), "--policy", ()),
        (
            "bench_pd.py",
            "--write-chart-pd",
            "chart-pd.json",
            ("pd",),
            "--vllm-pd-disaggregation",
            GPU,
        ),
        (
            "bench_pd.py",
            "--write-chart-pd",
            "chart-pd-cuda-ipc.json",
            ("pd",),
            "--vllm-pd-disaggregation",
            CUDA_IPC,
        ),
    ],
)
def test_committed_chart_arguments_match_the_chart(
    tmp_path: Path,
    script: str,
    flag: str,
    name: str,
    key: tuple[str, ...],
    flag_in_router: str,
    sets: tuple[str, ...],
) -> None:
    """scripts/gpu/chart-router.json, chart-pd.json and chart-pd-cuda-ipc.json (the chart's
    router and engine arguments for the GPU host, which has no helm) are what `helm template`
    renders today."""
    tools.helm()
    fresh = tmp_path / name
    subprocess.run(
        [sys.executable, str(SCRIPTS / script), *sets, flag, str(fresh)],
        capture_output=True,
        text=True,
        check=True,
    )
    committed = json.loads((GPU_SCRIPTS / name).read_text())
    assert json.loads(fresh.read_text()) == committed, (
        f"re-render: python scripts/{script} {' '.join(sets)} {flag} scripts/gpu/{name}"
    )
    for k in key:
        committed = committed[k]
    assert flag_in_router in committed["router_args"]


# --- end to end on the CPU build (structure only) --------------------------------------


def _run(
    args: list[str], env_extra: dict[str, str], timeout: int
) -> subprocess.CompletedProcess[str]:
    env = (
        os.environ
        | {
            "PYTHONPATH": os.pathsep.join(
                [
                    str(ROOT / "plugins"),
                    str(ROOT / "loadtest"),
                    str(ROOT / "devtools"),
                    os.environ.get("PYTHONPATH", ""),
                ]
            ),
            **cpu_memory.pinned(),  # next to the tests' other engines
        }
        | env_extra
    )
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


@pytest.mark.engine
@pytest.mark.timeout(3600)
def test_forward_parity_smoke_on_cpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "parity.json"
    proc = _run(
        [
            str(GPU_SCRIPTS / "forward_parity.py"),
            "--model",
            str(tiny_model_dir),
            "--out",
            str(out),
            "--smoke",
            "--instances",
            "2",
        ],
        IN_PROCESS_ENGINE,
        3000,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["settings"]["rounds"] == 2 and report["settings"]["prefill_reps"] == 2
    assert set(report["shapes"]) == {"decode:1", "decode:4", "prefill:1x64"}
    engines = {f"{kind}.{i}" for kind in ("plugin", "llama_a", "llama_b") for i in (0, 1)}
    assert set(report["settings"]["engines"]) == engines
    for shape in report["shapes"].values():
        assert set(shape["forward_ms"]) == engines
        assert all(len(v) == 2 and min(v) > 0 for v in shape["forward_ms"].values())
        for key in ("parity_forward", "aa_forward", "parity_e2e", "aa_e2e"):
            lo, hi = shape[key]["ci95"]  # rounds of the first engines: a bootstrap interval
            assert lo <= shape[key]["median"] <= hi
            replicated = shape[f"replicated_{key}"]  # engines: the range of the pairs' ratios
            assert replicated["pairs_min"] <= replicated["median"] <= replicated["pairs_max"]
            assert replicated["instances"] == [2, 2]
        # Same weights, same kernels: greedy tokens agree (float32 on CPU).
        assert shape["identical_tokens_plugin_vs_llama"] == "2/2"


@pytest.mark.engine
@pytest.mark.network
@pytest.mark.timeout(3600)
def test_cold_start_phases_on_cpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    proc = _run(
        [
            str(GPU_SCRIPTS / "cold_start.py"),
            "run",
            "--name",
            "chart-cpu",
            "--mode",
            "chart",
            "--model",
            str(tiny_model_dir),
            "--out",
            str(tmp_path),
            "--port",
            "18437",
            "--cache-root",
            str(tmp_path / "cache"),
            "--fresh-cache",
            "--timeout",
            "1500",
            "--extra-arg=--max-model-len=256",
            "--extra-arg=--enforce-eager",
            "--prefetch",
            str(tiny_model_dir),
        ],
        {"MINISTREAM_COMMIT": "0" * 40, "MINISTREAM_DIRTY": "0"},
        1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "chart-cpu.json").read_text())
    assert result["ok"] is True
    prov = result["provenance"]  # as h200.sh passes the commit to the GPU host
    assert prov["commit"] == "0" * 40 and prov["dirty"] is False
    assert "cold_start.py run --name chart-cpu" in prov["command"]
    assert set(prov["bytecode"]["packages"]) >= {"torch", "vllm"}
    assert result["prefetch"]["paths"] == [str(tiny_model_dir)]
    assert 0 <= result["prefetch"]["done_s"] < result["events"]["ready"]
    ph = result["phases"]
    for phase in ("imports", "engine_core_start", "weights", "health", "warmup", "total"):
        assert ph[phase] is not None and ph[phase] >= 0, phase
    assert len(result["warmup"]["latencies_s"]) == 8  # the chart's warmup request count
    assert (tmp_path / "chart-cpu.log").stat().st_size > 0
    table = _run([str(GPU_SCRIPTS / "cold_start.py"), "table", str(tmp_path)], {}, 60)
    assert "| chart-cpu |" in table.stdout
    summary = _run([str(GPU_SCRIPTS / "cold_start.py"), "summary", str(tmp_path)], {}, 60)
    assert "| chart-cpu | 1/1 |" in summary.stdout


@pytest.mark.engine
@pytest.mark.timeout(3600)
def test_fp8_compare_smoke_on_cpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    reference = tmp_path / "reference.json"
    ref = _run(
        [
            "-m",
            "ministream_reference.golden",
            "--engine",
            "reference",
            "--model",
            str(tiny_model_dir),
            "--out",
            str(reference),
        ],
        {},
        600,
    )
    assert ref.returncode == 0, ref.stderr[-2000:]
    out = tmp_path / "fp8.json"
    proc = _run(
        [
            str(GPU_SCRIPTS / "fp8_compare.py"),
            "--model",
            str(tiny_model_dir),
            "--reference",
            str(reference),
            "--out",
            str(out),
            "--smoke",
        ],
        IN_PROCESS_ENGINE,
        3000,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    bf16 = report["variants"]["bf16"]
    accuracy = bf16["accuracy_vs_fp32_reference"]
    assert 0.0 <= accuracy["identical_share"] <= 1.0 and isinstance(accuracy["pass"], bool)
    assert bf16["weight_bytes_total"] > 0
    assert set(bf16["performance"]) == {"c=1", "c=4"}
    # FP8 on the CPU build (vLLM 0.32): refused inside vLLM (no CPU fp8 quant kernel) with
    # the reason recorded; served, should a build add the kernel.
    fp8 = report["variants"]["fp8"]
    assert "error" in fp8 or fp8["weight_bytes_total"] < bf16["weight_bytes_total"]


def test_kv_offload_workload_resends_history_and_keeps_turns_in_order(
    import_script: ScriptImporter,
) -> None:
    """kv_offload.py's multi-turn workload (its servers need a GPU: vLLM's CPU build cannot
    offload, so the engine path runs only on the H200, docs/results/h200/run16)."""
    kv = import_script("kv_offload")
    w = kv.Workload(
        sessions=3,
        turns=3,
        prefix_tokens=8,
        user_tokens=2,
        output_tokens=1,
        concurrency=2,
        vocab_size=50,
    )
    texts = kv.prompts(w, seed=7)
    assert texts == kv.prompts(w, seed=7) and texts != kv.prompts(w, seed=8)
    for turns in texts:
        assert [len(t) for t in turns] == [10, 13, 16]
        for earlier, later in itertools.pairwise(turns):
            assert later[: len(earlier)] == earlier  # the chat resends its history
        assert all(kv.TOKEN_LOW <= tok < w.vocab_size for tok in turns[-1])
    assert w.max_prompt() == 16 and w.working_set_tokens() == 48
    order = kv.schedule(w, seed=1)
    assert sorted(order) == [(s, t) for s in range(3) for t in range(3)]
    assert [t for _, t in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_kv_offload_reads_the_counters_an_h200_recorded(import_script: ScriptImporter) -> None:
    kv = import_script("kv_offload")
    page = "\n".join(
        [
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits",
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0',
            'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 5.0',
            'vllm:kv_offload_load_bytes_total{engine="0"} 1.5e+09',
            'vllm:kv_offload_load_size_bucket{le="1"} 3.0',
            'vllm:kv_offload_load_size_created{engine="0"} 1.7e9',
            'vllm:num_requests_running{engine="0"} 2.0',
        ]
    )
    assert kv.counters(page) == {
        "vllm:prefix_cache_hits_total": 15.0,
        "vllm:kv_offload_load_bytes_total": 1.5e9,
    }
    blocks = [
        {"side": side, "pair": p, "ttft_p50_s": t, "ttft_p99_s": t * 2, "output_tok_s": r}
        | {"prefix_cache_hit_rate": 0.1}
        for p, (side, t, r) in enumerate(
            [("off", 1.0, 100.0), ("on", 0.5, 150.0), ("off", 1.0, 100.0), ("on", 0.5, 150.0)]
        )
    ]
    for b in blocks:  # pairs: (0, 1) and (2, 3)
        b["pair"] //= 2
    s = kv.summarize(blocks)
    assert s["ratio_on_off"]["ttft_p50_s"]["median"] == pytest.approx(0.5)
    assert s["ratio_on_off"]["output_tok_s"]["median"] == pytest.approx(1.5)
    assert "on/off (paired)" in kv.table_text({"summary": s, "blocks": blocks})


def test_capture_sizes_reads_the_charts_flags_from_its_rendering(
    import_script: ScriptImporter,
) -> None:
    """capture_sizes.py takes the chart's flags from the committed H200 rendering (which the
    test above keeps current), values up to the next flag, in the chart's own order."""
    cs = import_script("capture_sizes")
    argv = json.loads((GPU_SCRIPTS / "chart-defaults-h200.json").read_text())["argv"]
    flags = cs.chart_flags(argv)
    seqs = flags[flags.index("--max-num-seqs") + 1]
    sizes = flags[flags.index("--cudagraph-capture-sizes") + 1 :]
    assert sizes and all(s.isdigit() for s in sizes) and sizes[-1] == seqs
    with pytest.raises(ValueError, match="--cudagraph-capture-sizes"):
        cs.chart_flags([a for a in argv if a != "--cudagraph-capture-sizes"])


def test_capture_sizes_ratios_are_throughput_over_vllms_sizes(
    import_script: ScriptImporter,
) -> None:
    """A kind whose decode steps take half the time is reported twice as fast, the A/A near
    1, and the goal flag follows the chart's ratio."""
    cs = import_script("capture_sizes")
    engines = cs.engine_order(3)
    assert engines[:4] == [f"{k}.0" for k in cs.KINDS] and len(engines) == 12
    step = {"vllm_a": 2.0, "vllm_b": 2.0, "size64": 4.0, "chart": 1.0}
    forward = {64: {e: [step[e.split(".")[0]] * (1 + 0.01 * r) for r in range(4)] for e in engines}}
    wall = {64: {e: [0.5] * 4 for e in engines}}
    row = cs.summarise(forward, wall, engines, decode_steps=32, resamples=100)["64"]
    assert row["tokens_per_s"]["chart"] == pytest.approx(64 * 1000.0 / 1.015)
    assert row["ratio"]["chart"]["median"] == pytest.approx(2.0)
    assert row["ratio"]["size64"]["median"] == pytest.approx(0.5)
    assert row["ratio"]["vllm_b"]["median"] == pytest.approx(1.0)
    assert row["chart_meets_goal"] == {"estimate": True, "interval_lower": True}
    assert "| 64 |" in cs.throughput_table({"batches": {"64": row}})


def test_cold_start_drops_a_flag_with_its_values(import_script: ScriptImporter) -> None:
    cold = import_script("cold_start")
    argv = ["python3", "--max-num-seqs", "8", "--cudagraph-capture-sizes", "1", "2", "--port", "1"]
    assert cold.drop_flag(argv, "--cudagraph-capture-sizes") == [*argv[:3], "--port", "1"]
    assert cold.drop_flag(argv, "--absent") == argv


_FAKE_SERVER = """
import os, sys, http.server
print("pinned" if os.environ.get("VLLM_CPU_KVCACHE_SPACE") else "as given", flush=True)
sys.stdout.write("bar 1\\rbar 2\\n"); sys.stdout.flush()
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


@pytest.mark.network
def test_pod_server_hands_over_each_line_without_the_tests_environment(
    import_script: ScriptImporter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cold_start.py's server through the testkit: the pod's own command line, none of the
    tests' environment, each output line handed over as a text-mode pipe splits it (a
    progress bar's `\\r` ends a line) and still written to the log."""
    cold = import_script("cold_start")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    port = free_port()
    lines: list[str] = []
    server = cold.PodServer(
        "model",
        tmp_path / "server.log",
        port=port,
        test_env=False,
        on_line=lines.append,
        argv=[sys.executable, "-c", _FAKE_SERVER, str(port)],
    )
    with server.running():
        pass
    assert lines[:3] == ["as given", "bar 1", "bar 2"]
    assert (tmp_path / "server.log").read_text().splitlines()[:3] == lines[:3]
    assert server.process is not None and server.process.poll() is not None
