"""A vLLM GPU worker that times its own CUDA-graph capture.

vLLM logs the capture as "Graph capturing finished in %.0f secs", whole seconds, too coarse
for a start whose capture takes 1-5 s. Passed as `vllm.LLM(..., worker_cls=
"capture_timer.TimedWorker")` (this folder on PYTHONPATH), the worker times the model
runner's `capture_model()` call with `time.perf_counter` (the same span vLLM's log line
covers) and the device memory it took; the driver reads it with
`llm.collective_rpc("capture_timer_fetch")`. Kernel warm-up and compilation stay outside.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.worker.gpu_worker import Worker


class TimedWorker(Worker):
    """vLLM's GPU worker, its capture timed."""

    _capture: dict[str, Any] | None = None

    def compile_or_warm_up_model(self) -> Any:
        runner = self.model_runner
        capture = runner.capture_model

        def timed_capture() -> int:
            start = time.perf_counter()
            graph_bytes = int(capture())
            self._capture = {
                "seconds": time.perf_counter() - start,
                "graph_bytes": graph_bytes,
                "runner": type(runner).__name__,
                # the sizes as this worker's config holds them when it captures
                "sizes": list(self.vllm_config.compilation_config.cudagraph_capture_sizes or []),
            }
            return graph_bytes

        runner.capture_model = timed_capture
        try:
            return super().compile_or_warm_up_model()
        finally:
            runner.capture_model = capture

    def capture_timer_fetch(self) -> dict[str, Any] | None:
        """Seconds and bytes of this worker's capture; None when it captured nothing."""
        return self._capture
