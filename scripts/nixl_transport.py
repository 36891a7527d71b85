#!/usr/bin/env python3
"""How fast NIXL moves KV-sized blocks between two processes, per UCX transport setting.

What a decode replica does to pull a prefill replica's KV cache, without the engines: one
process (the "prefill" side) registers a buffer with NIXL and shares its agent metadata and
the buffer's block descriptors; another (the "decode" side) READs every block into its own
registered buffer, as one NIXL transfer, and times it until NIXL reports it done. Each
`--tls` value is a `UCX_TLS` setting both processes start with (the chart's
`disaggregation.nixl.ucxTransports`; `auto` leaves UCX_TLS unset: UCX's own choice), each
`--mem` the memory the buffers live in (`DRAM`, or `VRAM` on the first GPU). The first
transfer of a pair is a warm-up (it makes UCX's connection); the rounds after it are timed,
and the first timed one is checked byte for byte against the pattern the source holds.

A pair is two fresh processes, started `--instances` times per setting, the settings'
order rotating between instances, so the spread shown is over pairs, not only rounds.
The question it answers: which path a P/D pair's KV takes with a given `ucxTransports`, at
what rate (docs/fleet.md, "Which transport"); on the H200, `scripts/gpu/h200.sh nixl`.

`--idle-seconds S` adds what an idle replica's NIXL agent costs: a fresh process creates an
agent as vLLM's NixlConnector does (`VLLM_AGENT`), registers a buffer, and sits idle for S
seconds; its CPU time over that span, in cores, with NIXL's progress thread on (what vLLM
gets) and off, once each per instance (docs/fleet.md, "What NIXL costs an idle pod").

    python scripts/nixl_transport.py --mem DRAM --tls tcp,self --tls auto --out OUT.json
    python scripts/nixl_transport.py --table OUT.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ministream_testkit.results import write_json

AUTO = "auto"  # leave UCX_TLS unset
# The agent configuration vLLM 0.32's NixlConnector builds for a UCX-only agent
# (kv_connector/v1/nixl/base_worker.py: num_threads from kv_connector_extra_config, 4 by
# default; telemetry on); NIXL's progress thread is on unless asked otherwise.
VLLM_AGENT = {"num_threads": 4, "capture_telemetry": True}
# A byte pattern no all-zero or stale buffer matches (and not a multiple of a block size).
PATTERN_MOD = 251


@dataclass(frozen=True)
class Setting:
    tls: str
    mem: str
    total_bytes: int
    block_bytes: int
    rounds: int

    def env(self) -> dict[str, str]:
        return {} if self.tls == AUTO else {"UCX_TLS": self.tls}


def _buffer(s: Setting, fill: bool) -> Any:
    import torch

    device = "cuda:0" if s.mem == "VRAM" else "cpu"
    if not fill:
        return torch.zeros(s.total_bytes, dtype=torch.uint8, device=device)
    return (torch.arange(s.total_bytes, device=device) % PATTERN_MOD).to(torch.uint8)


def _blocks(base: int, s: Setting, device_id: int) -> Any:
    import numpy as np

    starts = base + np.arange(0, s.total_bytes, s.block_bytes, dtype=np.int64)
    return np.stack(
        [starts, np.full_like(starts, s.block_bytes), np.full_like(starts, device_id)], axis=1
    )


def _agent(name: str, s: Setting, **config: Any) -> Any:
    """A NIXL agent on UCX (`config`: nixl_agent_config's other settings)."""
    os.environ.update(s.env())  # before the agent: UCX reads its configuration then
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=["UCX"], **config))


def idle(s: Setting, progress_thread: bool, seconds: float, conn: Connection) -> None:
    """An agent configured as vLLM's, its buffer registered, left idle: the cores its
    process spends over `seconds` (CPU time over wall time)."""
    agent = _agent("idle", s, enable_prog_thread=progress_thread, **VLLM_AGENT)
    agent.register_memory(_buffer(s, fill=False))
    time.sleep(1.0)  # past the agent's own start
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(seconds)
    conn.send((time.process_time() - cpu) / (time.monotonic() - wall))


def idle_cores(s: Setting, progress_thread: bool, seconds: float, timeout_s: float) -> float | None:
    """`idle` in a fresh process; None when it died or did not answer."""
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=idle, args=(s, progress_thread, seconds, theirs))
    proc.start()
    try:
        return float(mine.recv()) if _answered(mine, [proc], timeout_s + seconds) else None
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def source(s: Setting, conn: Connection) -> None:
    """The prefill side: holds the blocks until the other side says it is done."""
    agent = _agent("source", s)
    buf = _buffer(s, fill=True)
    agent.register_memory(buf)
    descs = agent.get_xfer_descs(_blocks(buf.data_ptr(), s, max(buf.get_device(), 0)), s.mem)
    conn.send((agent.get_agent_metadata(), agent.get_serialized_descs(descs)))
    conn.recv()


