"""Test-only stand-in for a GPU under Ray, on PYTHONPATH of the test's Ray nodes and vLLM.

vLLM 0.32's CPU platform declares no Ray device (`CpuPlatform.ray_device_key == ""`), so its
Ray executor refuses to start ("current platform cpu does not support ray."). Its Ray
executor places one rank per Ray "GPU" and reads the ids Ray assigned; the chart's Ray nodes
advertise `--num-gpus=<ranks per node>`, which Ray counts without any device behind them.
This shim makes the CPU platform name "GPU" as its Ray device, so each rank takes one of
those slots and then runs as a CPU worker. It changes nothing else, and only processes that
have this folder on PYTHONPATH (`test_ray_group.py` sets it) load it.
"""

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

TARGET = "vllm.platforms.cpu"


class _RayDeviceKey(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            module.CpuPlatform.ray_device_key = "GPU"

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _RayDeviceKey())
