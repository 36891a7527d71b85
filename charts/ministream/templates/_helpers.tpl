{{/*
Helpers of the ministream chart. Every name is cut to 63 characters (the DNS-label limit of
Kubernetes object names and label values).
Fixed ports (DESIGN §7): vLLM serves the OpenAI API, /health and /metrics on 8000; the
sidecar serves /livez, /readyz, /warmup, /drain and /metrics on 8081.
*/}}

{{- define "ministream.vllmPort" -}}8000{{- end -}}
{{- define "ministream.sidecarPort" -}}8081{{- end -}}

{{- define "ministream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ministream.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of a secondary object: "<fullname>-<suffix>", the full name cut so the whole fits 63. */}}
{{- define "ministream.componentName" -}}
{{- $suffix := .suffix -}}
{{- $base := include "ministream.fullname" .ctx | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}

{{- define "ministream.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: stable across upgrades, so never the chart or app version. */}}
{{- define "ministream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ministream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* Serving pods only (the shard Job and the test pod carry other components). */}}
{{- define "ministream.serverSelectorLabels" -}}
{{ include "ministream.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "ministream.labels" -}}
helm.sh/chart: {{ include "ministream.chart" . }}
{{ include "ministream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ministream
{{- end -}}

{{- define "ministream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ministream.fullname" .) .Values.serviceAccount.name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "ministream.image" -}}
{{- $repo := ternary .Values.image.cpuRepository .Values.image.repository (eq .Values.accelerator.type "cpu") -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "ministream.sidecarImage" -}}
{{- printf "%s:%s" .Values.sidecar.image.repository (default .Chart.AppVersion .Values.sidecar.image.tag) -}}
{{- end -}}

{{/* ---------------------------------------------------------------- loading modes */}}

{{- define "ministream.isSharded" -}}
{{- if has .Values.loading.mode (list "shardedState" "runaiStreamerSharded") -}}true{{- end -}}
{{- end -}}

{{- define "ministream.usesS3" -}}
{{- if has .Values.loading.mode (list "runaiStreamer" "runaiStreamerSharded") -}}true{{- end -}}
{{- end -}}

{{- define "ministream.usesModelVolume" -}}
{{- if has .Values.loading.mode (list "local" "shardedState") -}}true{{- end -}}
{{- end -}}

{{/* The one tensor-parallel size of the release; everything TP-dependent reads it here. */}}
{{- define "ministream.tensorParallelSize" -}}
{{- $tp := .Values.tensorParallelSize -}}
{{- if kindIs "invalid" $tp -}}
{{- if include "ministream.isSharded" . -}}
{{- fail (printf "loading.mode=%s serves shards made for one TP size: set tensorParallelSize (the TP the shards are made for)" .Values.loading.mode) -}}
{{- end -}}
{{- $tp = 1 -}}
{{- end -}}
{{- if or (lt (int $tp) 1) (ne (toString (int $tp)) (toString $tp)) -}}
{{- fail (printf "tensorParallelSize must be an integer >= 1 (got %v)" .Values.tensorParallelSize) -}}
{{- end -}}
{{- int $tp -}}
{{- end -}}

{{- define "ministream.loadFormat" -}}
{{- $formats := dict "local" "auto" "runaiStreamer" "runai_streamer" "shardedState" "sharded_state" "runaiStreamerSharded" "runai_streamer_sharded" -}}
{{- $f := get $formats .Values.loading.mode -}}
{{- if not $f -}}
{{- fail (printf "loading.mode must be one of local, runaiStreamer, shardedState, runaiStreamerSharded (got %q)" .Values.loading.mode) -}}
{{- end -}}
{{- $f -}}
{{- end -}}

{{- define "ministream.localModelPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.loading.local.mountPath) (trimAll "/" .Values.loading.local.modelDir) -}}
{{- end -}}

{{- define "ministream.s3ModelUri" -}}
{{- printf "s3://%s/%s" .Values.loading.s3.bucket (trimAll "/" .Values.loading.s3.prefix) -}}
{{- end -}}

{{/* Where the shards live: the configured path, or the model's path + "-tp<N>". */}}
{{- define "ministream.shardsUri" -}}
{{- $tp := include "ministream.tensorParallelSize" . -}}
{{- if eq .Values.loading.mode "shardedState" -}}
{{- $dir := default (printf "%s-tp%s" (trimAll "/" .Values.loading.local.modelDir) $tp) (trimAll "/" .Values.loading.sharded.path) -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.loading.local.mountPath) $dir -}}
{{- else -}}
{{- $key := default (printf "%s-tp%s" (trimAll "/" .Values.loading.s3.prefix) $tp) (trimAll "/" .Values.loading.sharded.path) -}}
{{- printf "s3://%s/%s" .Values.loading.s3.bucket $key -}}
{{- end -}}
{{- end -}}

{{/* Source of the shard preparation: the converted model, on the volume or on S3. */}}
{{- define "ministream.shardSourceUri" -}}
{{- if eq .Values.loading.mode "shardedState" -}}
{{- include "ministream.localModelPath" . -}}
{{- else -}}
{{- include "ministream.s3ModelUri" . -}}
{{- end -}}
{{- end -}}

{{/* What vLLM's --model gets. */}}
{{- define "ministream.modelUri" -}}
{{- $mode := .Values.loading.mode -}}
{{- if eq $mode "local" -}}
{{- include "ministream.localModelPath" . -}}
{{- else if eq $mode "runaiStreamer" -}}
{{- include "ministream.s3ModelUri" . -}}
{{- else -}}
{{- include "ministream.shardsUri" . -}}
{{- end -}}
{{- end -}}

{{/* ---------------------------------------------------------------- budgets */}}

{{/*
startupProbe budget in seconds:
  baseSeconds + ceil(sizeGiB * secondsPerGiB[mode] / d), d = TP for sharded modes (each rank
  reads only its own shard, in parallel), else 1.
*/}}
{{- define "ministream.startupBudgetSeconds" -}}
{{- $s := .Values.probes.startup -}}
{{- $perGiB := index $s.secondsPerGiB .Values.loading.mode -}}
{{- $load := mulf .Values.model.sizeGiB $perGiB -}}
{{- if include "ministream.isSharded" . -}}
{{- $load = divf $load (include "ministream.tensorParallelSize" . | int) -}}
{{- end -}}
{{- add (int $s.baseSeconds) (int (ceil $load)) -}}
{{- end -}}

{{- define "ministream.startupFailureThreshold" -}}
{{- if .Values.probes.startup.failureThreshold -}}
{{- int .Values.probes.startup.failureThreshold -}}
{{- else -}}
{{- int (ceil (divf (include "ministream.startupBudgetSeconds" . | int) (int .Values.probes.startup.periodSeconds))) -}}
{{- end -}}
{{- end -}}

{{/*
Grace period: preStop waits up to the drain timeout, then vLLM gets SIGTERM and lets
in-flight requests run for up to --shutdown-timeout; the margin covers the preStop call
itself and process teardown. A configured value below that sum would cut requests off.
*/}}
{{- define "ministream.minGracePeriodSeconds" -}}
{{- add (int .Values.sidecar.drainTimeoutSeconds) (int .Values.vllm.shutdownTimeoutSeconds) (int .Values.shutdown.marginSeconds) -}}
{{- end -}}

{{- define "ministream.terminationGracePeriodSeconds" -}}
{{- $min := include "ministream.minGracePeriodSeconds" . | int -}}
{{- $set := .Values.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $set -}}
{{- $min -}}
{{- else if lt (int $set) $min -}}
{{- fail (printf "terminationGracePeriodSeconds=%d is too short: it must be >= sidecar.drainTimeoutSeconds (%d) + vllm.shutdownTimeoutSeconds (%d) + shutdown.marginSeconds (%d) = %d. Set terminationGracePeriodSeconds >= %d, leave it null to compute it, or lower the timeouts." (int $set) (int .Values.sidecar.drainTimeoutSeconds) (int .Values.vllm.shutdownTimeoutSeconds) (int .Values.shutdown.marginSeconds) $min $min) -}}
{{- else -}}
{{- int $set -}}
{{- end -}}
{{- end -}}

{{/* ---------------------------------------------------------------- validation */}}

{{/* Checks the schema cannot express (or that must hold with --skip-schema-validation too). */}}
{{- define "ministream.validate" -}}
{{- $v := .Values -}}
{{- $_ := include "ministream.loadFormat" . -}}
{{- $_ = include "ministream.tensorParallelSize" . -}}
{{- $_ = include "ministream.terminationGracePeriodSeconds" . -}}
{{- if not (has $v.accelerator.type (list "gpu" "cpu")) -}}
{{- fail (printf "accelerator.type must be gpu or cpu (got %q)" $v.accelerator.type) -}}
{{- end -}}
{{- if not (has $v.rollout.mode (list "surge" "inPlace")) -}}
{{- fail (printf "rollout.mode must be surge or inPlace (got %q)" $v.rollout.mode) -}}
{{- end -}}
{{- if $v.apiKey.enabled -}}
{{- $_ = required "apiKey.existingSecret is required: name an existing Secret holding the OpenAI API key (or set apiKey.enabled=false for an open endpoint)" $v.apiKey.existingSecret -}}
{{- end -}}
{{- if include "ministream.usesModelVolume" . -}}
{{- if not (or $v.loading.local.existingClaim $v.loading.local.hostPath) -}}
{{- fail (printf "loading.mode=%s reads the model from a volume: set loading.local.existingClaim (a PVC holding the converted model) or loading.local.hostPath" $v.loading.mode) -}}
{{- end -}}
{{- end -}}
{{- if include "ministream.usesS3" . -}}
{{- $_ = required (printf "loading.mode=%s streams from S3: set loading.s3.bucket" $v.loading.mode) $v.loading.s3.bucket -}}
{{- $_ = required (printf "loading.mode=%s streams from S3: set loading.s3.credentials.existingSecret to an existing Secret with the S3 keys" $v.loading.mode) $v.loading.s3.credentials.existingSecret -}}
{{- end -}}
{{- if and $v.loading.s3.caBundle.configMapName $v.loading.s3.caBundle.secretName -}}
{{- fail "set only one of loading.s3.caBundle.configMapName and loading.s3.caBundle.secretName" -}}
{{- end -}}
{{- if gt (float64 $v.sidecar.drainMinSeconds) (float64 $v.sidecar.drainTimeoutSeconds) -}}
{{- fail (printf "sidecar.drainMinSeconds (%v) must not exceed sidecar.drainTimeoutSeconds (%v): the minimum wait is part of the drain timeout" $v.sidecar.drainMinSeconds $v.sidecar.drainTimeoutSeconds) -}}
{{- end -}}
{{- if and $v.monitoring.serviceMonitor.enabled $v.monitoring.podMonitor.enabled -}}
{{- fail "enable only one of monitoring.serviceMonitor and monitoring.podMonitor: both would scrape every target twice" -}}
{{- end -}}
{{- $managed := list "--model" "--served-model-name" "--port" "--host" "--tensor-parallel-size" "-tp" "--load-format" "--shutdown-timeout" "--model-loader-extra-config" "--api-key" -}}
{{- range $v.vllm.extraArgs -}}
{{- $flag := regexReplaceAll "=.*$" (toString .) "" -}}
{{- if has $flag $managed -}}
{{- fail (printf "vllm.extraArgs must not set %s: the chart manages it (use model.name, tensorParallelSize, loading.*, vllm.shutdownTimeoutSeconds or apiKey instead)" $flag) -}}
{{- end -}}
{{- end -}}
{{- $limits := default dict $v.vllm.resources.limits -}}
{{- if hasKey $limits $v.accelerator.resourceName -}}
{{- fail (printf "do not set vllm.resources.limits.%s: the chart requests tensorParallelSize (%s) devices itself" $v.accelerator.resourceName (include "ministream.tensorParallelSize" .)) -}}
{{- end -}}
{{- end -}}

{{/* ---------------------------------------------------------------- container parts */}}

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
{{- with .Values.vllm.maxModelLen }}
- --max-model-len
- {{ int . | quote }}
{{- end }}
{{- range .Values.vllm.extraArgs }}
- {{ toString . | quote }}
{{- end }}
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
# Keys come from the Secret below; never wait on the EC2 metadata endpoint.
- name: AWS_EC2_METADATA_DISABLED
  value: "true"
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ $s3.credentials.existingSecret | quote }}
      key: {{ $s3.credentials.accessKeyIdKey | quote }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $s3.credentials.existingSecret | quote }}
      key: {{ $s3.credentials.secretAccessKeyKey | quote }}
{{- with $s3.credentials.sessionTokenKey }}
- name: AWS_SESSION_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $s3.credentials.existingSecret | quote }}
      key: {{ . | quote }}
      optional: true
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
{{- if $ca.configMapName }}
- name: s3-ca
  configMap:
    name: {{ $ca.configMapName | quote }}
    items:
      - key: {{ $ca.key | quote }}
        path: {{ $ca.key | quote }}
{{- else if $ca.secretName }}
- name: s3-ca
  secret:
    secretName: {{ $ca.secretName | quote }}
    items:
      - key: {{ $ca.key | quote }}
        path: {{ $ca.key | quote }}
{{- end }}
{{- end -}}

{{- define "ministream.hasS3Ca" -}}
{{- if and (include "ministream.usesS3" .) (or .Values.loading.s3.caBundle.configMapName .Values.loading.s3.caBundle.secretName) -}}true{{- end -}}
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
- ministream
- shard
- --model
- {{ include "ministream.shardSourceUri" . | quote }}
- --tensor-parallel-size
- {{ include "ministream.tensorParallelSize" . | quote }}
- --output
- {{ include "ministream.shardsUri" . | quote }}
{{- range .Values.loading.sharded.prepare.extraArgs }}
- {{ toString . | quote }}
{{- end }}
{{- end -}}

{{/* Environment of the shard preparation (Job or initContainer). */}}
{{- define "ministream.modelHashEnv" -}}
{{- with .Values.model.hash }}
# The plugin refuses weights made from any other model before reading them.
- name: MINISTREAM_MODEL_HASH
  value: {{ . | quote }}
{{- end }}
{{- end -}}

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
{{- $limits := default dict $res.limits -}}
{{- $_ := set $limits .Values.accelerator.resourceName (include "ministream.tensorParallelSize" . | int) -}}
{{- $_ = set $res "limits" $limits -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}

{{/*
preStop of the vLLM container: POST the sidecar's /drain and wait for it (the sidecar turns
unready, then waits until vLLM has no running or waiting requests). An httpGet hook cannot
POST, so this is an exec of the image's python3 with urllib (no curl in the vLLM images).
Errors are printed and swallowed: the pod is terminating either way, and vLLM's own
--shutdown-timeout still lets in-flight requests finish after SIGTERM.
*/}}
{{- define "ministream.preStopDrain" -}}
exec:
  command:
    - python3
    - -c
    - |
      import os, urllib.request
      req = urllib.request.Request("http://127.0.0.1:{{ include "ministream.sidecarPort" . }}/drain", data=b"", method="POST")
      token = os.environ.get("MINISTREAM_SIDECAR_TOKEN")
      if token:
          req.add_header("Authorization", "Bearer " + token)
      try:
          with urllib.request.urlopen(req, timeout={{ add (int .Values.sidecar.drainTimeoutSeconds) 5 }}) as resp:
              print("drain:", resp.status, resp.read(512).decode(errors="replace"))
      except Exception as exc:
          print("drain via sidecar failed:", exc)
{{- end -}}

{{/* PromQL label matchers selecting this release's serving pods (for rules/*.yaml). */}}
{{- define "ministream.promSelector" -}}
namespace="{{ .Release.Namespace }}", pod=~"{{ include "ministream.fullname" . }}-[a-z0-9]+-[a-z0-9]+"
{{- end -}}
