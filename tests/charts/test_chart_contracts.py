"""What the chart passes to the real programs is accepted by them: the vLLM command line by
vLLM 0.32's own argument parser, the sidecar environment by the sidecar's settings class.
Neither server is started (no engine, no GPU): only their input contracts are exercised."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import pytest
from chartkit import Rendered

from ministream_sidecar.settings import ENV_PREFIX, SidecarSettings

PINNED_VLLM = "0.32.0"


@functools.cache
def _vllm_parser() -> Any:
    # Importing vLLM costs seconds: once per session.
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def _containers(rendered: Rendered) -> dict[str, dict[str, Any]]:
    spec = rendered.pod_template()["spec"]
    return {c["name"]: c for c in spec["containers"] + spec["initContainers"]}


def test_vllm_is_the_pinned_version() -> None:
    from ministream.versions import installed_vllm

    found = installed_vllm()
    assert found is not None, "vLLM is not installed"
    assert found[1].split("+")[0] == PINNED_VLLM


def test_vllm_accepts_the_rendered_command_line(rendered: Rendered, values: dict) -> None:
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    vllm = _containers(rendered)["vllm"]
    # One node: the module itself, on the CPU build through the image's entrypoint that execs
    # it with the same args; a multi-node leader: `sh -c "ray start … && exec python3 -m
    # vllm.entrypoints.openai.api_server "$@"" vllm`, the same args (test_chart_multinode.py).
    cpu = values["accelerator"]["type"] == "cpu"
    module = "ministream_sidecar.serve_vllm" if cpu else "vllm.entrypoints.openai.api_server"
    assert vllm["command"][-1] == module or vllm["command"][-2].endswith(
        'vllm.entrypoints.openai.api_server "$@"'
    )
    args = _vllm_parser().parse_args(vllm["args"])
    validate_parsed_serve_args(args)
    tp = values["parallelism"]["tensor"] or values["tensorParallelSize"] or 1
    assert args.tensor_parallel_size == tp
    assert args.pipeline_parallel_size == values["parallelism"]["pipeline"]
    assert args.served_model_name == [values["model"]["name"]]
    assert args.port == 8000
    assert args.shutdown_timeout == values["vllm"]["shutdownTimeoutSeconds"]
    if values["loading"]["mode"] == "runaiStreamer":
        assert args.model_loader_extra_config == {
            "concurrency": values["loading"]["s3"]["concurrency"],
            "memory_limit": values["loading"]["s3"]["memoryLimit"],
        }


def test_sidecar_accepts_the_rendered_environment(
    rendered: Rendered, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, cls = ENV_PREFIX, SidecarSettings
    sidecar = _containers(rendered)["sidecar"]
    ours = [e for e in sidecar["env"] if e["name"].startswith(prefix)]
    unknown = [e["name"] for e in ours if e["name"][len(prefix) :].lower() not in cls.model_fields]
    assert not unknown, f"the sidecar has no setting for {unknown}"
    for key in list(os.environ):
        if key.startswith(prefix) or key.startswith("POD_"):
            monkeypatch.delenv(key)
    for e in sidecar["env"]:
        # Secrets and downward-API fields get stand-in values, as the kubelet would fill them.
        monkeypatch.setenv(e["name"], e.get("value", f"stand-in-{e['name'].lower()}"))
    settings = cls()
    assert settings.port == 8081
    assert settings.vllm_url == "http://127.0.0.1:8000"
    info = {e["name"]: e.get("value") for e in ours}
    assert str(settings.info_tensor_parallel_size) == info[f"{prefix}INFO_TENSOR_PARALLEL_SIZE"]
    assert settings.drain_timeout_seconds == float(info[f"{prefix}DRAIN_TIMEOUT_SECONDS"])
    assert settings.pod_name == "stand-in-pod_name"
    json.dumps(settings.model_dump(mode="json"))  # every value is plain data
