{{/* The engine's environment, volume mounts and resources: the vLLM container, the init containers
that run the engine's image, and a multi-node group's Ray workers (templates/_multinode.tpl). */}}
{{/* vLLM's compile cache (VLLM_CACHE_ROOT, Triton's cache inside it): the compile-cache volume. */}}
{{- define "ministream.compileCacheRoot" -}}/var/cache/vllm{{- end -}}

{{/*
The engine's environment: vLLM on the server or leader, the Ray worker on the other pods of a
group (the ranks Ray starts there inherit it; vLLM forwards only its own VLLM_* variables).
*/}}
{{- define "ministream.engineEnv" -}}
{{- /* No PROMETHEUS_MULTIPROC_DIR: vLLM uses one only with --api-server-count > 1, then in a
fresh temporary directory of its own under /tmp at every start; a directory set here would
outlive a restarted vLLM container and feed KEDA, the HPA and the picker stale series. */ -}}
# Read-only root filesystem: every path vLLM writes to is a mounted volume.
- name: HOME
  value: /tmp
- name: HF_HOME
  value: /var/cache/ministream/hf
- name: VLLM_CACHE_ROOT
  value: {{ include "ministream.compileCacheRoot" . }}
- name: TRITON_CACHE_DIR
  value: {{ include "ministream.compileCacheRoot" . }}/triton
- name: VLLM_WORKER_MULTIPROC_METHOD
  value: {{ .Values.vllm.workerMultiprocMethod | quote }}
{{- if .Values.model.hash }}
{{- include "ministream.modelHashEnv" . | trim | nindent 0 }}
{{- end }}
{{- if include "ministream.usesS3" . }}
{{- include "ministream.s3Env" . | trim | nindent 0 }}
{{- end }}
{{- if include "ministream.pdEnabled" . }}
{{- include "ministream.nixlEnv" . | nindent 0 }}
{{- end }}
{{- with .Values.vllm.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- if include "ministream.isMultiNode" . }}
# The address Ray and vLLM's ranks advertise to the rest of the group.
- name: VLLM_HOST_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}
{{- end -}}

{{- define "ministream.engineVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
  subPath: vllm
- name: dshm
  mountPath: /dev/shm
- name: model-cache
  mountPath: /var/cache/ministream
- name: compile-cache
  mountPath: {{ include "ministream.compileCacheRoot" . }}
{{- if include "ministream.usesModelVolume" . }}
- name: model
  mountPath: {{ .Values.loading.local.mountPath | quote }}
  readOnly: true
{{- end }}
{{- if include "ministream.hasS3Ca" . }}
- name: s3-ca
  mountPath: /etc/ministream/s3-ca
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end -}}

{{/* The engine container's resources: vllm.resources plus ranksPerPod accelerators
(templates/_multinode.tpl), and the pod's share of the KV offload tier on each memory request
and limit that is set. */}}
{{- define "ministream.engineResources" -}}
{{- $res := deepCopy (default dict .Values.vllm.resources) }}
{{- $offloadMiB := include "ministream.kvOffloadMiBPerPod" . | int }}
{{- if gt $offloadMiB 0 }}
{{- range $side := list "requests" "limits" }}
{{- $block := index $res $side }}
{{- if and $block (hasKey $block "memory") }}
{{- $_ := set $block "memory" (printf "%dMi" (add (include "ministream.memoryMiB" (dict "quantity" $block.memory "at" (printf "vllm.resources.%s.memory" $side)) | int) $offloadMiB)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if eq .Values.accelerator.type "gpu" }}
{{- $limits := default dict $res.limits }}
{{- $_ := set $limits .Values.accelerator.resourceName (include "ministream.ranksPerPod" . | int) }}
{{- $_ = set $res "limits" $limits }}
{{- end }}
{{- toYaml $res }}
{{- end -}}
