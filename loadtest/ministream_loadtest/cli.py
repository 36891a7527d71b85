"""`ministream-loadtest`: SLO reports, the rolling-restart experiment, overload and soak.

    ministream-loadtest run --scenario short-chat [--scenario FILE ...] --base-url URL
                            --output-dir DIR [--model NAME] [--tokenizer PATH] [--dry-run]
                            [--rates 0.5,1,2 | --concurrency 1,2,4] [--requests N]
                            [--slo ttft_ms=800 ...] [--attainment 0.95] [--fail-on-slo]
    ministream-loadtest rollout --replicas N --output FILE.json --model DIR
                            [--no-drain | --control-restarts K [--control-endpoint-lag S]]
                            [--rollout-mode surge|inPlace] [--restarts K]
                            [--rate R] [--duration S] [--endpoint-lag S]
                            [--runtime process|podman]
                            [--front haproxy|router [--router-policy POLICY]
                             [--pd-pool prefill|decode]] [-- VLLM_ARGS...]
    ministream-loadtest overload --model DIR --output FILE.json [--levels 1,2,5]
                            [--level-seconds S] [--chart-set KEY=JSON ...] [-- VLLM_ARGS...]
    ministream-loadtest soak --model DIR --output FILE.json [--minutes M] [--rate R]
                            [--interval S] [-- VLLM_ARGS...]

rollout, overload and soak run the chart's rendered pod locally and share its options
(`pod_run.py`: --model, --output, --served-model-name, --tokenizer, --chart, --chart-values,
--chart-set, --helm, --workdir, --startup-timeout, --seed).
The load engine is `vllm bench serve` (engine.py); an API key is read from OPENAI_API_KEY.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, get_args

from ministream_testkit.results import write_json

from . import pod_run
from .chart_pod import ChartError
from .engine import MAIN_RUN_MARKER, Slo, run_engine, run_engines_together
from .fronts import FrontKind
from .kube_play import KubePlayError
from .pd_pools import FIXED_POOL_REPLICAS, PD_POOLS
from .rollout import RolloutConfig, Runtime
from .scenarios import Scenario, Sweep, load_scenario, resolve_scenario, shipped_names

Subparsers = argparse._SubParsersAction  # what add_subparsers returns


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("values must be positive")
    return values


def _slo_pair(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    if not sep or key not in ("ttft_ms", "tpot_ms", "e2el_ms"):
        raise argparse.ArgumentTypeError("--slo takes ttft_ms=N, tpot_ms=N or e2el_ms=N")
    return key, float(value)


def _seconds_or_inf(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0 (or inf)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ministream-loadtest",
        description="Load tests of the MiniStream OpenAI API through vLLM's `vllm bench "
        "serve`: SLO reports (JSON + PNG), the rolling-restart experiment, overload with the "
        "chart's probes, and a memory soak.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_parser(sub)
    _add_rollout_parser(sub)
    _add_bad_release_parser(sub)
    _add_overload_parser(sub)
    _add_soak_parser(sub)
    return parser


def _add_run_parser(sub: Subparsers) -> None:
    run = sub.add_parser("run", help="SLO report: scenarios x sweep points against a server")
    run.add_argument(
        "--scenario",
        action="append",
        required=True,
        help=f"scenario file, or the name of a bundled one ({', '.join(shipped_names())}); "
        "repeatable",
    )
    run.add_argument(
        "--base-url", default="http://127.0.0.1:8000", help="OpenAI API base URL (no /v1)"
    )
    run.add_argument(
        "--serve",
        metavar="MODEL_DIR",
        help="start a local pod (vLLM + sidecar, as `ministream up`) serving this "
        "model for the run, instead of using --base-url; vLLM arguments go after --",
    )
    pod_run.add_chart_options(
        run, "with --serve: the chart whose rendered pod settings the pod runs"
    )
    run.add_argument(
        "--model",
        help="served model name (default: the server's first model; with --serve: ministream)",
    )
    run.add_argument(
        "--tokenizer",
        help="local directory with the model's tokenizer (default: "
        "the served model's path, when it exists on this machine)",
    )
    run.add_argument(
        "--output-dir", type=Path, help="report, plots and raw results (required unless --dry-run)"
    )
    sweep = run.add_mutually_exclusive_group()
    sweep.add_argument("--rates", type=_floats, help="override the sweep: requests/s values")
    sweep.add_argument(
        "--concurrency", type=_floats, help="override the sweep: concurrent-request values"
    )
    run.add_argument("--requests", type=int, help="override the requests per sweep point")
    run.add_argument(
        "--slo",
        type=_slo_pair,
        action="append",
        default=[],
        help="override one SLO, e.g. ttft_ms=800 (repeatable)",
    )
    run.add_argument(
        "--attainment",
        type=float,
        help="share of requests that must meet the SLOs for a point to pass",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument(
        "--fail-on-slo",
        action="store_true",
        help="exit 1 when a sweep point misses its SLO attainment",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="load and check the scenarios with the overrides, print each one's plan and exit "
        "without starting or contacting a server",
    )


def _add_rollout_parser(sub: Subparsers) -> None:
    ro = sub.add_parser("rollout", help="rolling restart of N local replicas under load")
    ro.add_argument("--replicas", type=int, required=True)
    pod_run.add_options(
        ro,
        "the chart whose rendered pod and rollout strategy are replayed",
        report="JSON report (a PNG goes beside)",
    )
    ro.add_argument(
        "--no-drain",
        dest="drain",
        action="store_false",
        help="control run: no preStop /drain before SIGTERM",
    )
    ro.add_argument(
        "--control-restarts",
        type=int,
        default=0,
        metavar="K",
        help="paired control: the last K replacements of this run skip the preStop /drain "
        "(the report splits the restart window per replacement)",
    )
    ro.add_argument(
        "--control-endpoint-lag",
        type=_seconds_or_inf,
        metavar="S",
        help="the control replacements' --endpoint-lag (default: --endpoint-lag)",
    )
    ro.add_argument(
        "--rollout-mode", choices=["surge", "inPlace"], help="default: the chart's rollout.mode"
    )
    ro.add_argument("--restarts", type=int, help="pods to replace (default: all)")
    ro.add_argument("--rate", type=float, default=2.0, help="requests/s of streaming load")
    ro.add_argument("--input-tokens", type=int, default=32)
    ro.add_argument("--output-tokens", type=int, default=32)
    ro.add_argument(
        "--duration",
        type=float,
        help="most seconds of load (default: room for every pod to use its whole "
        "startup timeout and grace period); the load ends --tail s after the rollout",
    )
    ro.add_argument(
        "--lead-in", type=float, default=10.0, help="seconds of load before the first restart"
    )
    ro.add_argument("--tail", type=float, default=15.0, help="seconds of load after the rollout")
    ro.add_argument(
        "--endpoint-lag",
        type=_seconds_or_inf,
        default=2.0,
        help="seconds before a terminating pod leaves the load balancer (the "
        "EndpointSlice/kube-proxy propagation delay); inf: only /readyz counts",
    )
    _add_runtime_option(ro)
    ro.add_argument(
        "--front",
        choices=get_args(FrontKind),
        default="haproxy",
        help="what takes the load: haproxy (a Kubernetes Service: the readiness probe as its "
        "health check, a terminating pod DRAINed after --endpoint-lag) or router (vLLM's "
        "router with the chart's arguments, router.enabled; its discovery adds a pod once "
        "the readiness probe passes and removes it when not ready or --endpoint-lag after "
        "its termination began)",
    )
    ro.add_argument(
        "--router-policy",
        help="with --front router: the router's --policy (the chart's router.policy; default: "
        "the chart's)",
    )
    ro.add_argument(
        "--pd-pool",
        choices=PD_POOLS,
        help="with --front router: prefill/decode disaggregation (the chart's "
        "disaggregation.enabled): roll this pool's --replicas pods while the other pool runs "
        f"{FIXED_POOL_REPLICAS}; each pod on a loopback address of its own with its pool's "
        "rendered vLLM arguments and NIXL environment, found by the router's own discovery "
        "through the chart's pool selectors; the report adds the decode pods' NIXL transfer "
        "and failure counts",
    )


def _add_runtime_option(parser: argparse.ArgumentParser) -> None:
    """`--runtime`, shared by the experiments that run on `rollout.py`'s fleet."""
    parser.add_argument(
        "--runtime",
        choices=get_args(Runtime),
        default="process",
        help="process: each pod is a local vLLM and sidecar process; podman: each pod is the "
        "chart's rendered pod run from the images (`make images`) by `podman kube play` "
        "(root; CONTAINERS_CONF from `scripts/images.py env`)",
    )


