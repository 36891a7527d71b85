"""What every local-pod experiment (rollout, overload, soak) is told, in one place.

Each experiment runs the chart's rendered pod (vLLM + the sidecar) on this machine; they
share how that pod is made (model, served name, vLLM's extra arguments, the chart and how it
is rendered, helm) and where results go. `PodRun` holds those fields once, `add_options`
puts them on a subcommand's parser once, and `from_args` reads them back, so the defaults
cannot drift apart between the three.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .chart_pod import DEFAULT_CHART, ChartPod, chart_pod
from .fleet import PodTemplate


@dataclass(frozen=True)
class PodRun:
    model: str  # converted model directory the pods serve
    output: Path  # the JSON report
    served_name: str = "ministream"
    tokenizer: str | None = None  # default: the model directory
    vllm_args: tuple[str, ...] = ()  # the caller's vLLM arguments (after the chart's)
    chart: Path = DEFAULT_CHART  # the Helm chart whose rendered pod is run
    chart_values: tuple[Path, ...] = ()  # extra values files (helm -f)
    chart_sets: dict[str, Any] = field(default_factory=dict)  # helm --set-json pairs
    helm: str | None = None  # helm binary; None: ministream_testkit.helm.helm_path's order
    startup_timeout: float = 900.0
    workdir: Path | None = None  # logs and raw results; None: beside the report
    seed: int = 0

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.model

    def work_dir(self, suffix: str) -> Path:
        """The run's working folder: `workdir`, else `<report stem><suffix>` beside it."""
        return self.workdir or self.output.with_name(self.output.stem + suffix)

    def render(self, sets: dict[str, Any] | None = None, pool: str | None = None) -> ChartPod:
        """The chart's pod, rendered with the run's values and `sets` on top; `pool`: with
        `disaggregation.enabled`, the prefill or decode pool's."""
        return chart_pod(
            self.chart, self.chart_values, {**self.chart_sets, **(sets or {})}, self.helm, pool
        )

    def template(self, chart: ChartPod, log_dir: Path) -> PodTemplate:
        """What every pod of the run runs: the rendered chart pod, serving the run's model."""
        return PodTemplate(
            model=self.model,
            served_name=self.served_name,
            vllm_args=self.vllm_args,
            chart=chart,
            log_dir=log_dir,
        )

    def as_report(self) -> dict[str, Any]:
        """The fields as JSON values, for a report's `config`."""
        return {
            "model": self.model,
            "output": str(self.output),
            "served_name": self.served_name,
            "tokenizer": self.tokenizer,
            "vllm_args": list(self.vllm_args),
            "chart": str(self.chart),
            "chart_values": [str(p) for p in self.chart_values],
            "chart_sets": dict(self.chart_sets),
            "helm": self.helm,
            "startup_timeout": self.startup_timeout,
            "workdir": None if self.workdir is None else str(self.workdir),
            "seed": self.seed,
        }


def _chart_set(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=JSON, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key}: not JSON: {value!r}") from None


def add_chart_options(parser: argparse.ArgumentParser, what: str) -> None:
    """--chart, --chart-values, --chart-set and --helm: how the chart is rendered."""
    parser.add_argument("--chart", type=Path, default=DEFAULT_CHART, help=what)
    parser.add_argument(
        "--chart-values",
        type=Path,
        action="append",
        default=[],
        help="values file for `helm template -f` (repeatable)",
    )
    parser.add_argument(
        "--chart-set",
        type=_chart_set,
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a chart value for `helm template --set-json`, e.g. vllm.maxQueuedRequests=64 "
        "(repeatable)",
    )
    parser.add_argument("--helm", help="helm binary (default: .tools/bin/helm, else PATH)")


def add_options(parser: argparse.ArgumentParser, what: str, report: str = "JSON report") -> None:
    """The PodRun fields as options of one subcommand; `what` describes --chart."""
    parser.add_argument("--model", required=True, help="converted model directory to serve")
    parser.add_argument("--output", type=Path, required=True, help=report)
    parser.add_argument("--served-model-name", default="ministream")
    parser.add_argument("--tokenizer", help="tokenizer directory (default: --model)")
    add_chart_options(parser, what)
    parser.add_argument(
        "--workdir", type=Path, help="logs and raw results (default: beside --output)"
    )
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=0)


def from_args(args: argparse.Namespace, vllm_args: list[str]) -> PodRun:
    return PodRun(
        model=args.model,
        output=args.output,
        served_name=args.served_model_name,
        tokenizer=args.tokenizer,
        vllm_args=tuple(vllm_args),
        chart=args.chart,
        chart_values=tuple(args.chart_values),
        chart_sets=dict(args.chart_set),
        helm=args.helm,
        startup_timeout=args.startup_timeout,
        workdir=args.workdir,
        seed=args.seed,
    )
