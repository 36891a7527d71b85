{{/* The vLLM container's arguments and its preStop hook. */}}

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
{{- range .Values.vllm.extraArgs }}
- {{ toString . | quote }}
{{- end }}
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