def _add_bad_release_parser(sub: Subparsers) -> None:
    from .bad_release import BAD_KINDS

    br = sub.add_parser(
        "bad-release",
        help="upgrade N local replicas under load to releases that never turn ready, then "
        "roll back",
    )
    br.add_argument("--replicas", type=int, default=2)
    pod_run.add_options(
        br, "the chart whose rendered pod, rollout and progress deadline are replayed"
    )
    br.add_argument(
        "--kind",
        dest="kinds",
        action="append",
        choices=BAD_KINDS,
        help=f"bad release(s) to run in order, on one fleet (default: {', '.join(BAD_KINDS)})",
    )
    br.add_argument(
        "--shards",
        help="wrong-tp: a shard set made for another tensor-parallel size than the pods' "
        "(`ministream shard --model MODEL -tp 2 --output DIR`)",
    )
    br.add_argument(
        "--stall-seconds",
        type=float,
        help="end each stall this many seconds after the upgrade (once the new pod failed to "
        "start) instead of at the rendered progressDeadlineSeconds",
    )
    br.add_argument(
        "--rollout-mode", choices=["surge", "inPlace"], help="default: the chart's rollout.mode"
    )
    br.add_argument("--rate", type=float, default=2.0, help="requests/s of streaming load")
    br.add_argument("--input-tokens", type=int, default=32)
    br.add_argument("--output-tokens", type=int, default=32)
    br.add_argument(
        "--lead-in", type=float, default=10.0, help="seconds of load before the upgrade"
    )
    br.add_argument(
        "--tail", type=float, default=15.0, help="seconds of load after the last rollback"
    )
    br.add_argument(
        "--endpoint-lag",
        type=float,
        default=2.0,
        help="seconds before a terminating pod leaves the load balancer",
    )
    _add_runtime_option(br)


