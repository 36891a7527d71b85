{{/*
LoRA adapters (lora.*; chart README, LoRA adapters). The fetch-adapters init container copies
each configured adapter into the "adapters" volume and admits only verified ones; vLLM gets
every configured name in --lora-modules and its entrypoint leaves out the ones not admitted.
*/}}

{{- define "ministream.loraEnabled" -}}
{{- if .Values.lora.enabled -}}true{{- end -}}
{{- end -}}

{{- define "ministream.loraAdapterDir" -}}/var/lib/ministream/adapters{{- end -}}

{{- define "ministream.adaptersUseS3" -}}
{{- if .Values.lora.enabled -}}
{{- range .Values.lora.adapters -}}
{{- if hasPrefix "s3://" .uri -}}true{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Slots of a batch: lora.maxLoras, or one more than the adapters when empty, so every pod keeps
a slot free beyond its static adapters (the picker's LoRA affinity prefers a pod with a free
slot, docs/fleet.md). No floor: with every slot in use vLLM's CPU LoRA ops read a base
request's "no adapter" index -1 as the last slot (vllm#48421), but the plugin's register()
swaps in a CPU wrapper that zeroes those rows in every vLLM process (docs/plugin.md, "The
full-slots guard") and GPU kernels skip -1, so a full set of slots serves base requests right.
*/}}
{{- define "ministream.loraMaxLoras" -}}
{{- $l := .Values.lora -}}
{{- if kindIs "invalid" $l.maxLoras -}}
{{- add (len $l.adapters) 1 -}}
{{- else -}}
{{- int $l.maxLoras -}}
{{- end -}}
{{- end -}}

{{- define "ministream.loraArgs" -}}
{{- $l := .Values.lora -}}
{{- if include "ministream.isMultiNode" . -}}
{{- fail "lora.enabled with a multi-node replica: the adapters are fetched into the leader pod only, and vLLM's ranks on the other pods read them from the same path. Serve adapters on one-node replicas (parallelism within accelerator.perNode)" -}}
{{- end -}}
{{- $maxLoras := include "ministream.loraMaxLoras" . | int -}}
{{- $names := list -}}
{{- range $l.adapters -}}
{{- if has .name $names -}}
{{- fail (printf "lora.adapters: the name %q is used twice; each adapter needs its own name" .name) -}}
{{- end -}}
{{- if eq .name $.Values.model.name -}}
{{- fail (printf "lora.adapters: %q is the base model's served name (model.name); give the adapter another name" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
- --enable-lora
- --max-loras
- {{ $maxLoras | quote }}
- --max-lora-rank
- {{ int $l.maxRank | quote }}
{{- if not (kindIs "invalid" $l.maxCpuLoras) }}
{{- if lt (int $l.maxCpuLoras) $maxLoras }}
{{- fail (printf "lora.maxCpuLoras=%d must be >= the adapter slots (lora.maxLoras, %d): vLLM refuses fewer" (int $l.maxCpuLoras) $maxLoras) }}
{{- end }}
- --max-cpu-loras
- {{ int $l.maxCpuLoras | quote }}
{{- end }}
{{- if $l.dynamic.enabled }}
{{- /* vLLM's key guards /v1 only; its SageMaker-style /adapters routes need this one. */}}
- --middleware
- ministream.adapter_guard.AdapterRoutesGuard
{{- end }}
{{- with $l.adapters }}
- --lora-modules
{{- range . }}
- {{ printf "%s=%s/%s" .name (include "ministream.loraAdapterDir" $) .name | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The names the sidecar warms up and reports, comma-separated (MINISTREAM_SIDECAR_LORA_ADAPTERS). */}}
{{- define "ministream.loraAdapterNames" -}}
{{- $names := list -}}
{{- range .Values.lora.adapters }}{{ $names = append $names .name }}{{ end -}}
{{- join "," $names -}}
{{- end -}}

{{- define "ministream.fetchAdaptersCommand" -}}
{{- $cmd := list "ministream" "fetch-adapters" -}}
{{- range .Values.lora.adapters -}}
{{- if not (hasPrefix "s3://" .uri) -}}
{{- if not (include "ministream.usesModelVolume" $) -}}
{{- fail (printf "lora.adapters %q: %s is a path, but loading.mode=%s mounts no model volume; use an s3:// URI" .name .uri $.Values.loading.mode) -}}
{{- end -}}
{{- $mount := trimSuffix "/" $.Values.loading.local.mountPath -}}
{{- if not (hasPrefix (printf "%s/" $mount) .uri) -}}
{{- fail (printf "lora.adapters %q: %s is not on the model volume (loading.local.mountPath %s)" .name .uri $mount) -}}
{{- end -}}
{{- end -}}
{{- $cmd = concat $cmd (list "--adapter" (printf "%s=%s" .name .uri)) -}}
{{- end -}}
{{- $cmd = concat $cmd (list "--output-dir" (include "ministream.loraAdapterDir" .) "--max-rank" (int .Values.lora.maxRank)) -}}
{{- toYaml ($cmd | toStrings) -}}
{{- end -}}

{{/*
Copies and verifies the adapters before vLLM starts: manifest, base model hash, rank, target
modules, finite and bounded values. A refused adapter is logged and left out; the pod serves the rest.
*/}}
{{- define "ministream.fetchAdaptersInitContainer" -}}
- name: fetch-adapters
  image: {{ include "ministream.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    {{- include "ministream.fetchAdaptersCommand" . | nindent 4 }}
  env:
    - name: HOME
      value: /tmp
    {{- with include "ministream.modelHashEnv" . | trim }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- if include "ministream.adaptersUseS3" . }}
    {{- include "ministream.s3Env" . | trim | nindent 4 }}
    {{- end }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    - name: adapters
      mountPath: {{ include "ministream.loraAdapterDir" . }}
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
  resources:
    requests:
      cpu: 100m
      memory: 256Mi
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