def reader(s: Setting, conn: Connection) -> None:
    """The decode side: a warm-up READ of every block, then `rounds` timed ones."""
    agent = _agent("reader", s)
    metadata, serialized = conn.recv()
    remote = agent.add_remote_agent(metadata)
    buf = _buffer(s, fill=False)
    agent.register_memory(buf)
    local = agent.get_xfer_descs(_blocks(buf.data_ptr(), s, max(buf.get_device(), 0)), s.mem)
    remote_descs = agent.deserialize_descs(serialized)
    seconds: list[float] = []
    intact = None
    try:
        for i in range(s.rounds + 1):
            handle = agent.initialize_xfer("READ", local, remote_descs, remote)
            t0 = time.perf_counter()
            state = agent.transfer(handle)
            while state == "PROC":
                state = agent.check_xfer_state(handle)
            elapsed = time.perf_counter() - t0
            agent.release_xfer_handle(handle)
            if state != "DONE":
                raise RuntimeError(f"transfer {i} ended {state}")
            if i == 1:
                intact = bool((buf == _buffer(s, fill=True)).all().item())
            if i:
                seconds.append(elapsed)
        conn.send({"seconds": seconds, "intact": intact})
    except Exception as exc:  # the parent reports it; the child exits either way
        conn.send({"error": f"{type(exc).__name__}: {exc}"})


def one_pair(s: Setting, timeout_s: float) -> dict[str, Any]:
    """Both sides in fresh processes; the reader's figures, or the error it met."""
    ctx = mp.get_context("spawn")
    a_src, b_src = ctx.Pipe()
    a_rd, b_rd = ctx.Pipe()
    procs = [
        ctx.Process(target=source, args=(s, b_src)),
        ctx.Process(target=reader, args=(s, b_rd)),
    ]
    for p in procs:
        p.start()
    try:
        if not _answered(a_src, procs, timeout_s):
            return {"error": f"the source shared nothing ({_exits(procs)})"}
        a_rd.send(a_src.recv())
        if not _answered(a_rd, procs, timeout_s):
            return {"error": f"no transfer ended ({_exits(procs)})"}
        return dict(a_rd.recv())
    finally:
        a_src.send("done")
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def _answered(conn: Connection, procs: list[Any], timeout_s: float) -> bool:
    """Whether `conn` has a message within `timeout_s`; False at once when a side has died
    (its error is on its standard error)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if conn.poll(0.2):
            return True
        if any(p.exitcode not in (None, 0) for p in procs):
            return False
    return False


def _exits(procs: list[Any]) -> str:
    return ", ".join(
        f"{name} exit {p.exitcode}" for name, p in zip(("source", "reader"), procs, strict=True)
    )


def rates(seconds: list[float], total_bytes: int) -> list[float]:
    return [total_bytes / t / 1e9 for t in seconds]


def summarize(pairs: list[dict[str, Any]], total_bytes: int) -> dict[str, Any]:
    """Per setting: the median GB/s of each pair, their median, and the range over pairs."""
    ok = [p for p in pairs if "seconds" in p]
    medians = [statistics.median(rates(p["seconds"], total_bytes)) for p in ok]
    return {
        "pairs": len(pairs),
        "failed": len(pairs) - len(ok),
        "intact": all(p.get("intact") for p in ok) if ok else None,
        "gbps_median": statistics.median(medians) if medians else None,
        "gbps_pair_medians": medians,
        "gbps_range": [min(medians), max(medians)] if medians else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = [
        Setting(tls, args.mem, args.total_mib << 20, args.block_kib << 10, args.rounds)
        for tls in args.tls
    ]
    pairs: dict[str, list[dict[str, Any]]] = {s.tls: [] for s in settings}
    for instance in range(args.instances if settings else 0):
        k = instance % len(settings)
        for s in settings[k:] + settings[:k]:
            result = one_pair(s, args.timeout)
            pairs[s.tls].append(result)
            print(f"instance {instance} {s.mem} UCX_TLS={s.tls}: {_line(result, s)}", flush=True)
    result = {
        "mem": args.mem,
        "total_bytes": args.total_mib << 20,
        "block_bytes": args.block_kib << 10,
        "rounds": args.rounds,
        "instances": args.instances,
        "versions": _versions(),
        "settings": {
            tls: {"pairs": p, "summary": summarize(p, args.total_mib << 20)}
            for tls, p in pairs.items()
        },
    }
    if args.idle_seconds > 0:
        result["idle"] = measure_idle(args)
    return result


def measure_idle(args: argparse.Namespace) -> dict[str, Any]:
    """Idle cores per progress-thread setting, one fresh process each per instance, the
    settings' order alternating; the transport is the first --tls (tcp,self without one)."""
    tls = args.tls[0] if args.tls else "tcp,self"
    s = Setting(tls, args.mem, args.total_mib << 20, args.block_kib << 10, args.rounds)
    cores: dict[str, list[float | None]] = {"on": [], "off": []}
    for instance in range(args.instances):
        for name in ("on", "off") if instance % 2 == 0 else ("off", "on"):
            cores[name].append(idle_cores(s, name == "on", args.idle_seconds, args.timeout))
            print(f"instance {instance} idle agent, progress thread {name}: {cores[name][-1]}")
    return {"ucx_tls": tls, "seconds": args.idle_seconds, "agent": VLLM_AGENT, "cores": cores}