def _add_overload_parser(sub: Subparsers) -> None:
    ov = sub.add_parser(
        "overload",
        help="one pod at 1x, 2x, 5x its measured capacity, the chart's probes replayed",
    )
    pod_run.add_options(ov, "the chart whose rendered pod and probes are replayed")
    ov.add_argument("--levels", type=_floats, default=(1.0, 2.0, 5.0), help="multiples of capacity")
    ov.add_argument(
        "--level-seconds", type=float, default=60.0, help="arrivals per level last this"
    )
    ov.add_argument("--input-tokens", type=int, default=64)
    ov.add_argument("--output-tokens", type=int, default=64)
    ov.add_argument("--capacity-concurrency", type=int, default=32)
    ov.add_argument("--capacity-requests", type=int, default=96)
    ov.add_argument(
        "--request-timeout",
        type=float,
        default=60.0,
        help="a request whose E2E latency exceeds this counts as timed out",
    )


def _add_soak_parser(sub: Subparsers) -> None:
    so = sub.add_parser(
        "soak", help="one pod under moderate load for a bounded time, its RSS sampled"
    )
    pod_run.add_options(so, "the chart whose rendered pod is run")
    so.add_argument("--minutes", type=float, default=30.0)
    so.add_argument("--rate", type=float, default=2.0, help="requests/s (Poisson)")
    so.add_argument("--input-tokens", type=int, default=64)
    so.add_argument("--output-tokens", type=int, default=32)
    so.add_argument("--interval", type=float, default=10.0, help="seconds between RSS samples")
    so.add_argument(
        "--max-growth-mib",
        type=float,
        default=8.0,
        help="the sidecar passes when its median RSS grew by less than this from the first "
        "to the last 5 minutes",
    )


