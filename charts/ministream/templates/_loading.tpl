{{/* Loading modes (values.schema.json admits only these four). */}}

{{- define "ministream.isSharded" -}}
{{- if has .Values.loading.mode (list "shardedState" "runaiStreamerSharded") -}}true{{- end -}}
{{- end -}}

{{- define "ministream.usesS3" -}}
{{- if has .Values.loading.mode (list "runaiStreamer" "runaiStreamerSharded") -}}true{{- end -}}
{{- end -}}

{{- define "ministream.usesModelVolume" -}}
{{- if has .Values.loading.mode (list "local" "shardedState") -}}true{{- end -}}
{{- end -}}

{{- define "ministream.hasS3Ca" -}}
{{- $ca := .Values.loading.s3.caBundle -}}
{{- if and (or (include "ministream.usesS3" .) (include "ministream.adaptersUseS3" .)) (or $ca.configMapName $ca.secretName) -}}true{{- end -}}
{{- end -}}

{{- define "ministream.loadFormat" -}}
{{- get (dict "local" "auto" "runaiStreamer" "runai_streamer" "shardedState" "sharded_state" "runaiStreamerSharded" "runai_streamer_sharded") .Values.loading.mode -}}
{{- end -}}

{{- define "ministream.localModelPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.loading.local.mountPath) (trimAll "/" .Values.loading.local.modelDir) -}}
{{- end -}}

{{- define "ministream.s3ModelUri" -}}
{{- printf "s3://%s/%s" .Values.loading.s3.bucket (trimAll "/" .Values.loading.s3.prefix) -}}
{{- end -}}

{{/*
Where the shards live: the configured path, or the model's path + "-tp<N>" ("-tp<N>-pp<M>"
with pipeline stages), so that a set for each layout has a path of its own.
*/}}
{{- define "ministream.shardsUri" -}}
{{- $pp := include "ministream.pipelineParallelSize" . | int -}}
{{- $suffix := printf "-tp%s%s" (include "ministream.tensorParallelSize" .) (ternary (printf "-pp%d" $pp) "" (gt $pp 1)) -}}
{{- $l := .Values.loading -}}
{{- if eq $l.mode "shardedState" -}}
{{- $dir := default (printf "%s%s" (trimAll "/" $l.local.modelDir) $suffix) (trimAll "/" $l.sharded.path) -}}
{{- printf "%s/%s" (trimSuffix "/" $l.local.mountPath) $dir -}}
{{- else -}}
{{- $key := default (printf "%s%s" (trimAll "/" $l.s3.prefix) $suffix) (trimAll "/" $l.sharded.path) -}}
{{- printf "s3://%s/%s" $l.s3.bucket $key -}}
{{- end -}}
{{- end -}}

{{/* The converted model the shards are made from and a compile cache is checked against. */}}
{{- define "ministream.sourceModelUri" -}}
{{- ternary (include "ministream.s3ModelUri" .) (include "ministream.localModelPath" .) (eq (include "ministream.usesS3" .) "true") -}}
{{- end -}}

{{/* What vLLM's --model gets. */}}
{{- define "ministream.modelUri" -}}
{{- if include "ministream.isSharded" . -}}
{{- include "ministream.shardsUri" . -}}
{{- else if include "ministream.usesS3" . -}}
{{- include "ministream.s3ModelUri" . -}}
{{- else -}}
{{- include "ministream.localModelPath" . -}}
{{- end -}}
{{- end -}}

{{/* S3 environment shared by vLLM and the shard preparation. Credentials by reference only. */}}
{{- define "ministream.s3Env" -}}
{{- $s3 := .Values.loading.s3 -}}
{{- with $s3.endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ . | quote }}
- name: RUNAI_STREAMER_S3_ENDPOINT
  value: {{ . | quote }}
{{- end }}
- name: AWS_REGION
  value: {{ $s3.region | quote }}
- name: AWS_DEFAULT_REGION
  value: {{ $s3.region | quote }}
- name: RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING
  value: {{ ternary "1" "0" $s3.virtualAddressing | quote }}
{{- if $s3.credentials.existingSecret }}
# Keys come from the Secret below; never wait on the EC2 metadata endpoint.
- name: AWS_EC2_METADATA_DISABLED
  value: "true"
{{- range $name, $key := dict "AWS_ACCESS_KEY_ID" $s3.credentials.accessKeyIdKey "AWS_SECRET_ACCESS_KEY" $s3.credentials.secretAccessKeyKey "AWS_SESSION_TOKEN" $s3.credentials.sessionTokenKey }}
{{- if $key }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $s3.credentials.existingSecret | quote }}
      key: {{ $key | quote }}
      {{- if eq $name "AWS_SESSION_TOKEN" }}
      optional: true
      {{- end }}
{{- end }}
{{- end }}
{{- else }}
# No key Secret: the pod's workload identity (IRSA's web-identity token, EKS Pod Identity's
# container credentials, or the instance metadata a GKE/EC2 identity answers on, which stays
# enabled). The streamer resolves it with boto3's chain: its own C++ chain asks
# sts.<region>.amazonaws.com for web identity and ignores AWS_ENDPOINT_URL(_STS)
# (reproduced in tests/loading/test_s3_workload_identity.py).
- name: RUNAI_STREAMER_NO_BOTO3_SESSION
  value: "0"
{{- end }}
{{- if or $s3.caBundle.configMapName $s3.caBundle.secretName }}
- name: AWS_CA_BUNDLE
  value: {{ printf "/etc/ministream/s3-ca/%s" $s3.caBundle.key | quote }}
{{- end }}
- name: RUNAI_STREAMER_CONCURRENCY
  value: {{ int $s3.concurrency | quote }}
- name: RUNAI_STREAMER_MEMORY_LIMIT
  value: {{ int64 $s3.memoryLimit | quote }}
{{- end -}}

{{- define "ministream.s3CaVolume" -}}
{{- $ca := .Values.loading.s3.caBundle -}}
{{- $items := list (dict "key" $ca.key "path" $ca.key) }}
- name: s3-ca
{{- if $ca.configMapName }}
  configMap:
    name: {{ $ca.configMapName | quote }}
{{- else }}
  secret:
    secretName: {{ $ca.secretName | quote }}
{{- end }}
    items:
      {{- toYaml $items | nindent 6 }}
{{- end -}}

{{- define "ministream.modelVolume" -}}
- name: model
{{- if .Values.loading.local.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.loading.local.existingClaim | quote }}
{{- else }}
  hostPath:
    path: {{ .Values.loading.local.hostPath | quote }}
    type: Directory
{{- end }}
{{- end -}}

{{/* The shard-preparation command: the same TP as the server, by construction. */}}
{{- define "ministream.shardCommand" -}}
{{- $cmd := list "ministream" "shard" "--model" (include "ministream.sourceModelUri" .) "--tensor-parallel-size" (include "ministream.tensorParallelSize" .) -}}
{{- $pp := include "ministream.pipelineParallelSize" . | int -}}
{{- if gt $pp 1 -}}
{{- $cmd = concat $cmd (list "--pipeline-parallel-size" $pp) -}}
{{- end -}}
{{- $cmd = concat $cmd (list "--output" (include "ministream.shardsUri" .)) -}}
{{- toYaml (concat $cmd .Values.loading.sharded.prepare.extraArgs | toStrings) -}}
{{- end -}}

{{- define "ministream.modelHashEnv" -}}
{{- with .Values.model.hash }}
# The plugin refuses weights made from any other model before reading them.
- name: MINISTREAM_MODEL_HASH
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Environment of the shard preparation (Job or initContainer). */}}
{{- define "ministream.shardEnv" -}}
- name: HOME
  value: /tmp
- name: HF_HOME
  value: /tmp/hf
{{- include "ministream.modelHashEnv" . }}
{{- if include "ministream.usesS3" . }}
{{- include "ministream.s3Env" . | trim | nindent 0 }}
{{- end }}
{{- end -}}

{{- define "ministream.shardVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if include "ministream.usesModelVolume" . }}
# The preparation writes the shards next to the model; the server mounts the volume read-only.
- name: model
  mountPath: {{ .Values.loading.local.mountPath | quote }}
{{- end }}
{{- if include "ministream.hasS3Ca" . }}
- name: s3-ca
  mountPath: /etc/ministream/s3-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "ministream.shardResources" -}}
{{- $res := deepCopy (default dict .Values.loading.sharded.prepare.resources) -}}
{{- if and .Values.loading.sharded.prepare.accelerator (eq .Values.accelerator.type "gpu") -}}
{{- $_ := set $res "limits" (merge (dict .Values.accelerator.resourceName (include "ministream.tensorParallelSize" . | int)) (default dict $res.limits)) -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}
