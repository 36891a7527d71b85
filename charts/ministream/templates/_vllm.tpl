{{/*
The vLLM engine every serving pod runs: its parallel sizes, the container's command and
arguments, and its preStop hook. How the ranks fill pods and nodes is _multinode.tpl's.
*/}}

{{/*
The one tensor-parallel size of the release: parallelism.tensor, or its older name
tensorParallelSize (kept as an alias: every scenario and script written before parallelism.* existed sets
it); 1 when neither is set. Both set to different values is refused. The schema requires one
of them for the sharded modes.
*/}}
{{- define "ministream.tensorParallelSize" -}}
{{- $new := .Values.parallelism.tensor -}}
{{- $old := .Values.tensorParallelSize -}}
{{- if and (not (kindIs "invalid" $new)) (not (kindIs "invalid" $old)) (ne (int $new) (int $old)) -}}
{{- fail (printf "parallelism.tensor (%d) and tensorParallelSize (%d) disagree: tensorParallelSize is the older name of parallelism.tensor; set only parallelism.tensor" (int $new) (int $old)) -}}
{{- end -}}
{{- ternary $old $new (kindIs "invalid" $new) | default 1 | int -}}
{{- end -}}

{{- define "ministream.pipelineParallelSize" -}}
{{- .Values.parallelism.pipeline | int -}}
{{- end -}}

{{/*
The vLLM container's command (args: ministream.vllmArgs). A multi-node leader: a Ray head,
then vLLM as the container's main process; vLLM's Ray executor waits for the workers' GPUs to
join the cluster (its placement group, up to 1800 s in vLLM 0.32) before it loads weights.
The CPU build: the CPU image's entrypoint, which sizes the KV cache to fit the pod unless
VLLM_CPU_KVCACHE_SPACE or vllm.gpuMemoryUtilization does (vLLM's own 0.92 of the memory
limit refuses to start once the page cache holds 8 % of it), then execs the same server.
*/}}
{{/*
The CPU build and every one-node pod with LoRA adapters start vLLM through ministream_sidecar.serve_vllm
(KV cache sizing on CPU; adapters the fetch step refused left out of --lora-modules).
*/}}
{{- define "ministream.vllmModule" -}}
{{- ternary "ministream_sidecar.serve_vllm" "vllm.entrypoints.openai.api_server" (or (eq .Values.accelerator.type "cpu") (eq (include "ministream.loraEnabled" .) "true")) -}}
{{- end -}}

{{- define "ministream.vllmCommand" -}}
{{- if include "ministream.isMultiNode" . -}}
- sh
- -c
- {{ printf "ray start --head --port=%s %s --include-dashboard=false && exec python3 -m %s \"$@\"" (include "ministream.rayPort" .) (include "ministream.rayNodeOptions" .) (include "ministream.vllmModule" .) | quote }}
- vllm
{{- else -}}
- python3
- -m
- {{ include "ministream.vllmModule" . }}
{{- end -}}
{{- end -}}

