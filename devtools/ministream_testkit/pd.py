"""Prefill/decode disaggregation on one host: what the chart gives a P/D replica (vLLM's
`--kv-transfer-config`, NIXL's and UCX's environment), read from `helm template`, with only what
a cluster provides per pod swapped for local values.

In a cluster every pod has its own IP, so both pools use NIXL's side-channel port 5600 and
the same UCX port range. On one host the replicas share 127.0.0.1: each gets its own
side-channel port and its own UCX range, and the side channel advertises 127.0.0.1 instead of
the pod IP (`status.podIP`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ministream_testkit.helm import CHART, render

PD_VALUES = CHART / "ci" / "pd-values.yaml"
# The replicas started from these renders run vLLM's CPU build: the chart's UCX_TLS depends on
# the accelerator (a GPU render's names cuda_copy). A later `--set` wins (a GPU host's file).
CPU = "accelerator.type=cpu"
POOL_LABEL = "ministream.io/pool"
NIXL_ENV_PREFIXES = ("VLLM_NIXL_", "UCX_")


@dataclass(frozen=True)
class PDEngine:
    """The chart's P/D additions to a replica: vLLM arguments and literal environment."""

    args: tuple[str, ...]
    env: dict[str, str]

    @property
    def kv_load_failure_policy(self) -> str:
        """vLLM's `kv_load_failure_policy` in the rendered `--kv-transfer-config`."""
        config = json.loads(self.args[self.args.index("--kv-transfer-config") + 1])
        return str(config["kv_load_failure_policy"])

    def with_kv_extra(self, **extra: Any) -> PDEngine:
        """The same replica with `extra` merged into its `--kv-transfer-config`'s
        `kv_connector_extra_config`."""
        args = list(self.args)
        i = args.index("--kv-transfer-config") + 1
        config = json.loads(args[i])
        config["kv_connector_extra_config"] = {
            **config.get("kv_connector_extra_config", {}),
            **extra,
        }
        args[i] = json.dumps(config)
        return replace(self, args=tuple(args))

    def local_env(self, side_channel_port: int, ucx_ports: tuple[int, int]) -> dict[str, str]:
        """The environment of one local replica: the chart's, with the per-pod values of a
        cluster (address, ports) made unique on this host."""
        return {
            **self.env,
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port),
            "UCX_TCP_PORT_RANGE": f"{ucx_ports[0]}-{ucx_ports[1]}",
        }


def _vllm_container(docs: list[dict[str, Any]], pool: str) -> dict[str, Any]:
    for doc in docs:
        labels = doc.get("metadata", {}).get("labels", {})
        if doc["kind"] == "Deployment" and labels.get(POOL_LABEL) == pool:
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c["name"] == "vllm":
                    return c
    raise LookupError(f"no {pool} Deployment with a vllm container rendered")


def nixl_env(container: dict[str, Any]) -> dict[str, str]:
    """The rendered vLLM container's NIXL and UCX variables with literal values (those the
    cluster fills per pod, e.g. the side-channel host, are `pod_ip_env`'s)."""
    return {
        e["name"]: str(e["value"])
        for e in container.get("env", [])
        if "value" in e and e["name"].startswith(NIXL_ENV_PREFIXES)
    }


def pod_ip_env(container: dict[str, Any]) -> tuple[str, ...]:
    """The rendered container's variables whose value is the pod's own IP (`status.podIP`)."""
    return tuple(
        e["name"]
        for e in container.get("env", [])
        if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP"
    )


def chart_pd_engine(values: Path = PD_VALUES, pool: str = "decode", *sets: str) -> PDEngine:
    """What P/D behind the router adds to the `pool`'s vLLM container: the arguments absent
    from the same release without both (the connector's, and what the router's policy needs,
    e.g. cache_aware's render endpoints), and the NIXL_/UCX_ variables with literal values.
    `sets`: `helm --set` values of both renders (`disaggregation.kvLoadFailurePolicy=...`),
    after `accelerator.type=cpu`."""
    sets = (CPU, *sets)
    on = _vllm_container(render(values_files=[values], set_args=sets), pool)
    off_docs = render(
        values_files=[values],
        set_args=(*sets, "disaggregation.enabled=false", "router.enabled=false"),
    )
    (off,) = [
        c
        for d in off_docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == "server"
        for c in d["spec"]["template"]["spec"]["containers"]
        if c["name"] == "vllm"
    ]
    on_args = [str(a) for a in on["args"]]
    off_args = [str(a) for a in off["args"]]
    added = [a for a in on_args if a not in off_args]
    return PDEngine(tuple(added), nixl_env(on))


def chart_shutdown_timeout(values: Path = PD_VALUES, pool: str = "prefill") -> int:
    """The `--shutdown-timeout` the chart gives the `pool`'s vLLM: how long its engine keeps
    stepping after SIGTERM (for a prefill replica, until its KV has been pulled)."""
    args = [str(a) for a in _vllm_container(render(values_files=[values]), pool)["args"]]
    return int(args[args.index("--shutdown-timeout") + 1])