# --- run ------------------------------------------------------------------------------------
def _served_model(base_url: str) -> dict[str, Any]:
    import os

    request = urllib.request.Request(f"{base_url.rstrip('/')}/v1/models")
    if key := os.environ.get("OPENAI_API_KEY"):
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=30) as resp:
        models: list[dict[str, Any]] = json.loads(resp.read())["data"]
    if not models:
        raise SystemExit(f"{base_url}/v1/models lists no model")
    return models[0]


def _resolve_target(args: argparse.Namespace) -> tuple[str, str]:
    info: dict[str, Any] | None = None
    model = args.model
    if model is None:
        info = _served_model(args.base_url)
        model = info["id"]
    tokenizer = args.tokenizer
    if tokenizer is None:
        info = info or _served_model(args.base_url)
        root = info.get("root") or info["id"]
        if not Path(root).is_dir():
            raise SystemExit(
                f"the served model's path {root!r} is not on this machine: pass --tokenizer "
                "with a local copy of the converted model directory (its tokenizer files)"
            )
        tokenizer = root
    return model, tokenizer


def cmd_run(args: argparse.Namespace, vllm_args: list[str]) -> int:
    # Scenarios first: a bad file or override fails before an engine is started.
    scenarios = _load_scenarios(args)
    if args.dry_run:
        for sc in scenarios:
            _print_plan(sc)
        return 0
    if args.output_dir is None:
        raise SystemExit("ministream-loadtest run: --output-dir is required (except --dry-run)")
    if not args.serve:
        if vllm_args:
            raise SystemExit("arguments after -- go to vLLM and need --serve")
        return _run_scenarios(args, scenarios)
    from ministream_testkit.net import free_port

    from .chart_pod import chart_pod
    from .fleet import Pod, PodTemplate
    from .haproxy import Slot

    args.model = args.model or "ministream"
    template = PodTemplate(
        model=args.serve,
        served_name=args.model,
        vllm_args=tuple(vllm_args),
        chart=chart_pod(args.chart, args.chart_values, dict(args.chart_set), helm=args.helm),
        log_dir=args.output_dir / "logs",
    )
    pod = Pod("server", Slot(0, free_port(), free_port()), template)
    print(
        f"starting vLLM + sidecar for {args.serve} (logs in {template.log_dir})",
        file=sys.stderr,
        flush=True,
    )
    try:
        pod.start()
        ready = pod.wait_ready(timeout=1800)
        print(
            f"ready after {ready - pod.events['created']:.1f}s at {pod.api_url}",
            file=sys.stderr,
            flush=True,
        )
        args.base_url = pod.api_url
        return _run_scenarios(args, scenarios)
    finally:
        pod.kill()


def _load_scenarios(args: argparse.Namespace) -> list[Scenario]:
    scenarios: list[Scenario] = []
    for ref in args.scenario:
        sc = load_scenario(resolve_scenario(ref))
        slo = sc.slo
        if args.slo:
            slo = Slo(**{**slo.as_dict(), **dict(args.slo)})
        sweep = (
            Sweep("rate", args.rates)
            if args.rates
            else Sweep("concurrency", args.concurrency)
            if args.concurrency
            else None
        )
        scenarios.append(
            sc.with_overrides(
                requests=args.requests, sweep=sweep, slo=slo, attainment=args.attainment
            )
        )
    return scenarios


