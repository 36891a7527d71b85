"""Split a vLLM server's start into phases from its log (standard library only).

Input: the server's output lines, each with the seconds since the process was started at
which the line arrived (cold_start.py stamps them as they come; vLLM's own timestamps
have one-second resolution). Output: the moments a marker line first arrived, durations
vLLM logs itself, and the phases between them:

    imports           process start -> the API server parsed its arguments
    engine_core_start -> the engine-core process logged its config (spawn + its imports)
    weights           -> "Model loading took" (device init + reading the weights)
    compile           torch.compile's own total (Dynamo + Inductor, or a cache load)
    profiling         -> "Available KV cache memory", minus compile (memory profiling run)
    graph_capture     -> "Graph capturing finished" (KV-cache allocation + CUDA graphs)
    engine_finish     -> "init engine ... took" (rest of the engine core's start)
    api_server_up     -> "Starting vLLM server on" (frontend: tokenizer, routes, uvicorn)
    health            -> first GET /health 200 (polling delay)
    warmup            -> warmup requests done (the sidecar's readiness condition)

Marker texts are vLLM 0.25.1's and 0.32's; a missing marker leaves its phase None (and
the next phase then spans both), never a wrong number.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# (event, patterns): the first line matching the first pattern marks the event; later
# patterns are fallbacks for builds that do not log the first (vLLM's CPU runner has no
# "Model loading took" line).
MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("args_parsed", (r"non-default args|vLLM server version|serving model",)),
    ("engine_core_init", (r"Initializing a V1 LLM engine",)),
    ("weights_loaded", (r"Model loading took", r"Loading weights took")),
    ("kv_cache_ready", (r"Available KV cache memory|KV cache size:|for KV cache on node",)),
    ("graphs_done", (r"Graph capturing finished",)),
    ("engine_ready", (r"init engine \(profile, create kv cache, warmup model\) took",)),
    (
        "api_listening",
        (r"Starting vLLM server on|Starting vLLM API server|Application startup complete",),
    ),
)

# (name, pattern with one number, how to combine repeats): durations vLLM logs itself.
DURATIONS: tuple[tuple[str, str, str], ...] = (
    ("weights_read_s", r"Loading weights took ([\d.]+) s", "first"),
    ("model_load_s", r"Model loading took .*?([\d.]+) s(?:ec|$)", "first"),
    ("dynamo_s", r"Dynamo bytecode transform time: ([\d.]+) s", "sum"),
    ("inductor_s", r"Compiling a graph for compile range .* takes ([\d.]+) s", "sum"),
    (
        "compile_total_s",
        r"torch\.compile (?:took|and initial profiling/warmup run together took) ([\d.]+) s",
        "first",
    ),
    ("graph_capture_logged_s", r"Graph capturing finished in ([\d.]+) sec", "first"),
    ("engine_init_logged_s", r"warmup model\) took ([\d.]+) s", "first"),
)

CACHE_HITS = (
    r"Directly load AOT compilation from path",
    r"Directly load the compiled graph",
)

# (phase, start event, end event): consecutive events, so the phases add up to the total.
PHASES: tuple[tuple[str, str, str], ...] = (
    ("imports", "process_start", "args_parsed"),
    ("engine_core_start", "args_parsed", "engine_core_init"),
    ("weights", "engine_core_init", "weights_loaded"),
    ("profiling_and_compile", "weights_loaded", "kv_cache_ready"),
    ("graph_capture", "kv_cache_ready", "graphs_done"),
    ("engine_finish", "graphs_done", "engine_ready"),
    ("api_server_up", "engine_ready", "api_listening"),
    ("health", "api_listening", "health_ok"),
    ("warmup", "health_ok", "ready"),
)


def parse(lines: Iterable[tuple[float, str]], **extra_events: float | None) -> dict[str, Any]:
    """Events, logged durations and phases of one start.

    `lines`: (seconds since process start, text). `extra_events`: moments the caller saw
    itself (health_ok, ready), in the same clock.
    """
    events: dict[str, float | None] = {"process_start": 0.0}
    durations: dict[str, float] = {}
    cache_hit = False
    compiled = [(name, [re.compile(p) for p in patterns]) for name, patterns in MARKERS]
    seen: dict[tuple[str, int], float] = {}
    timed = [(name, re.compile(p), how) for name, p, how in DURATIONS]
    hits = [re.compile(p) for p in CACHE_HITS]
    for t, text in lines:
        for name, patterns in compiled:
            for rank, pattern in enumerate(patterns):
                if (name, rank) not in seen and pattern.search(text):
                    seen[name, rank] = t
        for name, pattern, how in timed:
            m = pattern.search(text)
            if m:
                value = float(m.group(1))
                if how == "sum":
                    durations[name] = durations.get(name, 0.0) + value
                else:
                    durations.setdefault(name, value)
        cache_hit = cache_hit or any(p.search(text) for p in hits)
    for name, patterns in compiled:
        found = [seen[name, rank] for rank in range(len(patterns)) if (name, rank) in seen]
        if found:
            events[name] = found[0]
    events.update({k: v for k, v in extra_events.items() if v is not None})
    return {
        "events": events,
        "logged": durations,
        "compile_cache_hit": cache_hit,
        "phases": phases(events, durations),
    }


def phases(events: dict[str, float | None], logged: dict[str, float]) -> dict[str, float | None]:
    """Durations between consecutive events; compile split out of profiling."""
    out: dict[str, float | None] = {}
    last_name, last_t = "process_start", 0.0
    for phase, start, end in PHASES:
        t_end = events.get(end)
        if t_end is None:
            out[phase] = None
            continue
        t_start = events.get(start)
        # A missing start marker: the phase begins where the last seen one ended.
        out[phase] = t_end - (t_start if t_start is not None else last_t)
        last_name, last_t = end, t_end
    compile_s = logged.get("compile_total_s")
    if compile_s is None and ("dynamo_s" in logged or "inductor_s" in logged):
        compile_s = logged.get("dynamo_s", 0.0) + logged.get("inductor_s", 0.0)
    out["compile"] = compile_s
    both = out.get("profiling_and_compile")
    out["profiling"] = both - compile_s if both is not None and compile_s is not None else None
    out["total"] = last_t if last_name != "process_start" else None
    return out