{{- define "ministream.vllmArgs" -}}
- --model
- {{ include "ministream.modelUri" . | quote }}
- --served-model-name
- {{ .Values.model.name | quote }}
- --host
- "0.0.0.0"
- --port
- {{ include "ministream.vllmPort" . | quote }}
- --tensor-parallel-size
- {{ include "ministream.tensorParallelSize" . | quote }}
{{- $pp := include "ministream.pipelineParallelSize" . | int }}
{{- if gt $pp 1 }}
- --pipeline-parallel-size
- {{ $pp | quote }}
{{- end }}
{{- if include "ministream.isMultiNode" . }}
# Ranks on the other pods of the group join through the Ray head this container starts.
- --distributed-executor-backend
- ray
{{- end }}
- --shutdown-timeout
- {{ int .Values.vllm.shutdownTimeoutSeconds | quote }}
# GET /load counts the requests vLLM's HTTP server holds, which the preStop drain waits for:
# its engine gauges miss one not yet scheduled (docs/sidecar.md#what-the-drain-counts).
- --enable-server-load-tracking
{{- $format := include "ministream.loadFormat" . }}
{{- if ne $format "auto" }}
- --load-format
- {{ $format | quote }}
{{- end }}
{{- /* Only runai_streamer accepts concurrency/memory_limit here; the sharded loaders take just
       "pattern" and reject other keys, so runai_streamer_sharded gets them by env only. */}}
{{- if eq $format "runai_streamer" }}
- --model-loader-extra-config
- {{ dict "concurrency" (int .Values.loading.s3.concurrency) "memory_limit" (int64 .Values.loading.s3.memoryLimit) | toJson | quote }}
{{- end }}
{{- with .Values.vllm.gpuMemoryUtilization }}
- --gpu-memory-utilization
- {{ . | quote }}
{{- end }}
{{- with include "ministream.kvCacheBytes" . }}
- --kv-cache-memory-bytes
- {{ . | quote }}
{{- end }}
{{- with .Values.vllm.maxModelLen }}
- --max-model-len
- {{ int . | quote }}
{{- end }}
{{- if eq .Values.accelerator.type "gpu" }}
- --max-num-seqs
- {{ int .Values.vllm.maxNumSeqs | quote }}
{{- end }}
{{- with include "ministream.cudaGraphCaptureSizes" . }}
- --cudagraph-capture-sizes
{{- range fromJsonArray . }}
- {{ int . | quote }}
{{- end }}
{{- end }}
{{- with .Values.vllm.maxQueuedRequests }}
- --max-num-queued-reqs
- {{ int . | quote }}
{{- end }}
{{- if include "ministream.routerNeedsTokens" . }}
# The router's cache_aware policy tokenizes prompts through vLLM's render endpoints.
- --enable-scale-out
{{- end }}
{{- if include "ministream.pdEnabled" . }}
# Prefill/decode disaggregation: NIXL moves the prompt's KV cache between the pools.
- --kv-transfer-config
- {{ include "ministream.kvTransferConfig" . | quote }}
{{- end }}
{{- with .Values.vllm.kvOffload.sizeGiB }}
- --kv-offloading-size
- {{ . | quote }}
- --kv-offloading-backend
- native
{{- end }}
{{- if include "ministream.loraEnabled" . }}
{{ include "ministream.loraArgs" . }}
{{- end }}
{{- if not .Values.accessLog.probes }}
# The sidecar's /health poll, its drain's /load polls and Prometheus's scrapes stay out of
# vLLM's access log.
- --disable-access-log-for-endpoints
- "/health,/metrics,/load"
{{- end }}
{{- range .Values.vllm.extraArgs }}
- {{ toString . | quote }}
{{- end }}
{{- end -}}

{{/*
CUDA-graph capture sizes (`--cudagraph-capture-sizes`) as a JSON list, or "" for none: GPU
targets only (vLLM's CPU build captures no graphs and empties the list itself).
vllm.cudaGraphs.captureSizes `sparse` is the chart's rule, from N = vllm.maxNumSeqs:
  the powers of two up to N, the point 1.5x each power between it and the next from 16 on, and
  N itself; every size <= N (N = 256: 1 2 4 8 16 24 32 48 64 96 128 192 256).
A decode batch of B requests replays the smallest size >= B: above 16 requests it pads by
less than half of B. H200, gpu-1b: 13 sizes captured in 1-2 s against vLLM's own 51 (1, 2, 4, the
multiples of 8 to 256, of 16 to 512) in 4-5 s; docs/benchmarks.md, "Capture sizes", has the
throughput. `vllm`: no flag, vLLM's own sizes; a list: those sizes.
*/}}
{{- define "ministream.cudaGraphCaptureSizes" -}}
{{- $given := .Values.vllm.cudaGraphs.captureSizes -}}
{{- if eq .Values.accelerator.type "gpu" -}}
{{- if kindIs "slice" $given -}}
{{- $given | toJson -}}
{{- else if eq (toString $given) "sparse" -}}
{{- $n := int64 .Values.vllm.maxNumSeqs -}}
{{- $sizes := list -}}
{{- $p := int64 1 -}}
{{- range until 63 -}}
{{- if le $p $n -}}
{{- $sizes = append $sizes $p -}}
{{- $mid := div (mul $p 3) 2 -}}
{{- if and (ge $p 16) (le $mid $n) -}}
{{- $sizes = append $sizes $mid -}}
{{- end -}}
{{- end -}}
{{- $p = mul $p 2 -}}
{{- end -}}
{{- if not (has $n $sizes) -}}
{{- $sizes = append $sizes $n -}}
{{- end -}}
{{- $sizes | toJson -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
preStop of the vLLM container: the sidecar's own client (ministream_sidecar/client.py,
standard library only, in every serving image) POSTs /drain and waits for the answer: the
sidecar turns unready at once, then answers when vLLM is idle or after drainTimeoutSeconds.
vLLM's --shutdown-timeout still lets in-flight requests finish after the SIGTERM that follows.
*/}}
{{- define "ministream.preStopDrain" -}}
exec:
  command:
    - python3
    - -m
    - ministream_sidecar.client
    - drain
    - --timeout
    - {{ int .Values.sidecar.drainTimeoutSeconds | quote }}
{{- end -}}
