# MiniStream Serving — developer entry points. `make help` lists them.
# The two that matter: `make serve` (demo model on CPU at 127.0.0.1:8000) and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(VENV)/bin/python
ART := .artifacts
DEMO_RAW := $(ART)/demo/raw
DEMO_MODEL := $(ART)/models/ministream-demo
TINY_RAW := $(ART)/demo/tiny-raw
TINY_MODEL := $(ART)/models/ministream-tiny
PORT ?= 8000
SIDECAR_PORT ?= 8081
# `make serve` leaves vLLM's CPU KV cache to `ministream up`, which sizes it to the machine
# (docs/sidecar.md); the benchmarks below pin theirs (GiB) so that their results compare.
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: most of an engine test is waiting (a start, a drain, a
# load at a fixed rate), so two share two cores well; tests/support/workers.py groups them.
TEST_WORKERS ?= 2

.PHONY: help setup setup-test demo-model serve test lint wheel-check unit chart-snapshots docs-tables images bench-plugin bench-convert bench-load bench-serve bench-rollout-router bench-rollout-pd bench-rollout-soak bench-bad-release bench-bad-release-podman bench-overload bench-lora-mix bench-routing bench-pd bench-nixl soak clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

setup:  ## create .venv with the engine (vLLM CPU build), S3 support and the sidecar
	@scripts/setup.sh serve

setup-test:  ## create .venv with everything the tests need (+ helm, Prometheus, HAProxy)
	@scripts/setup.sh test

$(DEMO_MODEL)/ministream_manifest.json: | setup
	@test -d $(DEMO_RAW) || $(VENV)/bin/ministream demo --preset seed --output $(DEMO_RAW)
	$(VENV)/bin/ministream convert --checkpoint $(DEMO_RAW)/model.pt \
	  --train-config $(DEMO_RAW)/train_config.json --tokenizer $(DEMO_RAW)/tokenizer \
	  --output $(DEMO_MODEL) --dtype bfloat16 --force

demo-model: $(DEMO_MODEL)/ministream_manifest.json  ## build the demo MiniStream checkpoint and convert it

serve: setup demo-model  ## serve the demo model: OpenAI API on 127.0.0.1:$(PORT), sidecar on $(SIDECAR_PORT)
	$(VENV)/bin/ministream up --model $(DEMO_MODEL) --port $(PORT) --sidecar-port $(SIDECAR_PORT) \
	  -- --served-model-name ministream-demo --max-model-len 2048

lint:  ## ruff (lint and format) and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy plugins service loadtest devtools scripts

wheel-check:  ## build the wheel, install it into a fresh venv, run each command from there (~2 min)
	$(PY) scripts/wheel_check.py

unit: setup-test  ## the fast tests only (no vLLM engine)
	$(PY) -m pytest -m "not engine" $(PYTEST_ARGS)

chart-snapshots: setup-test  ## re-render tests/charts/snapshots/ after an intended chart change (the diff is the review)
	$(PY) tests/charts/test_chart_snapshots.py --update

docs-tables:  ## re-render the docs' tables of measured figures from docs/results (scripts/docs_tables.py)
	$(PY) scripts/docs_tables.py

# The images first (`make images`; without root it says so and the image tests are skipped
# with that reason); the layer cache and the bootstrapped base make a second run on the same
# machine take about a minute.
test: setup-test lint wheel-check  ## install what the tests need, then run the whole suite (what CI runs)
	python3 scripts/images.py build --skip-without-root
	$(PY) -m pytest -n $(TEST_WORKERS) --durations=25 $(PYTEST_ARGS)

# Standard library only (no .venv needed); root, buildah and podman (scripts/install_oci.sh).
images:  ## build the CPU serving, sidecar and router images (+ the GPU image's steps) with buildah; prints sizes
	@scripts/setup.sh oci
	python3 scripts/images.py build

# Every result file records the command a person ran (docs/benchmarks.md, "How results are
# recorded"): these targets pass it to the benchmarks unless the caller already set it.
RESULT_TARGETS := images bench-plugin bench-convert bench-load bench-serve bench-overload soak \
  bench-rollout-soak bench-rollout-pd bench-pd bench-nixl
$(RESULT_TARGETS): export MINISTREAM_COMMAND ?= $(strip make $(MAKECMDGOALS) $(MAKEOVERRIDES))

# 12 fresh engines, one at a time (4 plugin, 4 Llama, 4 plugin for the A/A), ~70 s each on
# 2 vCPUs, most of it the start: the engine core runs in the instance's own process, which
# halves that start, and the first engine of each model compiles (docs/benchmarks.md).
bench-plugin: setup demo-model  ## plugin vs built-in Llama over fresh engine instances, A/A beside it (seed shape, ~15 min)
	VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 $(PY) scripts/bench_plugin.py \
	  --model $(DEMO_MODEL) --out $(ART)/bench-plugin.json --instances 4 \
	  --prompts 16 --prompt-len 128 --output-len 64 --rounds 4 --concurrency 1,8 \
	  --llm-args '{"max_model_len": 512, "dtype": "float32"}'

bench-convert: setup  ## converter peak memory vs --max-shard-size per layout (model.pt, DCP, safetensors)
	$(PY) scripts/bench_convert.py --out $(ART)/bench-convert.json

bench-load: setup-test  ## cold start and weight bytes/s per loading path (~1.2 GB model, local S3)
	$(PY) scripts/bench_load.py --out $(ART)/bench-load.json

$(TINY_MODEL)/ministream_manifest.json: | setup
	@test -d $(TINY_RAW) || $(VENV)/bin/ministream demo --preset tiny --output $(TINY_RAW)
	$(VENV)/bin/ministream convert --checkpoint $(TINY_RAW)/model.pt \
	  --train-config $(TINY_RAW)/train_config.json --tokenizer $(TINY_RAW)/tokenizer \
	  --output $(TINY_MODEL) --dtype float32 --force

# The rolling restart runs the tiny model: the bf16 demo model saturates 2 vCPUs at ~0.4
# req/s, and the restart mechanics do not depend on the model's size (docs/benchmarks.md).
ROLLOUT_ARGS := --replicas 2 --rate 4 --model $(TINY_MODEL) --served-model-name ministream-tiny
ROLLOUT := $(VENV)/bin/ministream-loadtest rollout $(ROLLOUT_ARGS)
ROLLOUT_VLLM := -- --dtype float32 --max-model-len 512 --enforce-eager

bench-serve: setup-test images demo-model $(TINY_MODEL)/ministream_manifest.json  ## SLO report for the demo model + the full rolling-restart experiment (processes and the images' pods)
	VLLM_CPU_KVCACHE_SPACE=2 $(VENV)/bin/ministream-loadtest run --serve $(DEMO_MODEL) --model ministream-demo \
	  --scenario short-chat --scenario long-prompt --scenario long-generation --scenario mixed \
	  --output-dir $(ART)/bench-serve/slo -- --max-model-len 2048
	VLLM_CPU_KVCACHE_SPACE=1 $(ROLLOUT) --output $(ART)/bench-serve/rollout-drain.json $(ROLLOUT_VLLM)
	VLLM_CPU_KVCACHE_SPACE=1 $(ROLLOUT) --no-drain --output $(ART)/bench-serve/rollout-nodrain.json \
	  $(ROLLOUT_VLLM)
	# The same pair on the chart's rendered pods, run from the images by podman kube play.
	eval "$$(python3 scripts/images.py env)" && VLLM_CPU_KVCACHE_SPACE=1 $(ROLLOUT) --runtime podman \
	  --output $(ART)/bench-serve/rollout-podman-drain.json $(ROLLOUT_VLLM)
	eval "$$(python3 scripts/images.py env)" && VLLM_CPU_KVCACHE_SPACE=1 $(ROLLOUT) --runtime podman \
	  --no-drain --output $(ART)/bench-serve/rollout-podman-nodrain.json $(ROLLOUT_VLLM)

bench-rollout-router: setup-test $(TINY_MODEL)/ministream_manifest.json  ## the rolling-restart pair (drain / --no-drain) behind vLLM's router instead of HAProxy (~30 min on 2 cores)
	VLLM_CPU_KVCACHE_SPACE=1 $(ROLLOUT) --front router \
	  --output $(ART)/bench-serve/rollout-router-drain.json $(ROLLOUT_VLLM)
	VLLM_CPU_KVCACHE_SPACE=1 $(ROLLOUT) --front router --no-drain \
	  --output $(ART)/bench-serve/rollout-router-nodrain.json $(ROLLOUT_VLLM)

# Prefill/decode disaggregation behind the router: each pool rolled in its own run (2 pods of
# it, 1 of the other: three engines on 2 cores), the first replacement drained and the second
# the paired control; inPlace, so no fourth engine; prompts of 160 tokens, over one KV block
# (vLLM's CPU block size is 128; NIXL moves whole blocks); the router's health checks given
# 60 s as in the P/D live test (docs/loadtest.md, `--pd-pool`); 0.5 requests/s: one at a time a
# request took 5-14 s through these three engines on 2 cores, and one prefill and one decode
# replica could not keep up with 2 requests/s in `make bench-pd`; `round_robin`: under the
# chart's `cache_aware` every request went to the first prefill pod the router discovered
# (docs/fleet.md, "Prefill/decode disaggregation").
ROLLOUT_PD := $(VENV)/bin/ministream-loadtest rollout --front router --replicas 2 --rate 0.5 \
  --router-policy round_robin \
  --input-tokens 160 --rollout-mode inPlace --restarts 2 --control-restarts 1 \
  --control-endpoint-lag 6 --model $(TINY_MODEL) --served-model-name ministream-tiny \
  --chart-set 'router.extraArgs=["--health-check-timeout-secs","60"]'
bench-rollout-pd: setup-test $(TINY_MODEL)/ministream_manifest.json  ## P/D behind vLLM's router: a drained replacement and a paired control, once per pool (prefill, decode)
	VLLM_CPU_KVCACHE_SPACE=1 $(ROLLOUT_PD) --pd-pool prefill \
	  --output $(ART)/bench-serve/rollout-pd-prefill.json $(ROLLOUT_VLLM)
	VLLM_CPU_KVCACHE_SPACE=1 $(ROLLOUT_PD) --pd-pool decode \
	  --output $(ART)/bench-serve/rollout-pd-decode.json $(ROLLOUT_VLLM)

# Drained rollouts back to back behind both fronts, the no-drain control beside them: enough
# rollouts and requests to see a 1-in-1 000 loss (docs/benchmarks.md, "Rollout soak"). At
# SOAK_RATE req/s a rollout of the tiny model sends ~2 000 requests on 2 cores.
# An interrupted soak continues where it stopped; SOAK_FRONTS=haproxy runs one front.
SOAK_RATE ?= 10
SOAK_FRONTS ?= haproxy,router
bench-rollout-soak: setup-test $(TINY_MODEL)/ministream_manifest.json  ## 10 drained rollouts per front (HAProxy, vLLM's router) + 2 no-drain controls each; every failure kept with its logs (~5 h on 2 cores)
	VLLM_CPU_KVCACHE_SPACE=1 $(PY) scripts/bench_rollout_soak.py --resume --fronts $(SOAK_FRONTS) \
	  --out $(ART)/bench-serve/rollout-soak.json --rollouts 10 --control-rollouts 2 \
	  -- $(ROLLOUT_ARGS) --rate $(SOAK_RATE) $(ROLLOUT_VLLM)

# A bad release: the same fleet and load as the rolling restart, upgraded to a missing model,
# a shard set for TP=2, and an engine flag vLLM refuses; each stall lasts the rendered
# progressDeadlineSeconds, whose startup budget is sized for the tiny model here (631 s).
TINY_TP2 := $(ART)/models/ministream-tiny-tp2
BAD_RELEASE_CHART := --chart-set probes.startup.baseSeconds=30 --chart-set model.sizeGiB=0.01

$(TINY_TP2)/ministream_shards.json: $(TINY_MODEL)/ministream_manifest.json
	VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/ministream shard --model $(TINY_MODEL) -tp 2 \
	  --dtype float32 --output $(TINY_TP2) --quiet

bench-bad-release: setup-test $(TINY_MODEL)/ministream_manifest.json $(TINY_TP2)/ministream_shards.json  ## three bad releases under load, each stalled for the progress deadline, then rolled back (~45 min)
	VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/ministream-loadtest bad-release --replicas 2 --rate 4 \
	  --model $(TINY_MODEL) --served-model-name ministream-tiny --shards $(TINY_TP2) \
	  $(BAD_RELEASE_CHART) --output $(ART)/bench-serve/bad-release.json $(ROLLOUT_VLLM)

bench-bad-release-podman: setup-test images $(TINY_MODEL)/ministream_manifest.json $(TINY_TP2)/ministream_shards.json  ## the three bad releases on the chart's rendered pods from the images (podman kube play), 30 s stalls (~15 min)
	eval "$$(python3 scripts/images.py env)" && VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/ministream-loadtest \
	  bad-release --runtime podman --replicas 2 --rate 4 --stall-seconds 30 \
	  --model $(TINY_MODEL) --served-model-name ministream-tiny --shards $(TINY_TP2) \
	  $(BAD_RELEASE_CHART) --output $(ART)/bench-serve/bad-release-podman.json $(ROLLOUT_VLLM)

LORA_ADAPTERS := $(ART)/adapters/ministream-tiny
$(LORA_ADAPTERS)/%/ministream_manifest.json: $(TINY_MODEL)/ministream_manifest.json
	$(VENV)/bin/ministream demo-lora --base $(TINY_MODEL) --output $(LORA_ADAPTERS)/$*.pt \
	  --rank $(if $(filter support,$*),8,4) --seed $(if $(filter support,$*),0,1)
	$(VENV)/bin/ministream convert-lora --adapter $(LORA_ADAPTERS)/$*.pt --base $(TINY_MODEL) \
	  --output $(LORA_ADAPTERS)/$* --force --quiet

bench-lora-mix: setup-test $(LORA_ADAPTERS)/support/ministream_manifest.json $(LORA_ADAPTERS)/legal/ministream_manifest.json  ## SLO report per adapter: the tiny model + 2 LoRA adapters, base and both at once (~10 min)
	VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/ministream-loadtest run --serve $(TINY_MODEL) \
	  --model ministream-tiny --scenario adapter-mix --output-dir $(ART)/bench-lora-mix \
	  -- --dtype float32 --max-model-len 512 --enforce-eager --enable-lora --max-loras 3 \
	  --max-lora-rank 8 --lora-modules support=$(LORA_ADAPTERS)/support legal=$(LORA_ADAPTERS)/legal

bench-routing: setup-test $(TINY_MODEL)/ministream_manifest.json  ## vLLM's router in front of 2 tiny replicas: cache_aware and kv_aware vs round_robin, paired rounds (~15 min)
	$(VENV)/bin/python scripts/bench_routing.py --model $(TINY_MODEL) --rounds 6 \
	  --policies round_robin,cache_aware,kv_aware --out docs/results/serve/routing-cpu.json

# Four tiny replicas at once (two per arm, each arm's on cores 0 and 1), a router per arm;
# long prompts cut to 320-400 tokens to fit the tiny model's 512 positions (scripts/bench_pd.py).
bench-pd: setup-test $(TINY_MODEL)/ministream_manifest.json  ## P/D (1 prefill + 1 decode) vs 2 colocated tiny replicas behind vLLM's router: TTFT/ITL p50/p99, paired rounds, verdict (~15 min)
	$(VENV)/bin/python scripts/bench_pd.py --model $(TINY_MODEL) --rounds 6 \
	  --out $(ART)/bench-serve/pd-cpu.json

# NIXL alone between two processes on this machine (host memory): the chart's CPU transport
# against UCX's own choice (shared memory and `cma` on one host); the GPU host's run is
# `scripts/gpu/h200.sh nixl`.
bench-nixl: setup-test  ## NIXL's KV transport alone: READ GB/s per UCX_TLS between two fresh processes, host memory, and an idle agent's CPU (~2 min)
	$(VENV)/bin/python scripts/nixl_transport.py --mem DRAM --tls tcp,self --tls auto \
	  --instances 3 --idle-seconds 10 --out $(ART)/bench-serve/nixl-cpu.json

bench-overload: setup-test $(TINY_MODEL)/ministream_manifest.json  ## one pod at 1x, 2x, 5x its measured capacity, the chart's probes replayed (~10 min)
	VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/ministream-loadtest overload --model $(TINY_MODEL) \
	  --served-model-name ministream-tiny --level-seconds 30 \
	  --output $(ART)/bench-overload/overload.json $(ROLLOUT_VLLM)

soak: setup-test $(TINY_MODEL)/ministream_manifest.json  ## one pod at moderate load for 30 min, sidecar and vLLM RSS sampled (not CI)
	VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/ministream-loadtest soak --model $(TINY_MODEL) \
	  --served-model-name ministream-tiny --minutes $(or $(SOAK_MINUTES),30) \
	  --output $(ART)/soak/soak.json $(ROLLOUT_VLLM)

clean:  ## remove generated models and benchmark results (keeps .venv)
	rm -rf $(ART)
