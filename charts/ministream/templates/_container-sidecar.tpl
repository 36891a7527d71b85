{{/* The sidecar: a native sidecar container of the server or leader pod (docs/sidecar.md). */}}
{{- define "ministream.sidecarContainer" -}}
{{- $sidecarPort := include "ministream.sidecarPort" . | int -}}
{{- $vllmPort := include "ministream.vllmPort" . | int -}}
{{- $tp := include "ministream.tensorParallelSize" . | int -}}
{{- $startupDir := include "ministream.startupLogDir" . -}}
{{- $startupLog := include "ministream.startupLog" . -}}
{{- $events := .Values.sidecar.events.enabled -}}
{{- $prefetch := .Values.sidecar.prefetch.enabled -}}
# Native sidecar (restartPolicy: Always): started before vLLM and stopped only after
# vLLM has exited, so vLLM's preStop can call /drain while the sidecar still serves.
- name: sidecar
  image: {{ include "ministream.sidecarImage" . | quote }}
  imagePullPolicy: {{ .Values.sidecar.image.pullPolicy }}
  restartPolicy: Always
  command:
    - ministream-sidecar
  ports:
    - name: sidecar
      containerPort: {{ $sidecarPort }}
      protocol: TCP
  env:
    - name: MINISTREAM_SIDECAR_PORT
      value: {{ $sidecarPort | quote }}
    - name: MINISTREAM_SIDECAR_VLLM_URL
      value: {{ printf "http://127.0.0.1:%d" $vllmPort | quote }}
    - name: MINISTREAM_SIDECAR_MODEL_NAME
      value: {{ .Values.model.name | quote }}
    {{- if .Values.apiKey.enabled }}
    - name: MINISTREAM_SIDECAR_API_KEY
      valueFrom:
        secretKeyRef:
          name: {{ .Values.apiKey.existingSecret | quote }}
          key: {{ .Values.apiKey.key | quote }}
    # An empty or blank key in the Secret stops the pod here, before vLLM (which would
    # take an empty VLLM_API_KEY as "no key") starts serving open.
    - name: MINISTREAM_SIDECAR_API_KEY_REQUIRED
      value: "true"
    {{- end }}
    {{- if .Values.sidecar.token.existingSecret }}
    - name: MINISTREAM_SIDECAR_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ .Values.sidecar.token.existingSecret | quote }}
          key: {{ .Values.sidecar.token.key | quote }}
    - name: MINISTREAM_SIDECAR_TOKEN_REQUIRED
      value: "true"
    {{- end }}
    {{- if include "ministream.loraEnabled" . }}
    # Readiness waits for a warmup request to each of these (docs/sidecar.md, LoRA adapters).
    - name: MINISTREAM_SIDECAR_LORA_ADAPTERS
      value: {{ include "ministream.loraAdapterNames" . | quote }}
    {{- end }}
    # /warmup and /drain answer loopback peers only unless this is true.
    - name: MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK
      value: {{ .Values.sidecar.control.fromNetwork | quote }}
    - name: MINISTREAM_SIDECAR_ACCESS_LOG_PROBES
      value: {{ .Values.accessLog.probes | quote }}
    - name: MINISTREAM_SIDECAR_SLOW_PROBE_SECONDS
      value: {{ .Values.accessLog.slowProbeSeconds | quote }}
    - name: MINISTREAM_SIDECAR_WARMUP_REQUESTS
      value: {{ int .Values.sidecar.warmup.requests | quote }}
    - name: MINISTREAM_SIDECAR_WARMUP_CONCURRENCY
      value: {{ int .Values.sidecar.warmup.concurrency | quote }}
    - name: MINISTREAM_SIDECAR_WARMUP_PROMPT_TOKENS
      value: {{ int .Values.sidecar.warmup.promptTokens | quote }}
    - name: MINISTREAM_SIDECAR_WARMUP_MAX_TOKENS
      value: {{ int .Values.sidecar.warmup.maxTokens | quote }}
    - name: MINISTREAM_SIDECAR_DRAIN_TIMEOUT_SECONDS
      value: {{ int .Values.sidecar.drainTimeoutSeconds | quote }}
    - name: MINISTREAM_SIDECAR_DRAIN_MIN_SECONDS
      value: {{ .Values.sidecar.drainMinSeconds | quote }}
    - name: MINISTREAM_SIDECAR_LIVENESS_FAILURE_THRESHOLD
      value: {{ int .Values.sidecar.livenessFailureThreshold | quote }}
    - name: MINISTREAM_SIDECAR_HEALTH_INTERVAL_SECONDS
      value: {{ .Values.sidecar.healthIntervalSeconds | quote }}
    - name: MINISTREAM_SIDECAR_INFO_REVISION
      value: {{ .Values.model.revision | quote }}
    - name: MINISTREAM_SIDECAR_INFO_LOAD_FORMAT
      value: {{ include "ministream.loadFormat" . | quote }}
    - name: MINISTREAM_SIDECAR_INFO_TENSOR_PARALLEL_SIZE
      value: {{ $tp | quote }}
    - name: MINISTREAM_SIDECAR_STARTUP_LOG
      value: {{ $startupLog | quote }}
    {{- if $prefetch }}
    # Read into the page cache while vLLM imports (docs/sidecar.md, Prefetch): vLLM's
    # VLLM_CACHE_ROOT (small: first) and what its --model gets (an s3:// URI is skipped).
    - name: MINISTREAM_SIDECAR_PREFETCH_PATHS
      value: {{ printf "%s,%s" (include "ministream.compileCacheRoot" .) (include "ministream.modelUri" .) | quote }}
    {{- end }}
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: POD_UID
      valueFrom:
        fieldRef:
          fieldPath: metadata.uid
    - name: HOME
      value: /tmp
    {{- with .Values.sidecar.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
      subPath: sidecar
    - name: startup-log
      mountPath: {{ $startupDir }}
      readOnly: true
    {{- if $prefetch }}
    {{- if include "ministream.usesModelVolume" . }}
    - name: model
      mountPath: {{ .Values.loading.local.mountPath | quote }}
      readOnly: true
    {{- end }}
    - name: compile-cache
      mountPath: {{ include "ministream.compileCacheRoot" . }}
      readOnly: true
    {{- end }}
    {{- if $events }}
    - name: kube-api-access
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
    {{- end }}
  resources:
    {{- include "ministream.sidecarResources" . | nindent 4 }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* vLLM's processes stamp their start into this file; the sidecar reads it (docs/architecture.md §1.6). */}}
{{- define "ministream.startupLogDir" -}}/var/run/ministream/startup{{- end -}}
{{- define "ministream.startupLog" -}}{{ include "ministream.startupLogDir" . }}/vllm.log{{- end -}}

{{/*
The sidecar's resources: sidecar.resources, and while it prefetches a local model, its memory
limit (if set) raised by model.sizeGiB: the page cache it fills is charged to its memory cgroup,
and past the limit the kernel would evict what it read first. The request stays: page cache is
reclaimable and vLLM would hold the same pages after its own read.
*/}}
{{- define "ministream.sidecarResources" -}}
{{- $res := deepCopy (default dict .Values.sidecar.resources) -}}
{{- $limits := default dict $res.limits -}}
{{- if and .Values.sidecar.prefetch.enabled (include "ministream.usesModelVolume" .) (hasKey $limits "memory") -}}
{{- $mib := include "ministream.memoryMiB" (dict "quantity" $limits.memory "at" "sidecar.resources.limits.memory") | int -}}
{{- $_ := set $limits "memory" (printf "%dMi" (add $mib (ceil (mulf .Values.model.sizeGiB 1024.0) | int))) -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}