def _print_plan(sc: Scenario) -> None:
    slo = " ".join(f"{k}<={v:g}" for k, v in sc.slo.as_dict().items()) or "none"
    rr = sc.range_ratio
    ratio = f"{rr:g}" if isinstance(rr, float) else ", ".join(f"{k} {v:g}" for k, v in rr.items())
    print(
        f"{sc.name}: {sc.path}\n"
        f"  {sc.api} API, {sc.input_tokens} in / {sc.output_tokens} out tokens "
        f"(range ratio {ratio}), {sc.requests} requests per sweep point\n"
        f"  sweep {sc.sweep.mode}: {', '.join(f'{v:g}' for v in sc.sweep.values)}\n"
        f"  SLO {slo}, attainment {sc.attainment:g}; "
        f"needs --max-model-len >= {sc.max_tokens_per_request}",
        flush=True,
    )


def _run_scenarios(args: argparse.Namespace, scenarios: list[Scenario]) -> int:
    from .plots import plot_scenario
    from .slo import point_report, report, scenario_report

    model, tokenizer = _resolve_target(args)
    out: Path = args.output_dir
    (out / "raw").mkdir(parents=True, exist_ok=True)
    reports, missed = [], 0
    for j, sc in enumerate(scenarios):
        if sc.mix:
            points = _run_mix(args, sc, model, tokenizer, out, seed=args.seed + 100_000 * j)
            missed += sum(p["goodput"]["passed"] is False for p in points)
            reports.append(scenario_report(sc, points))
            continue
        tags = [f"{sc.name}-{sc.sweep.mode}{value:g}" for value in sc.sweep.values]
        # A seed per point and scenario: vLLM caches prefixes, so a point that replayed earlier
        # prompts would measure cache hits (measured: 10x lower TTFT), not prefill.
        runs = [
            (
                sc.load_spec(
                    value,
                    base_url=args.base_url,
                    model=model,
                    tokenizer=tokenizer,
                    seed=args.seed + 1000 * i + 100_000 * j,
                ),
                out / "raw" / f"{tag}.json",
            )
            for i, (value, tag) in enumerate(zip(sc.sweep.values, tags, strict=True))
        ]
        print(
            f"[{sc.name}] {len(runs)} sweep points x {sc.requests} requests "
            f"({sc.input_tokens} in / {sc.output_tokens} out, {sc.api} API) against "
            f"{args.base_url}",
            file=sys.stderr,
            flush=True,
        )
        progress = iter(tags)

        def show(line: str, progress: Iterator[str] = progress) -> None:
            if MAIN_RUN_MARKER in line:
                print(f"  {next(progress, '?')}: sending", file=sys.stderr, flush=True)

        results = run_engine(runs, out / "logs" / f"{sc.name}.log", on_line=show)
        points = []
        for value, tag, (_, raw), result in zip(sc.sweep.values, tags, runs, results, strict=True):
            point = point_report(result, scenario=sc, value=value, raw_file=raw, report_dir=out)
            points.append(point)
            missed += point["goodput"]["passed"] is False
            print(
                f"  {tag}: failed {point['requests']['failed']}, p99 TTFT "
                f"{point['ttft_ms']['p99']:.0f} ms, p99 E2E {point['e2el_ms']['p99']:.0f} ms, "
                f"{point['throughput']['output_tokens_per_s']:.1f} tok/s, SLO attainment "
                f"{point['goodput']['attainment']}",
                file=sys.stderr,
                flush=True,
            )
        reports.append(scenario_report(sc, points))
    full = report(
        reports, base_url=args.base_url, model=model, command=["ministream-loadtest", *sys.argv[1:]]
    )
    full["plots"] = [
        str(plot_scenario(s, out / f"{s['name']}.png").relative_to(out))
        for s in reports
        if not any("model" in p for p in s["points"])  # a mix reports per model, not per load
    ]
    write_json(out / "report.json", full)
    print(f"report: {out / 'report.json'}", flush=True)
    return 1 if args.fail_on_slo and missed else 0


