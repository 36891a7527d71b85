#!/usr/bin/env bash
# The GPU runs, on a lent H200 (vLLM 0.25.1 unpacked to /tmp/site: docs/benchmarks.md, "H200"). Three steps, each one `run` call, back to back:
#   bash scripts/gpu/h200.sh models          # with .gpuxfer/cur1: writes test models to ~/m
#   bash scripts/gpu/h200.sh bench  "$OUT"   # with .gpuxfer/cur2: golden + cold start per engine
#   bash scripts/gpu/h200.sh throughput "$OUT"  # plugin vs Llama side by side, both shapes
#   bash scripts/gpu/h200.sh loaders "$OUT"  # cold start per loader + raw disk bandwidth
#                                            # (LOADERS="sharded" for one; runai needs .whl carried)
# Parity that reproduces, time to Ready, FP8 (gpu-1b only):
#   REFERENCE=1 PRESETS=gpu-1b bash scripts/gpu/h200.sh models "$OUT"  # + fp32 reference golden
#   bash scripts/gpu/h200.sh parity "$OUT"     # forward_parity.py: plugin vs 2 Llamas, one process
#     PARITY_SHAPES (default: the script's six), PARITY_ROUNDS, PARITY_BUDGET (s of rounds),
#     PARITY_LIMIT (s for the whole step, engine starts included: three took 206 s),
#     PARITY_INSTANCES (engines of each kind; > 1 adds the replicated figures), PARITY_MIN_ROUNDS
#   COLD="vllm-fresh chart-fresh" bash scripts/gpu/h200.sh coldstart "$OUT"  # cold_start.py runs
#     variants: vllm-fresh vllm-warm chart-fresh chart-warm chart-seeded chart-graphs64
#     chart-debug (warm, vLLM DEBUG log), chart-fork-fresh chart-fork-warm chart-fork-seeded
#     (engine core forked, not spawned), chart-graphs64-{fresh,seeded,warm} (capture size
#     64), chart-kvb-{fresh,seeded,warm} (capture size 64 + --kv-cache-memory-bytes=KV_BYTES,
#     the chart's own size for one H200 unless given), h200-{fresh,seeded,warm} (exactly what
#     the chart renders for one H200: chart-defaults-h200.json, its KV size, max-num-seqs and
#     capture sizes) and the pseudo-variant importprofile;
#     HIDE_HOST_PACKAGES=1 starts without the host-only packages (HIDE_PACKAGES);
#     NAME.N repeats NAME;
#     suffixes: NAME-nopyc (no bytecode at all), NAME-evict (the model's files dropped from
#     the page cache first), NAME-prefetch (the model and cache root read beside the start),
#     NAME-hide (the host-only packages hidden), NAME-mega (VLLM_USE_MEGA_AOT_ARTIFACT=1),
#     NAME-pyc (a name only, kept for older runs); a repeat's number goes last (NAME-mega.2);
#     DECODE_PROBE=BATCH:PROMPT:OUT times that many concurrent completions after each start
#     is Ready (cold_start.py --decode-probe: the started engine's decode tokens/s);
#     DEADLINE=<epoch s> skips variants that could not finish before it; COLD_LIMIT (s per
#     run, default 200), COLD_LIMIT_FRESH (s per *-fresh run, default COLD_LIMIT): a
#     fresh-cache start can take > 95 s.
#     The API server needs packages the vLLM transfer does not pack: carry `.whl` (uvicorn,
#     watchfiles, prometheus-fastapi-instrumentator, python-multipart,
#     model-hosting-container-standards, jmespath, supervisor; see docs/results/h200/run4).
#   bash scripts/gpu/h200.sh capture "$OUT"    # capture_sizes.py: capture time + decode
#     throughput, vLLM's capture sizes (A/A) vs capture size 64 vs the chart's (CAPTURE_*)
#   bash scripts/gpu/h200.sh fp8 "$OUT"        # fp8_compare.py: bf16 vs online FP8
#   bash scripts/gpu/h200.sh lora "$OUT"       # lora_throughput.py: 0/1/4/16 LoRA adapters mixed
#   bash scripts/gpu/h200.sh routing "$OUT"    # bench_routing.py: vLLM's router, cache_aware vs
#     round_robin over 4 gpu-1b replicas (carry .whl and .whl-router); ROUTING_REPLICAS,
#     ROUTING_KV_GIB, ROUTING_RATE, ROUTING_ROUNDS, ROUTING_LIMIT, ROUTING_ARGS
#   bash scripts/gpu/h200.sh pd "$OUT"         # bench_pd.py: P/D (1 prefill + 1 decode gpu-1b)
#     vs 2 colocated gpu-1b, all four sharing the GPU (carry .whl, .whl-router and the NIXL
#     wheel with its dependencies as .whl-pd); PD_KV_GIB, PD_RATE, PD_ROUNDS, PD_INSTANCES,
#     PD_LIMIT, PD_ARGS, PD_CHART (the chart's arguments: chart-pd.json, or
#     chart-pd-cuda-ipc.json with UCX's GPU transports)
#   bash scripts/gpu/h200.sh nixl "$OUT"       # nixl_transport.py: NIXL READ GB/s per UCX_TLS,
#     GPU and host memory, two fresh processes per pair (carry .whl-pd only; NIXL_* knobs)
#   bash scripts/gpu/h200.sh offload "$OUT"    # kv_offload.py: native CPU KV offload on vs off
#     (carry .whl as for coldstart); OFFLOAD_KV_GIB (GPU KV cache, default 4),
#     OFFLOAD_GIB (CPU tier, 24), OFFLOAD_LIMIT (s, 480), OFFLOAD_ARGS (kv_offload.py flags)
# Several steps in one call: STEPS="parity coldstart" bash scripts/gpu/h200.sh multi "$OUT".
# PRESETS="gpu-1b" limits models/loaders/throughput to one shape (default: seed gpu-1b);
# ROUNDS and THROUGHPUT_LIMIT (seconds per shape) size the throughput step (6, 280);
# SKIP_REFERENCE=1 skips the loaders step's fp32 reference runs.
# Results: each invocation of a step writes its own folder, OUT/<step>-<n>/ (n = the first
# number not used yet in OUT), packed at its end into OUT/<step>-<n>.tgz (at most 8 files
# come back from the machine), so two steps or two coldstart calls of one command never
# overwrite each other; unpack them side by side and `python scripts/gpu/report.py DIR`
# or `python scripts/gpu/cold_start.py summary DIR...` renders the tables.
# Provenance: the GPU host has no .git, so pass the commit on the command line:
#   MINISTREAM_COMMIT=$(git rev-parse HEAD) MINISTREAM_DIRTY=0|1 bash scripts/gpu/h200.sh ...
# Every JSON a step writes carries the provenance block (ministream_testkit.provenance):
# cold_start.py stamps its own (bytecode as its server sees it), and so do kv_offload.py,
# bench_routing.py, bench_pd.py, forward_parity.py, fp8_compare.py and capture_sizes.py (through
# ministream_testkit.results.write_json); the rest are stamped when the step ends, and the
# step's folder holds step.json (step, settings, start and end).
# Bytecode as the serving image has it: before its first timed work a step compiles the host
# venv's packages (torch, sympy, networkx ship as .py only on the GPU host) and /tmp/site
# (`compile_bytecode`, once per machine, time in bytecode.log; BYTECODE=0 skips it); a
# coldstart variant NAME-nopyc starts with an empty PYTHONPYCACHEPREFIX, i.e. without any
# bytecode, as the reference line.
set -uo pipefail
cd "$(dirname "$0")/../.."
step=${1:?usage: h200.sh models|bench|throughput|loaders|parity|capture|coldstart|offload|routing|pd|nixl|fp8|lora|multi [OUT]}
base=${2:-/tmp/out}
mkdir -p "$base"
if [ "$step" = multi ]; then out=$base; else
  n=1; while [ -e "$base/$step-$n" ] || [ -e "$base/$step-$n.tgz" ]; do n=$((n + 1)); done
  out=$base/$step-$n; mkdir -p "$out"
