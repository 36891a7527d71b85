{{/*
The init containers of the server or leader pod that the chart adds before the user's own
(`initContainers`) and the sidecar.
*/}}
{{- define "ministream.shardInitContainer" -}}
# Idempotent: exits at once when valid shards for this TP and model exist.
- name: shard
  image: {{ include "ministream.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    {{- include "ministream.shardCommand" . | nindent 4 }}
  env:
    {{- include "ministream.shardEnv" . | nindent 4 }}
  volumeMounts:
    {{- include "ministream.shardVolumeMounts" . | nindent 4 }}
  resources:
    {{- include "ministream.shardResources" . | nindent 4 }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{- define "ministream.compileCacheSeedInitContainer" -}}
# Seeds the empty compile cache when the archive was made for this vLLM, torch, GPU and
# model; otherwise it says why and leaves the cache empty. It never fails the pod. Same
# environment, volumes and accelerators as vLLM (nvidia-smi names the GPU).
- name: compile-cache-seed
  image: {{ include "ministream.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    {{- toYaml (list "ministream" "compile-cache" "unpack" "--archive" .Values.persistence.compileCache.seedArchive "--cache-root" (include "ministream.compileCacheRoot" .) "--model" (include "ministream.sourceModelUri" .)) | nindent 4 }}
  env:
    {{- include "ministream.engineEnv" . | nindent 4 }}
  volumeMounts:
    {{- include "ministream.engineVolumeMounts" . | nindent 4 }}
  resources:
    {{- include "ministream.engineResources" . | nindent 4 }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
