#!/usr/bin/env bash
# The GPU part of issue 6, run on the lent H200 (vLLM 0.25.1 unpacked to /tmp/site, see
# ../shared/gpu/README.md). Three steps, each one `run` call, back to back:
#   bash scripts/gpu/h200.sh models          # with .gpuxfer/cur1: writes test models to ~/m
#   bash scripts/gpu/h200.sh bench  "$OUT"   # with .gpuxfer/cur2: golden + cold start per engine
#   bash scripts/gpu/h200.sh throughput "$OUT"  # plugin vs Llama side by side, both shapes
#   bash scripts/gpu/h200.sh loaders "$OUT"  # cold start per loader + raw disk bandwidth
#                                            # (LOADERS="sharded" for one; runai needs .whl carried)
# PRESETS="gpu-1b" limits models/loaders/throughput to one shape (default: seed gpu-1b);
# ROUNDS and THROUGHPUT_LIMIT (seconds per shape) size the throughput step (6, 280);
# SKIP_REFERENCE=1 skips the loaders step's fp32 reference runs.
# Results: JSON + logs under $OUT; `python scripts/gpu/report.py DIR` renders the tables.
set -uo pipefail
cd "$(dirname "$0")/../.."
step=${1:?usage: h200.sh models|bench|loaders [OUT]}
out=${2:-/tmp/out}
mkdir -p "$out"
M=$HOME/m
# The plugin from the working tree, registered through a dist-info entry point so that
# every vLLM process (engine core, workers) loads it as in production.
di=plugins/ministream_serving-0.0.0.dist-info
mkdir -p $di
printf 'Metadata-Version: 2.1\nName: ministream-serving\nVersion: 0.0.0\n' > $di/METADATA
printf '[vllm.general_plugins]\nministream = ministream:register\n' > $di/entry_points.txt
export PYTHONPATH=$PWD/plugins:${PYTHONPATH:-}
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

case "$step" in
  models)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    for preset in ${PRESETS:-seed gpu-1b}; do
      python3 -m ministream.cli demo --preset $preset --output $M/raw-$preset >/dev/null &&
      python3 -m ministream.cli convert --quiet --checkpoint $M/raw-$preset/model.pt \
        --train-config $M/raw-$preset/train_config.json --tokenizer $M/raw-$preset/tokenizer \
        --output $M/$preset --dtype bfloat16 --max-shard-size 1GB
      rm -rf $M/raw-$preset
    done
    for preset in ${PRESETS:-seed gpu-1b}; do
      python3 -c "from ministream.golden import as_llama; as_llama('$M/$preset', '$M/$preset-llama')"
    done
    du -sh $M/* ;;
  bench)
    { nvidia-smi; python3 -c "import torch, vllm, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, 'transformers', transformers.__version__)"; } > "$out/env.txt" 2>&1
    cat "$out/env.txt" | tail -1
    for preset in seed gpu-1b; do
      python3 -m ministream.golden --engine reference --device cuda --model $M/$preset \
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
      python3 -m ministream.golden --engine reference --device cuda --model $M/$preset \
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
# At most 8 files come back from the machine: pack the step's results into one.
tar -czf "/tmp/results-$step.tgz" -C "$out" . && rm -f "$out"/* && mv "/tmp/results-$step.tgz" "$out/"