def _run_mix(
    args: argparse.Namespace, sc: Scenario, model: str, tokenizer: str, out: Path, *, seed: int
) -> list[dict[str, Any]]:
    """A mixed scenario: per sweep point one engine per model at once; one point per model."""
    from .slo import point_report

    points = []
    for i, value in enumerate(sc.sweep.values):
        tag = f"{sc.name}-{sc.sweep.mode}{value:g}"
        parts = sc.mix_specs(
            value, base_url=args.base_url, model=model, tokenizer=tokenizer, seed=seed + 1000 * i
        )
        runs = [(spec, out / "raw" / f"{tag}-{name}.json") for name, spec in parts]
        print(f"[{sc.name}] {tag}: {', '.join(n for n, _ in parts)} at once", file=sys.stderr)
        results = run_engines_together(runs, out / "logs")
        for (name, _), (_, raw), result in zip(parts, runs, results, strict=True):
            point = point_report(result, scenario=sc, value=value, raw_file=raw, report_dir=out)
            point = {"model": name, **point}
            points.append(point)
            print(
                f"  {tag} {name}: failed {point['requests']['failed']}, p99 TTFT "
                f"{point['ttft_ms']['p99']:.0f} ms, p99 E2E {point['e2el_ms']['p99']:.0f} ms, "
                f"SLO attainment {point['goodput']['attainment']}",
                file=sys.stderr,
                flush=True,
            )
    return points


# --- rollout --------------------------------------------------------------------------------
def _check_front(args: argparse.Namespace) -> None:
    """--front and its options, checked before anything starts."""
    if args.front != "router":
        if args.router_policy:
            raise SystemExit("--router-policy needs --front router")
        if args.pd_pool:
            raise SystemExit("--pd-pool needs --front router (P/D pools are paired by the router)")
        return
    if args.runtime != "process":
        raise SystemExit("--front router runs with --runtime process (podman pods: not tried)")
    from .router_front import require_router

    require_router()  # FileNotFoundError: main names the install step


def _rollout_config(args: argparse.Namespace, vllm_args: list[str], **more: Any) -> RolloutConfig:
    """The rollout's settings from the flags `run` and `bad-release` share; `more` sets the
    others."""
    return RolloutConfig(
        pod=pod_run.from_args(args, vllm_args),
        replicas=args.replicas,
        rollout_mode=args.rollout_mode,
        rate=args.rate,
        input_tokens=args.input_tokens,
        output_tokens=args.output_tokens,
        lead_in=args.lead_in,
        tail=args.tail,
        endpoint_lag=args.endpoint_lag,
        runtime=args.runtime,
        **more,
    )


def cmd_rollout(args: argparse.Namespace, vllm_args: list[str]) -> int:
    from .rollout import run_rollout

    cfg = _rollout_config(
        args,
        vllm_args,
        drain=args.drain,
        control_restarts=args.control_restarts,
        control_endpoint_lag=args.control_endpoint_lag,
        restarts=args.restarts,
        duration=args.duration,
        front=args.front,
        router_policy=args.router_policy,
        pd_pool=args.pd_pool,
    )
    report = run_rollout(cfg)
    window = report["restart_window"]
    e2e = window["e2el_ms"]
    print(
        json.dumps(
            {
                "sent": report["sent"],
                "succeeded": report["succeeded"],
                "failed": report["failed"],
                "failures_by_cause": report["failures_by_cause"],
                "failures_by_pod": report["failures_by_pod"],
                "front": report["front"]["name"],
                **(
                    {"router_counters": report["front"]["router_counters"]}
                    if "router_counters" in report["front"]
                    else {}
                ),
                **({"pd": _pd_summary(report["pd"])} if "pd" in report else {}),
                "replacements": [
                    f"{r['old']} -> {r['new']} ({'drain' if r['drain'] else 'control'}): "
                    f"{r['window']['failed']} of {r['window']['sent']} failed"
                    for r in report["replacements"]
                ],
                "restart_window_s": window["duration_s"],
                "window_e2el_ms": {k: e2e[k] for k in ("p50", "p95", "p99")},
                "report": str(args.output),
            },
            indent=2,
        ),
        flush=True,
    )
    if not report["load_covered_rollout"]:
        print("the load ended before the rollout did: raise --duration", file=sys.stderr)
        return 1
    return 0


