"""The chart's vLLM command, environment and warmup settings, read from `helm template`.

The cold-start benchmark (cold_start.py) runs on a GPU machine without helm, so the
chart's defaults are rendered here into a JSON file that travels with the tree:

    python scripts/gpu/chart_args.py [--values FILE] --out scripts/gpu/chart-defaults.json
    python scripts/gpu/chart_args.py --set accelerator.memoryGiB=140 --set model.sizeGiB=3 \
        --out scripts/gpu/chart-defaults-h200.json   # + the chart's KV-cache size for one H200

Without `--out` the JSON goes to standard output. With it, a refused render leaves FILE as it
was (ministream.atomic_file).

Rendered with the chart's default values plus the minimal local-path scenario
(`charts/ministream/ci/local-tp1-values.yaml`) and any `--set`. Only literal env values are
kept (secrets and field refs have no meaning outside a pod). The H200 rendering gives
`h200.sh` the chart's own `--kv-cache-memory-bytes` for that GPU (nvidia-smi: 143 771 MiB,
i.e. 140 GiB; gpu-1b's 2.3 GB of weights rounded up to 3 GiB), so the formula is not
restated there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ministream.atomic_file import write_atomic
from ministream_testkit.helm import CHART, RenderError, render_text

WARMUP_ENV = {
    "MINISTREAM_SIDECAR_WARMUP_REQUESTS": "requests",
    "MINISTREAM_SIDECAR_WARMUP_CONCURRENCY": "concurrency",
    "MINISTREAM_SIDECAR_WARMUP_PROMPT_TOKENS": "prompt_tokens",
    "MINISTREAM_SIDECAR_WARMUP_MAX_TOKENS": "max_tokens",
}


def _documents(text: str) -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def extract(manifests: str) -> dict[str, Any]:
    """vLLM container command+args+literal env, and the sidecar's warmup settings."""
    deployment = next(d for d in _documents(manifests) if d.get("kind") == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    containers = spec.get("containers", []) + spec.get("initContainers", [])
    vllm = next(c for c in containers if c["name"] == "vllm")
    sidecar = next(c for c in containers if c["name"] == "sidecar")
    literal = {e["name"]: e["value"] for e in vllm.get("env", []) if "value" in e}
    warmup_env = {e["name"]: e.get("value") for e in sidecar.get("env", [])}
    return {
        "argv": [*vllm.get("command", []), *vllm.get("args", [])],
        "env": literal,
        "warmup": {key: int(warmup_env[env]) for env, key in WARMUP_ENV.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--values", default=str(CHART / "ci" / "local-tp1-values.yaml"))
    parser.add_argument("--helm", help="helm binary (default: helm_path's lookup)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a chart value, repeatable"
    )
    parser.add_argument("--out", type=Path, help="write the JSON here (default: standard output)")
    args = parser.parse_args(argv)
    try:
        text = render_text(values_files=[args.values], set_args=args.set, helm=args.helm)
    except RenderError as exc:  # a refused value: helm says which, and nothing is written
        sys.stderr.write(f"helm template failed:\n{exc}\n")
        return 2
    out = extract(text) | {"rendered_with": Path(args.values).name}
    if args.set:
        out["set"] = args.set
    text = json.dumps(out, indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        write_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
