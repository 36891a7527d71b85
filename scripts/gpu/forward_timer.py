"""A vLLM worker extension that times the model's forward pass inside the engine.

Loaded into every vLLM worker with `vllm.LLM(..., worker_extension_cls=
"forward_timer.ForwardTimer")` (this folder on PYTHONPATH); the driver calls its methods
with `llm.collective_rpc("forward_timer_install")` / `("forward_timer_fetch")`.

What is timed: exactly the call the model runner makes to run the model on one batch,
in vLLM's own execution mode for that batch: a FULL CUDA-graph replay
(`cudagraph_manager.run_fullgraph`, V2 runner), or the torch.compile'd model with
piecewise graphs or none (`model.forward`); on the V1 runner, `_model_forward`. Input
preparation, the LM head and the sampler are shared vLLM code and stay outside. On CUDA
each call is bracketed by two CUDA events on the current stream (the GPU's own timeline:
host-side gaps before the launch do not count); elsewhere by `time.perf_counter` (CPU
execution is synchronous).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch


def _num_tokens(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    for name in ("input_ids", "positions"):
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor):
            return int(value.shape[-1])
    for value in args:
        if isinstance(value, torch.Tensor):
            return int(value.shape[-1])
        if hasattr(value, "num_tokens"):  # a batch descriptor (FULL graph replay)
            return int(value.num_tokens)
    return -1


class _Recorder:
    """Start/end marks per timed call; a depth counter keeps nested calls out."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.depth = 0
        self.calls: list[tuple[int, str, Any, Any]] = []

    def wrap(self, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            try:
                start = self._mark()
                out = fn(*args, **kwargs)
                self.calls.append((_num_tokens(args, kwargs), kind, start, self._mark()))
                return out
            finally:
                self.depth -= 1

        return timed

    def _mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def drain(self) -> list[tuple[int, str, float]]:
        if self.cuda:
            torch.cuda.synchronize()
            out = [(n, k, float(s.elapsed_time(e))) for n, k, s, e in self.calls]
        else:
            out = [(n, k, 1000.0 * (e - s)) for n, k, s, e in self.calls]
        self.calls.clear()
        return out


class ForwardTimer:
    """Mixed into vLLM's Worker class (`worker_extension_cls`)."""

    model_runner: Any  # set by the worker this class is mixed into

    def forward_timer_install(self) -> dict[str, Any]:
        """Wrap the runner's forward entry points (idempotent); say which were wrapped."""
        runner = self.model_runner
        if getattr(runner, "_forward_timer", None) is not None:
            return {"wrapped": runner._forward_timer_wrapped, "runner": type(runner).__name__}
        model = runner.model
        try:
            cuda = next(model.parameters()).is_cuda
        except StopIteration:
            cuda = torch.cuda.is_available()
        recorder = _Recorder(cuda)
        wrapped = []
        manager = getattr(runner, "cudagraph_manager", None)
        if manager is not None and hasattr(manager, "run_fullgraph"):
            manager.run_fullgraph = recorder.wrap(manager.run_fullgraph, "full_graph")
            wrapped.append("cudagraph_manager.run_fullgraph")
        if hasattr(runner, "cudagraph_manager"):  # V2 runner: eager/piecewise call model()
            model.forward = recorder.wrap(model.forward, "model")
            wrapped.append("model.forward")
        elif hasattr(runner, "_model_forward"):  # V1 runner (CUDA-graph wrapper inside)
            runner._model_forward = recorder.wrap(runner._model_forward, "model")
            wrapped.append("_model_forward")
        else:
            model.forward = recorder.wrap(model.forward, "model")
            wrapped.append("model.forward")
        runner._forward_timer = recorder
        runner._forward_timer_wrapped = wrapped
        return {"wrapped": wrapped, "runner": type(runner).__name__, "cuda": cuda}

    def forward_timer_fetch(self) -> list[tuple[int, str, float]]:
        """(num_tokens, kind, milliseconds) of every timed call since the last fetch."""
        recorder: _Recorder = self.model_runner._forward_timer
        return recorder.drain()

    def forward_timer_weight_bytes(self) -> dict[str, int]:
        """Bytes of the model's parameters and buffers, by dtype (after quantization)."""
        sizes: dict[str, int] = {}
        model = self.model_runner.model
        for tensor in [*model.parameters(), *model.buffers()]:
            key = str(tensor.dtype).removeprefix("torch.")
            sizes[key] = sizes.get(key, 0) + tensor.numel() * tensor.element_size()
        return sizes