def _pd_summary(pd: dict[str, Any]) -> dict[str, Any]:
    """The P/D block of the printed summary: the rolled pool and the NIXL counts (decode
    pods' transfers and failures, prefill pods' reads after a lease expired)."""
    nixl = pd["nixl"]
    return {
        "rolled_pool": pd["rolled_pool"],
        "nixl_transfers": nixl["transfers"],
        "nixl_failed": nixl["failed"],
        "nixl_read_late": nixl["read_late"],
    }


def cmd_bad_release(args: argparse.Namespace, vllm_args: list[str]) -> int:
    from .bad_release import BAD_KINDS, BadReleaseConfig, run_bad_release, table

    cfg = BadReleaseConfig(
        rollout=_rollout_config(args, vllm_args),
        kinds=tuple(args.kinds or BAD_KINDS),
        shards=args.shards,
        stall_seconds=args.stall_seconds,
    )
    report = run_bad_release(cfg)
    print(table(report), flush=True)
    print(
        f"sent {report['sent']}, failed {report['failed']}; report: {args.output}; "
        f"goal met: {report['goal_met']}",
        flush=True,
    )
    return 0 if report["goal_met"] else 1


def cmd_overload(args: argparse.Namespace, vllm_args: list[str]) -> int:
    from .overload import OverloadConfig, run_overload, table

    cfg = OverloadConfig(
        pod=pod_run.from_args(args, vllm_args),
        levels=tuple(args.levels),
        level_seconds=args.level_seconds,
        input_tokens=args.input_tokens,
        output_tokens=args.output_tokens,
        capacity_concurrency=args.capacity_concurrency,
        capacity_requests=args.capacity_requests,
        request_timeout=args.request_timeout,
    )
    report = run_overload(cfg)
    print(table(report), flush=True)
    print(f"report: {args.output}; goal met: {report['goal_met']}", flush=True)
    return 0 if report["goal_met"] else 1


def cmd_soak(args: argparse.Namespace, vllm_args: list[str]) -> int:
    from .soak import SoakConfig, run_soak

    if args.minutes <= 0 or args.rate <= 0 or args.interval <= 0:
        raise SystemExit("--minutes, --rate and --interval must be positive")
    report = run_soak(
        SoakConfig(
            pod=pod_run.from_args(args, vllm_args),
            minutes=args.minutes,
            rate=args.rate,
            input_tokens=args.input_tokens,
            output_tokens=args.output_tokens,
            interval=args.interval,
            max_growth_mib=args.max_growth_mib,
        )
    )
    rss = report["rss"]
    print(json.dumps({"requests": report["requests"]["sent"], "rss": rss}, indent=2), flush=True)
    print(f"report: {args.output}; sidecar flat: {report['sidecar_flat']}", flush=True)
    return 0 if report["sidecar_flat"] else 1


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, extra = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    args = build_parser().parse_args(own)
    # SIGTERM (e.g. a CI timeout) unwinds like Ctrl-C, so every started process is stopped.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        if args.command == "run":
            return cmd_run(args, extra)
        if args.command == "overload":
            return cmd_overload(args, extra)
        if args.command == "soak":
            return cmd_soak(args, extra)
        if args.command == "bad-release":
            return cmd_bad_release(args, extra)
        if args.replicas < 1 or (args.restarts is not None and args.restarts < 1):
            raise SystemExit("--replicas and --restarts must be >= 1")
        if math.isnan(args.endpoint_lag) or (
            args.control_endpoint_lag is not None and math.isnan(args.control_endpoint_lag)
        ):
            raise SystemExit("--endpoint-lag must be a number of seconds or inf")
        if not args.drain and args.control_restarts:
            raise SystemExit(
                "--no-drain makes every replacement a control: drop --control-restarts"
            )
        _check_front(args)
        return cmd_rollout(args, extra)
    except KeyboardInterrupt:
        print("interrupted: stopped every process this run started", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, ChartError, KubePlayError) as exc:
        print(f"ministream-loadtest: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