def _line(result: dict[str, Any], s: Setting) -> str:
    if "error" in result:
        return result["error"]
    gbps = rates(result["seconds"], s.total_bytes)
    return f"{statistics.median(gbps):.2f} GB/s median of {len(gbps)}, intact={result['intact']}"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("nixl", "nixl-cu12", "nixl-cu13", "torch"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def table(result: dict[str, Any]) -> str:
    rows = _transfer_rows(result) if result["settings"] else []
    if idle := result.get("idle"):
        rows += [""] if rows else []
        rows.append(
            f"An idle agent as vLLM's (UCX_TLS={idle['ucx_tls']}), cores over {idle['seconds']} s:"
        )
        for name, values in idle["cores"].items():
            shown = ", ".join("died" if v is None else f"{v:.2f}" for v in values)
            rows.append(f"- progress thread {name}: {shown}")
    return "\n".join(rows)


def _transfer_rows(result: dict[str, Any]) -> list[str]:
    mib = result["total_bytes"] >> 20
    kib = result["block_bytes"] >> 10
    rows = [
        f"NIXL READ of {mib} MiB in {kib} KiB blocks, {result['mem']}: GB/s, the median of"
        " each pair's rounds",
        "| UCX_TLS | pairs | failed | intact | median | range over pairs |",
        "|---|---:|---:|---|---:|---|",
    ]
    for tls, cell in result["settings"].items():
        s = cell["summary"]
        med = "–" if s["gbps_median"] is None else f"{s['gbps_median']:.2f}"
        rng = (
            "–" if s["gbps_range"] is None else f"{s['gbps_range'][0]:.2f}–{s['gbps_range'][1]:.2f}"
        )
        rows.append(f"| `{tls}` | {s['pairs']} | {s['failed']} | {s['intact']} | {med} | {rng} |")
    return rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--table", type=Path, help="print the table of a result file and exit")
    p.add_argument("--mem", choices=("DRAM", "VRAM"), default="DRAM")
    p.add_argument("--tls", action="append", help=f"a UCX_TLS value ({AUTO}: unset); repeatable")
    p.add_argument("--total-mib", type=int, default=256, help="bytes moved per transfer, MiB")
    p.add_argument("--block-kib", type=int, default=64, help="one descriptor's size, KiB")
    p.add_argument("--rounds", type=int, default=5, help="timed transfers per pair")
    p.add_argument("--instances", type=int, default=2, help="fresh process pairs per setting")
    p.add_argument("--timeout", type=float, default=120.0, help="s a pair may take per stage")
    p.add_argument(
        "--idle-seconds", type=float, default=0.0, help="also measure an idle agent's CPU (s)"
    )
    p.add_argument("--out", type=Path)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return 0
    if not args.out or not (args.tls or args.idle_seconds > 0):
        _parser().error("--out and at least one --tls (or --idle-seconds) are needed to measure")
    args.tls = args.tls or []
    if (args.total_mib << 10) % args.block_kib:
        _parser().error("--total-mib must be a whole number of --block-kib blocks")
    result = write_json(args.out, run(args))
    print(table(result))
    failed = sum(c["summary"]["failed"] for c in result["settings"].values())
    idle = result.get("idle", {}).get("cores", {})
    failed += sum(v is None for values in idle.values() for v in values)
    intact = all(c["summary"]["intact"] is not False for c in result["settings"].values())
    return 0 if not failed and intact else 1


if __name__ == "__main__":
    sys.exit(main())
