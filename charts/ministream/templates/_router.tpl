{{/*
vLLM's router (vllm-router) in front of the serving pods, with router.enabled. It finds the
serving pods itself through the Kubernetes API: a watch on the pods of the release's namespace
that carry the serving pods' selector labels (ministream.serverSelectorLabels, the one source:
the Deployment's pods, or a LeaderWorkerSet's leaders, the only pods labelled component=server).
*/}}

{{/* The router's API port (its Service port is service.port) and its Prometheus port. */}}
{{- define "ministream.routerPort" -}}8000{{- end -}}
{{- define "ministream.routerMetricsPort" -}}29000{{- end -}}

{{- define "ministream.routerName" -}}
{{- include "ministream.componentName" (dict "ctx" . "suffix" "router") -}}
{{- end -}}

{{- define "ministream.routerSelectorLabels" -}}
{{ include "ministream.selectorLabels" . }}
app.kubernetes.io/component: router
{{- end -}}

{{- define "ministream.routerImage" -}}
{{- include "ministream.imageRef" (dict "repository" .Values.router.image.repository "image" .Values.router.image "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{/*
`--selector` of vllm-router: "key=value" words, from the serving pods' own selector labels;
with "pool", a P/D pool's (`--prefill-selector`, `--decode-selector`).
Called with (dict "ctx" $) or (dict "ctx" $ "pool" POOL).
*/}}
{{- define "ministream.routerSelectorArgs" -}}
{{- $labels := dict -}}
{{- if .pool -}}
{{- $labels = include "ministream.pdPoolSelectorLabels" . | fromYaml -}}
{{- else -}}
{{- $labels = include "ministream.serverSelectorLabels" .ctx | fromYaml -}}
{{- end -}}
{{- range $key := keys $labels | sortAlpha }}
- {{ printf "%s=%s" $key (get $labels $key) | quote }}
{{- end -}}
{{- end -}}

{{/*
"true" when the router's policy matches prompts by token ids: vllm-router 0.1.17's cache_aware
asks a replica for them (POST /v1/completions/render), which vLLM 0.32 answers 403 unless it
runs with --enable-scale-out; without it every decision is `missing_tokens`.
*/}}
{{- define "ministream.routerNeedsTokens" -}}
{{- if and .Values.router.enabled (eq .Values.router.policy "cache_aware") -}}true{{- end -}}
{{- end -}}

{{/* The router container's arguments (the image's entrypoint is vllm-router). */}}
{{- define "ministream.routerArgs" -}}
{{- $r := .Values.router -}}
- --host
- "0.0.0.0"
- --port
- {{ include "ministream.routerPort" . | quote }}
- --policy
- {{ $r.policy | quote }}
- --service-discovery
- --service-discovery-namespace
- {{ .Release.Namespace | quote }}
- --service-discovery-port
- {{ include "ministream.vllmPort" . | quote }}
{{- if include "ministream.pdEnabled" . }}
# Prefill/decode disaggregation: each request goes to a prefill pod, then a decode pod that
# pulls the prompt's KV cache from it (NIXL); each pool found by its own labels.
- --vllm-pd-disaggregation
- --kv-connector
- {{ .Values.disaggregation.connector | quote }}
- --prefill-selector
{{- include "ministream.routerSelectorArgs" (dict "ctx" . "pool" "prefill") }}
- --decode-selector
{{- include "ministream.routerSelectorArgs" (dict "ctx" . "pool" "decode") }}
{{- else }}
- --selector
{{- include "ministream.routerSelectorArgs" (dict "ctx" .) }}
{{- end }}
- --prometheus-host
- "0.0.0.0"
- --prometheus-port
- {{ include "ministream.routerMetricsPort" . | quote }}
- --request-timeout-secs
- {{ int $r.requestTimeoutSeconds | quote }}
- --health-check-endpoint
- /health
- --health-check-interval-secs
- {{ int $r.healthCheck.intervalSeconds | quote }}
- --health-failure-threshold
- {{ int $r.healthCheck.failureThreshold | quote }}
- --retry-max-retries
- {{ int $r.retries.maxRetries | quote }}
- --cb-failure-threshold
- {{ int $r.circuitBreaker.failureThreshold | quote }}
- --cb-timeout-duration-secs
- {{ int $r.circuitBreaker.timeoutSeconds | quote }}
{{- if .Values.apiKey.enabled }}
# The router forwards each client's own Authorization header to vLLM, which checks it
# (VLLM_API_KEY); this key is what the router itself sends to the replicas. Kubernetes
# expands $(VLLM_API_KEY) from the Secret-backed variable below.
- --api-key
- $(VLLM_API_KEY)
{{- end }}
{{- range $r.extraArgs }}
- {{ toString . | quote }}
{{- end }}
{{- end -}}