fi
[ -n "${MINISTREAM_COMMIT:-}" ] || echo "warning: MINISTREAM_COMMIT unset: results carry no commit"
M=$HOME/m
# The plugin from the working tree, registered through a dist-info entry point so that
# every vLLM process (engine core, workers) loads it as in production.
di=plugins/ministream_serving-0.0.0.dist-info
mkdir -p $di
printf 'Metadata-Version: 2.1\nName: ministream-serving\nVersion: 0.0.0\n' > $di/METADATA
printf '[vllm.general_plugins]\nministream = ministream:register\n' > $di/entry_points.txt
export PYTHONPATH=$PWD/plugins:$PWD/service:$PWD/loadtest:$PWD/devtools:${PYTHONPATH:-}
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1

probe() {  # name, timeout, args...
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date +%T))"
  timeout "$limit" python3 scripts/gpu/engine_probe.py --out "$out/$name.json" "$@" \
    > "$out/$name.log" 2>&1
  echo "   exit $? ($(date +%T))"; grep -E "Loading weights took|Model loading took|torch.compile takes|Graph capturing finished|init engine" "$out/$name.log" | sed 's/^/   /' | cut -c1-200
}

evict() {  # drop the page cache of a model's files so the next load reads the disk
  python3 - "$@" <<'PY'
import os, sys
for root in sys.argv[1:]:
    for dirpath, _, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            os.fsync(fd) if False else None
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
PY
}

seed_cache() {  # from, to, report suffix: `ministream compile-cache` packs /tmp/cc/FROM,
  # checks and unpacks it at /tmp/cc/TO (as an init container would from the model's storage)
  local from=/tmp/cc/$1 to=/tmp/cc/$2 sfx=$3
  python3 -m ministream.cli compile-cache pack --cache-root $from --model $M/gpu-1b \
    --out $from.tar > "$out/compile-cache-pack$sfx.json" 2>&1
  rm -rf $to; python3 -m ministream.cli compile-cache unpack --archive $from.tar \
    --cache-root $to --model $M/gpu-1b > "$out/compile-cache-unpack$sfx.json" 2>&1
  grep -h '"seeded"\|"bytes"\|"seconds"' "$out/compile-cache-pack$sfx.json" "$out/compile-cache-unpack$sfx.json"
}

compile_bytecode() {  # the .pyc files a serving image ships, written once per machine
  [ "${BYTECODE:-1}" = 1 ] || return 0
  local p t rc
  p=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  for d in "$p" /tmp/site; do
    [ -d "$d" ] && [ ! -e "$d/.ministream-bytecode" ] || continue
    t=$(date +%s%N); python3 -m compileall -q -j 16 "$d" > /tmp/compileall.log 2>&1; rc=$?
    echo "compileall $d: exit $rc in $(( ($(date +%s%N) - t) / 1000000 )) ms" | tee -a "$out/bytecode.log"
    touch "$d/.ministream-bytecode"
  done
  python3 -c 'import json; from ministream_testkit.provenance import bytecode; print(json.dumps(bytecode()))' |
    sed 's/^/bytecode: /' | tee -a "$out/bytecode.log"
}

stamp_results() {  # the provenance block in every JSON object of the step lacking one
  MINISTREAM_COMMAND="h200.sh $step (stamped at the step's end)" python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
from ministream_testkit.provenance import KEY, stamp
for path in sorted(Path(sys.argv[1]).rglob("*.json")):
    try:
        data = json.loads(path.read_text())
    except ValueError:
        continue  # a CLI's error output under a .json name: left as it is
    if isinstance(data, dict) and KEY not in data:
        path.write_text(json.dumps(stamp(data), indent=2) + "\n")
PY
}

step_record() {  # OUT/<step>-<n>/step.json: the step, its settings, start and end
  MINISTREAM_COMMAND="bash scripts/gpu/h200.sh $step $base" \
    python3 - "$out/step.json" "$step" "$started" <<'PY'
import json, os, sys, time
from ministream_testkit.provenance import stamp
keys = ("COLD FORK SUFFIX DEADLINE COLD_LIMIT COLD_LIMIT_FRESH KV_BYTES DECODE_PROBE "
        "PRESETS STEPS BYTECODE HIDE_HOST_PACKAGES HIDE_PACKAGES REFERENCE OFFLOAD_KV_GIB OFFLOAD_GIB "
        "OFFLOAD_LIMIT OFFLOAD_ARGS ROUTING_REPLICAS ROUTING_KV_GIB ROUTING_RATE ROUTING_ROUNDS "
        "ROUTING_LIMIT ROUTING_ARGS PARITY_INSTANCES PARITY_LLM_ARGS PARITY_SHAPES "
        "CAPTURE_INSTANCES CAPTURE_LIMIT CAPTURE_ARGS").split()
rec = {"step": sys.argv[2], "started": float(sys.argv[3]), "ended": time.time(),
       "settings": {k: os.environ[k] for k in keys if k in os.environ}}
open(sys.argv[1], "w").write(json.dumps(stamp(rec), indent=2) + "\n")
PY
}

pack_step() {  # at exit, also after a signal: OUT/<step>-<n>.tgz, the folder removed
  [ "$step" = multi ] && return
  step_record; stamp_results
  tar -czf "$base/$step-$n.tgz" -C "$base" "$step-$n" && rm -rf "$out"
}
started=$(date +%s.%N)
trap pack_step EXIT
trap 'exit 130' INT TERM

wait_gpu_free() {  # the next start needs the whole GPU: wait for exiting engine cores
  local i
  for i in $(seq 1 30); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && return 0
    sleep 1
  done
  gpu_leftovers
}

gpu_leftovers() {  # engine cores of a killed run of ours would hold GPU memory: end them
  sleep 2
  for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
    echo "   leftover GPU process $p (ours): killing"; kill -9 "$p" 2>/dev/null
  done
}

install_api_wheels() {  # the API server's packages the vLLM transfer lacks, carried as .whl/
  if compgen -G '.whl/*.whl' >/dev/null && ! python3 -c "import uvicorn" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
    rm -f /tmp/site/.ministream-bytecode  # the new packages need their bytecode too
  fi
}

# The routing and pd steps: the API server's wheels, vllm-router (.whl-router/) and NIXL
# (.whl-pd/, when carried) into /tmp/site, then bytecode as the other steps have it.
router_wheels() {
  install_api_wheels
  if compgen -G '.whl-router/*.whl' >/dev/null && [ ! -x /tmp/site/bin/vllm-router ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl-router/*.whl
  fi
  if compgen -G '.whl-pd/*.whl' >/dev/null && [ ! -d /tmp/site/nixl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl-pd/*.whl
  fi
  export MINISTREAM_VLLM_ROUTER=/tmp/site/bin/vllm-router
  compile_bytecode
  export PYTHONDONTWRITEBYTECODE=1
}

case "$step" in
  parity|capture|coldstart|fp8|lora|offload|routing|pd) test -d /tmp/site/vllm || { echo "no vLLM in /tmp/site: fresh machine?"; exit 3; } ;;
esac
case "$step" in
  models)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    compile_bytecode  # the host venv now (every step below imports torch); /tmp/site later
    for preset in ${PRESETS:-seed gpu-1b}; do
      python3 -m ministream.cli demo --preset $preset --output $M/raw-$preset >/dev/null &&
      python3 -m ministream.cli convert --quiet --checkpoint $M/raw-$preset/model.pt \
        --train-config $M/raw-$preset/train_config.json --tokenizer $M/raw-$preset/tokenizer \
        --output $M/$preset --dtype bfloat16 --max-shard-size 1GB
      rm -rf $M/raw-$preset
    done
    for preset in ${PRESETS:-seed gpu-1b}; do
      python3 -c "from ministream_reference.golden import as_llama; as_llama('$M/$preset', '$M/$preset-llama')"
      if [ "${REFERENCE:-0}" = 1 ]; then  # fp32 reference golden on the GPU (torch only)
        python3 -m ministream_reference.golden --engine reference --device cuda \
          --model $M/$preset --out $M/reference-$preset.json > "$out/reference-$preset.log" 2>&1
        echo "reference $preset: exit $?"; cp $M/reference-$preset.json "$out/" 2>/dev/null
      fi
    done
    du -sh $M/* ;;
  multi)
    for s in ${STEPS:?STEPS=\"parity coldstart ...\"}; do bash "$0" "$s" "$out"; done
    exit 0 ;;
  parity)
    # vLLM's bytecode goes to a private prefix, so /tmp/site stays as shipped (no .pyc)
    # for the cold-start step's "no precompiled bytecode" baseline.
    echo "== forward parity ($(date +%T))"
    default='{"dtype": "bfloat16", "max_model_len": 2560, "gpu_memory_utilization": 0.25, "max_num_batched_tokens": 8192}'
    parity_llm_args=${PARITY_LLM_ARGS:-$default}
    PYTHONPYCACHEPREFIX=/tmp/pyc-parity timeout -k 10 ${PARITY_LIMIT:-330} python3 \
      scripts/gpu/forward_parity.py --model $M/gpu-1b --out "$out/forward-parity.json" \
      ${PARITY_SHAPES:+--shapes $PARITY_SHAPES} ${PARITY_ROUNDS:+--rounds $PARITY_ROUNDS} \
      ${PARITY_INSTANCES:+--instances $PARITY_INSTANCES} ${PARITY_MIN_ROUNDS:+--min-rounds $PARITY_MIN_ROUNDS} \
      --budget-s ${PARITY_BUDGET:-120} --stop-after-s $(( ${PARITY_LIMIT:-330} - 45 )) --llm-args "$parity_llm_args" \
      > "$out/forward-parity.log" 2>&1
    echo "   exit $? ($(date +%T))"; grep -A12 "^[0-9]* rounds" "$out/forward-parity.log"
    gpu_leftovers ;;
  capture)
    # capture_sizes.py: CUDA-graph capture time and decode throughput of vLLM's own capture
    # sizes (two groups: the A/A), capture size 64 and the chart's sizes
    # (chart-defaults-h200.json), CAPTURE_INSTANCES (3) engines of each in one process;
    # CAPTURE_LIMIT (s, 540), CAPTURE_ARGS (more capture_sizes.py run flags).
    compile_bytecode
    echo "== capture sizes ($(date +%T))"
    limit=${CAPTURE_LIMIT:-540}
    # shellcheck disable=SC2086  # CAPTURE_ARGS is a list of flags
    timeout -s INT -k 30 "$limit" python3 scripts/gpu/capture_sizes.py run --model $M/gpu-1b \
      --out "$out/capture-sizes.json" --instances ${CAPTURE_INSTANCES:-3} \
      --stop-after-s $(( limit - 50 )) ${CAPTURE_ARGS:-} > "$out/capture-sizes.log" 2>&1
    echo "   exit $? ($(date +%T))"; grep -E "^(vllm_|size64|chart)[.0-9]*: up|^round" "$out/capture-sizes.log" | cut -c1-240
    sed -n '/ rounds, /,$p' "$out/capture-sizes.log"
    gpu_leftovers ;;
  coldstart)
    # Each variant: one server start -> /health -> chart warmup -> SIGTERM (cold_start.py).
    # Caches live under /tmp/cc/<name>; "fresh" = empty, "seed:<name>" = a copy of another
    # run's cache at a new path (compile artifacts shipped to a node, no shared PVC).
    # The API server needs packages the shared/gpu pack leaves out (it was made for
    # vllm.LLM): uvicorn, watchfiles, prometheus-fastapi-instrumentator, python-multipart,
    # model-hosting-container-standards (+ jmespath, supervisor). Carry them as .whl/.
    install_api_wheels
    compile_bytecode
    export PYTHONDONTWRITEBYTECODE=1  # the serving image's setting (read-only root FS)
    # --kv-cache-memory-bytes: the chart's own value for one H200, rendered where helm is
    # (scripts/gpu/chart-defaults-h200.json, chart_args.py --set accelerator.memoryGiB=140
    # --set model.sizeGiB=3; a test keeps it current). KV_BYTES=N overrides it (runs 13 and
    # 17 used 0.9 of the device minus the weights and 2 GiB: 131135632726).
    if [ -z "${KV_BYTES:-}" ]; then
      KV_BYTES=$(python3 -c 'import json, sys; a = json.load(open(sys.argv[1]))["argv"]
print(a[a.index("--kv-cache-memory-bytes") + 1])' scripts/gpu/chart-defaults-h200.json)
    fi
    export KV_BYTES; echo "KV_BYTES=$KV_BYTES ($(( KV_BYTES >> 20 )) MiB)" | tee "$out/kv-bytes.txt"
    # Packages the GPU host's Python has only because its image has them, which vLLM imports
    # when they are present (run 18's import profile: scipy 1.0 s, pandas 0.5 s, pyarrow
    # 0.2 s, sklearn 0.1 s of self time). A start with the suffix -hide (every start, with
    # HIDE_HOST_PACKAGES=1) runs as if they were not installed: this sitecustomize marks each
    # absent in sys.modules, so `import` fails and importlib.util.find_spec returns None, and
    # every process of the server (forked or spawned) runs it first. HIDE_PACKAGES names
    # them; torchvision and cv2 stay: vLLM 0.25.1 requires both, and its kernel warmup
    # imports torchvision (run 12: every start with it hidden failed).
    mkdir -p /tmp/hide
    hide_list=$(printf "'%s', " ${HIDE_PACKAGES:-scipy pandas pyarrow sklearn})
    printf 'import sys\nfor _n in (%s):\n    sys.modules.setdefault(_n, None)\n' \
      "$hide_list" > /tmp/hide/sitecustomize.py
    [ "${HIDE_HOST_PACKAGES:-0}" = 1 ] && export PYTHONPATH=/tmp/hide:$PYTHONPATH
    for v in ${COLD:?COLD=\"variant ...\"}; do
      name=$v; v=${v%%.*}  # NAME.N: a repeat of NAME (its own result file)
      # Suffixes, any order: -nopyc (no bytecode: an empty PYTHONPYCACHEPREFIX), -evict (the
      # model's files dropped from the page cache first), -prefetch (a reader of the model
      # and the cache root started with the server), -hide (the host-only packages hidden,
      # above), -mega (vLLM's VLLM_USE_MEGA_AOT_ARTIFACT=1: the compiled graph loaded as one
      # artifact; the variable is in vLLM's compile hash, so its cache sits beside the plain
      # one under the same root), -pyc (a name only: after `pyc`).
      nopyc=0 evict=0 prefetch=0 hide=0 mega=0
      while :; do
        case $v in
          *-mega) mega=1; v=${v%-mega} ;;
          *-nopyc) nopyc=1; v=${v%-nopyc} ;;
          *-evict) evict=1; v=${v%-evict} ;;
          *-prefetch) prefetch=1; v=${v%-prefetch} ;;
          *-hide) hide=1; v=${v%-hide} ;;
          *-pyc) v=${v%-pyc} ;;
          *) break ;;
        esac
      done
      startenv=()  # -hide: Python runs the sitecustomize above first, in every process
      [ $hide = 1 ] && startenv=(PYTHONPATH=/tmp/hide:$PYTHONPATH)
      limit=${COLD_LIMIT:-200}  # a start from an empty cache gets COLD_LIMIT_FRESH
      case $v in *-fresh) limit=${COLD_LIMIT_FRESH:-$limit} ;; esac
      if [ -n "${DEADLINE:-}" ] && [ $(( $(date +%s) + limit )) -gt "$DEADLINE" ]; then
        echo "skipped $name: too close to DEADLINE"; continue
      fi
      # capture size 64 instead of the chart's capture sizes (vLLM refuses the two together)
      g64=(--drop-arg=--cudagraph-capture-sizes --extra-arg=--max-cudagraph-capture-size=64)
      kvb=("${g64[@]}" --extra-arg=--kv-cache-memory-bytes=$KV_BYTES)
      case $v in
        vllm-fresh)  a=(--mode vllm-defaults --cache-root /tmp/cc/vllm --fresh-cache) ;;
        vllm-warm)   a=(--mode vllm-defaults --cache-root /tmp/cc/vllm) ;;
        chart-fresh) a=(--mode chart --cache-root /tmp/cc/chart --fresh-cache) ;;
        chart-warm)  a=(--mode chart --cache-root /tmp/cc/chart) ;;
        pyc)  # precompile vLLM's bytecode into the install, as an image build step would
          t=$SECONDS; python3 -m compileall -q -j 16 /tmp/site > "$out/compileall.log" 2>&1
          echo "compileall: exit $? in $((SECONDS - t)) s" | tee -a "$out/compileall.log"; continue ;;
        chart-seeded|chart-fork-seeded)  # chart's cache, packed and unpacked at a new path
          seed_cache chart seeded ""
          a=(--mode chart --cache-root /tmp/cc/seeded)
          [ "$v" = chart-fork-seeded ] && a+=(--env VLLM_WORKER_MULTIPROC_METHOD=fork) ;;
        chart-graphs64) a=(--mode chart --cache-root /tmp/cc/g64 --seed-cache-from /tmp/cc/chart
                           "${g64[@]}") ;;
        chart-graphs64-fresh)  # capture size 64 from an empty cache (fills the seed's source)
          a=(--mode chart --cache-root /tmp/cc/g64 --fresh-cache "${g64[@]}") ;;
        chart-graphs64-seeded)  # chart-graphs64's cache, packed and unpacked at a new path
          seed_cache g64 g64seeded "-$name"
          a=(--mode chart --cache-root /tmp/cc/g64seeded "${g64[@]}") ;;
        chart-graphs64-warm)  # chart-graphs64 again, on the cache its last run filled
          a=(--mode chart --cache-root /tmp/cc/g64 "${g64[@]}") ;;
        chart-kvb-fresh)  # capture size 64 + --kv-cache-memory-bytes (its own compile hash)
          a=(--mode chart --cache-root /tmp/cc/g64kv --fresh-cache "${kvb[@]}") ;;
        chart-kvb-seeded)  # chart-kvb-fresh's cache, packed and unpacked at a new path
          seed_cache g64kv g64kvseeded "-$name"
          a=(--mode chart --cache-root /tmp/cc/g64kvseeded "${kvb[@]}") ;;
        chart-kvb-warm)
          a=(--mode chart --cache-root /tmp/cc/g64kv "${kvb[@]}") ;;
        h200-fresh)  # what the chart renders for one H200 (chart-defaults-h200.json: its
          # KV-cache size, max-num-seqs and capture sizes), from an empty cache
          a=(--mode chart --chart-defaults scripts/gpu/chart-defaults-h200.json
             --cache-root /tmp/cc/h200 --fresh-cache) ;;
        h200-seeded)  # h200-fresh's cache, packed and unpacked at a new path
          seed_cache h200 h200seeded "-$name"
          a=(--mode chart --chart-defaults scripts/gpu/chart-defaults-h200.json
             --cache-root /tmp/cc/h200seeded) ;;
        h200-warm)
          a=(--mode chart --chart-defaults scripts/gpu/chart-defaults-h200.json
             --cache-root /tmp/cc/h200) ;;
        chart-fork-fresh)  # the engine core forked from the API server, not spawned
          a=(--mode chart --cache-root /tmp/cc/chart --fresh-cache
             --env VLLM_WORKER_MULTIPROC_METHOD=fork) ;;
        chart-fork-warm)
          a=(--mode chart --cache-root /tmp/cc/chart --env VLLM_WORKER_MULTIPROC_METHOD=fork) ;;
        chart-debug)  # chart-warm with vLLM's DEBUG log: finer stamps inside the phases
          a=(--mode chart --cache-root /tmp/cc/chart --env VLLM_LOGGING_LEVEL=DEBUG) ;;
        importprofile)  # where the import time goes (also warms the page cache for Python)
          env "${startenv[@]}" python3 scripts/gpu/import_profile.py --out "$out/import-profile-$name.json" |
            head -30; continue ;;
        *) echo "unknown variant $v"; continue ;;
      esac
      [ "${FORK:-0}" = 1 ] && a+=(--env VLLM_WORKER_MULTIPROC_METHOD=fork)  # any variant, forked
      [ $mega = 1 ] && a+=(--env VLLM_USE_MEGA_AOT_ARTIFACT=1)
      # DECODE_PROBE=BATCH:PROMPT:OUT: decode tokens/s of each started engine, after Ready
      [ -n "${DECODE_PROBE:-}" ] && a+=(--decode-probe "$DECODE_PROBE")
      [ $evict = 1 ] && evict $M/gpu-1b
      if [ $prefetch = 1 ]; then  # the cache root is the last --cache-root given
        for ((k = 0; k < ${#a[@]}; k++)); do [ "${a[k]}" = --cache-root ] && root=${a[k+1]}; done
        a+=(--prefetch $M/gpu-1b --prefetch "$root")
      fi
      # -nopyc: Python looks for bytecode only under an empty prefix
      [ $nopyc = 1 ] && { rm -rf /tmp/nopyc; startenv+=(PYTHONPYCACHEPREFIX=/tmp/nopyc); }
      wait_gpu_free
      # Inner limits leave room for warmup + stop (20 s) + writing; an outer SIGINT still
      # makes cold_start.py stop the server and write what it has (the first
      # fresh-start runs were killed by a bare `timeout` and wrote nothing).
      env "${startenv[@]}" timeout -s INT -k 30 $limit python3 scripts/gpu/cold_start.py run \
        --name "$name${SUFFIX:-}" --model $M/gpu-1b --out "$out/cold" \
        --timeout $(( limit - 35 )) "${a[@]}"
    done
    python3 scripts/gpu/cold_start.py table "$out/cold"
    python3 scripts/gpu/cold_start.py summary "$out/cold" ;;
  offload)
    # KV-cache offload on vs off (kv_offload.py): two chart-configured servers side by side
    # on the GPU, the same small GPU KV cache (OFFLOAD_KV_GIB, GiB), the "on" side with
    # vLLM's native CPU tier (OFFLOAD_GIB, GiB); alternating blocks of a multi-turn workload
    # whose working set exceeds the GPU cache (OFFLOAD_ARGS: more kv_offload.py flags).
    install_api_wheels
    compile_bytecode
    export PYTHONDONTWRITEBYTECODE=1  # the serving image's setting (read-only root FS)
    echo "== kv offload ($(date +%T))"
    limit=${OFFLOAD_LIMIT:-480}
    # shellcheck disable=SC2086  # OFFLOAD_ARGS is a list of flags
    timeout -s INT -k 40 "$limit" python3 scripts/gpu/kv_offload.py run --model $M/gpu-1b \
      --out "$out/kv-offload.json" --budget-s $(( limit - 45 )) --more \
      --kv-cache-bytes $(( ${OFFLOAD_KV_GIB:-4} << 30 )) --offload-gib ${OFFLOAD_GIB:-24} \
      ${OFFLOAD_ARGS:-} 2>&1 | tee "$out/kv-offload.out"
    gpu_leftovers ;;
  routing)
    # vLLM's router in front of ROUTING_REPLICAS (4) gpu-1b replicas on the one GPU
    # (scripts/bench_routing.py): cache_aware vs round_robin, paired rounds. Carry the router
    # wheel (and orjson, which it imports and the host lacks) as .whl-router/, beside .whl.
    # Each replica gets ROUTING_KV_GIB (1) GiB of KV cache (--kv-cache-memory-bytes: no
    # memory profiling among four processes sharing the GPU); the chart's router arguments
    # come from scripts/gpu/chart-router.json (no helm here). vLLM 0.25.1 serves the render
    # endpoints cache_aware tokenizes through without --enable-scale-out (0.32 needs it).
    router_wheels
    echo "== routing ($(date +%T))"
    limit=${ROUTING_LIMIT:-540}
    kv=$(( ${ROUTING_KV_GIB:-1} << 30 ))
    # shellcheck disable=SC2086  # ROUTING_ARGS is a list of flags
    timeout -s INT -k 30 "$limit" python3 scripts/bench_routing.py --model $M/gpu-1b \
      --out "$out/routing-h200.json" --chart-router scripts/gpu/chart-router.json \
      --without-engine-arg=--enable-scale-out --start-first-alone \
      --replicas ${ROUTING_REPLICAS:-4} --rounds ${ROUTING_ROUNDS:-5} \
      --systems 16 --users-per-system 8 --turns 4 --system-words 720 --question-words 20 \
      --output-tokens 32 --rate ${ROUTING_RATE:-40} \
      --engine-arg=--dtype=bfloat16 --engine-arg=--max-model-len=4096 \
      --engine-arg=--gpu-memory-utilization=0.15 --engine-arg=--kv-cache-memory-bytes=$kv \
      --engine-arg=--max-cudagraph-capture-size=64 ${ROUTING_ARGS:-} 2>&1 | tee "$out/routing.out"
    cp -r "$(grep -o '"logs": "[^"]*"' "$out/routing-h200.json" 2>/dev/null | cut -d'"' -f4)" "$out/logs" 2>/dev/null
    gpu_leftovers ;;
  pd)
    # P/D against colocated (scripts/bench_pd.py): one prefill and one decode gpu-1b replica
    # behind vLLM's router in P/D mode vs two colocated ones behind it in its default mode,
    # all four on the one GPU, each PD_KV_GIB (8) GiB of KV cache (--kv-cache-memory-bytes:
    # no memory profiling among processes sharing the GPU); a long-prompt mix
    # (2-3.5k tokens in, 128-256 out: gpu-1b holds 4096 positions) with short chat turns. The chart's arguments come from
    # scripts/gpu/chart-pd.json (no helm here); vLLM 0.25.1 lacks --enable-scale-out. NIXL
    # (nixl-cu13 and its dependencies) is carried as .whl-pd/. UCX's transports are the chart's
    # GPU default (tcp,cuda_copy,self), or with PD_CHART=scripts/gpu/chart-pd-cuda-ipc.json its
    # documented GPU opt-in (cuda_ipc,cuda_copy,tcp,self). vLLM's own capture sizes on every
    # replica.
    router_wheels
    echo "== pd ($(date +%T))"
    mix=(--long 16 --chat 48 --long-in 2048:3584 --long-out 128:256 --chat-in 64:256 --chat-out 32:128)
    engine=(--dtype=bfloat16 --max-model-len=4096 --gpu-memory-utilization=0.2
      "--kv-cache-memory-bytes=$(( ${PD_KV_GIB:-8} << 30 ))")
    # shellcheck disable=SC2086  # PD_ARGS is a list of flags
    timeout -s INT -k 30 "${PD_LIMIT:-540}" python3 scripts/bench_pd.py --model $M/gpu-1b \
      --out "$out/pd-h200.json" --chart-pd "${PD_CHART:-scripts/gpu/chart-pd.json}" "${mix[@]}" \
      "${engine[@]/#/--engine-arg=}" --without-engine-arg=--enable-scale-out --omp-bind "" \
      --start-first-alone --rounds ${PD_ROUNDS:-4} --instances ${PD_INSTANCES:-1} \
      --rate ${PD_RATE:-4} ${PD_ARGS:-} 2>&1 | tee "$out/pd.out"
    cp -r "$(grep -o '"logs": "[^"]*"' "$out/pd-h200.json" 2>/dev/null | cut -d'"' -f4)" "$out/logs" 2>/dev/null
    gpu_leftovers ;;
  nixl)
    # NIXL's KV transport alone (scripts/nixl_transport.py): a process READs another's
    # registered buffer in 64 KiB blocks, per UCX_TLS: the chart's CPU default (tcp,self), TCP
    # with CUDA staging (tcp,cuda_copy,self), its documented GPU opt-in
    # (cuda_ipc,cuda_copy,tcp,self) and UCX's own choice, in GPU memory; then host memory. Needs only the host's torch and NIXL:
    # carry .whl-pd/ (no vLLM pack, any machine). NIXL_MIB (512), NIXL_ROUNDS (5),
    # NIXL_INSTANCES (2), NIXL_LIMIT (s per memory kind, 240).
    if [ ! -d /tmp/nixl-site/nixl ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/nixl-site .whl-pd/*.whl
    fi
    export PYTHONPATH=/tmp/nixl-site:$PYTHONPATH
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
    for mem in VRAM DRAM; do
      echo "== nixl $mem ($(date +%T))"
      tls=(--tls tcp,self --tls auto)
      [ "$mem" = VRAM ] && tls+=(--tls tcp,cuda_copy,self --tls cuda_ipc,cuda_copy,tcp,self)
      timeout -k 10 "${NIXL_LIMIT:-240}" python3 scripts/nixl_transport.py --mem $mem "${tls[@]}" \
        --total-mib ${NIXL_MIB:-512} --rounds ${NIXL_ROUNDS:-5} --instances ${NIXL_INSTANCES:-2} \
        --out "$out/nixl-$mem.json" > "$out/nixl-$mem.log" 2>&1
      echo "   exit $?"; grep -v " NIXL INFO " "$out/nixl-$mem.log" | tail -12
    done ;;
  fp8)
    echo "== fp8 vs bf16 ($(date +%T))"
    # Both variants compile from an empty cache, so their engine start compares like for like.
    rm -rf /tmp/cc/fp8cmp; VLLM_CACHE_ROOT=/tmp/cc/fp8cmp TRITON_CACHE_DIR=/tmp/cc/fp8cmp/triton \
    PYTHONPYCACHEPREFIX=/tmp/pyc-parity timeout -k 10 ${FP8_LIMIT:-240} python3 \
      scripts/gpu/fp8_compare.py --model $M/gpu-1b --reference $M/reference-gpu-1b.json \
      --out "$out/fp8-compare.json" --rounds ${FP8_ROUNDS:-6} > "$out/fp8-compare.log" 2>&1
    echo "   exit $? ($(date +%T))"; tail -25 "$out/fp8-compare.log"
    gpu_leftovers ;;
  lora)  # lora_throughput.py: 0, 1, 4, 16 adapters mixed, one engine (LORA_PRESET, LORA_ROUNDS, LORA_INSTANCES)
    echo "== LoRA adapters mixed ($(date +%T))"
    lp=${LORA_PRESET:-gpu-1b}
    for i in $(seq ${LORA_INSTANCES:-1}); do  # one engine instance each
      timeout -k 10 ${LORA_LIMIT:-420} python3 scripts/gpu/lora_throughput.py --model $M/$lp \
        --adapters $M/adapters-$lp --out "$out/lora-throughput-$i.json" \
        --rounds ${LORA_ROUNDS:-3} > "$out/lora-throughput-$i.log" 2>&1
      echo "   instance $i exit $? ($(date +%T))"; grep -A6 "^| adapters" "$out/lora-throughput-$i.log"
    done
    gpu_leftovers ;;
  bench)
    { nvidia-smi; python3 -c "import torch, vllm, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, 'transformers', transformers.__version__)"; } > "$out/env.txt" 2>&1
    cat "$out/env.txt" | tail -1
    for preset in seed gpu-1b; do
      python3 -m ministream_reference.golden --engine reference --device cuda --model $M/$preset \
        --out "$out/reference-$preset.json" > "$out/reference-$preset.log" 2>&1
      probe plugin-$preset 240 --model $M/$preset --golden
      probe llama-$preset 240 --model $M/$preset-llama --golden
    done ;;
  throughput)
    for preset in ${PRESETS:-seed gpu-1b}; do
      echo "== side by side: $preset ($(date +%T))"
      timeout ${THROUGHPUT_LIMIT:-280} python3 scripts/bench_plugin.py --model $M/$preset \
        --out "$out/side-by-side-$preset.json" --prompts 1024 --prompt-len 128 \
        --output-len 256 --rounds ${ROUNDS:-6} --concurrency 1,16,64 --decode-tokens 64 \
        --llm-args '{"dtype": "bfloat16", "max_model_len": 2048, "gpu_memory_utilization": 0.4}' \
        > "$out/side-by-side-$preset.log" 2>&1
      echo "   exit $?"; tail -4 "$out/side-by-side-$preset.log"
    done ;;
  loaders)
    for preset in ${PRESETS:-seed gpu-1b}; do  # cheap: the reference model on the GPU, fp32
      [ "${SKIP_REFERENCE:-0}" = 1 ] && break
      python3 -m ministream_reference.golden --engine reference --device cuda --model $M/$preset \
        --out "$out/reference-$preset.json" > "$out/reference-$preset.log" 2>&1
    done
    if compgen -G '.whl/*.whl' >/dev/null; then  # runai-model-streamer, for LOADERS=runai
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    fi
    if [[ " ${LOADERS:-default sharded runai} " == *" sharded "* ]]; then
      rm -rf $M/gpu-1b-sharded
      echo "== ministream shard TP=1 ($(date +%T))"
      /usr/bin/time -v timeout 300 python3 -m ministream.cli shard --model $M/gpu-1b \
        --tensor-parallel-size 1 --output $M/gpu-1b-sharded > "$out/shard.log" 2>&1
      echo "   exit $?"; tail -3 "$out/shard.log"
    fi
    for f in default:auto sharded:sharded_state runai:runai_streamer; do
      [[ " ${LOADERS:-default sharded runai} " == *" ${f%%:*} "* ]] || continue
      name=${f%%:*}; fmt=${f##*:}; dir=$M/gpu-1b; [ $name = sharded ] && dir=$M/gpu-1b-sharded
      evict $dir
      python3 - "$dir" > "$out/disk-$name.json" <<'PY'
import json, os, sys, time
root = sys.argv[1]; total = 0; t = time.perf_counter()
for f in sorted(os.listdir(root)):
    if f.endswith(".safetensors"):
        with open(os.path.join(root, f), "rb", buffering=0) as fh:
            while chunk := fh.read(64 << 20): total += len(chunk)
dt = time.perf_counter() - t
print(json.dumps({"bytes": total, "seconds": dt, "bytes_per_s": total / dt}))
PY
      evict $dir
      probe load-$name 200 --model $dir --load-format $fmt
    done ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
# The EXIT trap (pack_step) stamps the step's JSON and packs OUT/<step>-<n>.tgz.
