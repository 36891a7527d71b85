{{/*
Helpers of the ministream chart, one file per concern (only defines: no object renders from a
_*.tpl file; every other template renders at most one object, chart README, Template layout):
  _helpers.tpl  names, labels, images, ports
  _loading.tpl  loading modes, model locations, S3 environment, shard preparation
  _vllm.tpl     the vLLM engine: parallel sizes, the container's command, arguments and
                preStop hook
  _budgets.tpl  the start-up budget, the grace period, the autoscaler's scale-down window,
                and the cross-field checks that values.schema.json cannot state (every
                other rule lives in the schema)
  _fleet.tpl    rollout strategy, pod spreading, the autoscalers' signals and behaviour
  _pod.tpl      the serving pod (Deployment, or a LeaderWorkerSet's leader and workers)
  _container-vllm.tpl, _container-sidecar.tpl, _initcontainers.tpl, _volumes.tpl
                the serving pod's containers and volumes
  _engine.tpl   the engine's environment, volume mounts and resources
  _multinode.tpl  the parallel layout (tensor x pipeline over nodes), the LeaderWorkerSet
                group and its Ray workers
  _lora.tpl     LoRA adapters: their fetch step and vLLM's flags
  _router.tpl   vLLM's router: its name, image and arguments
  _gateway.tpl  the inference gateway and the chart's endpoint picker
  _disaggregation.tpl  prefill/decode pools, NIXL's connector, ports and environment
Every name is cut to 63 characters (the DNS-label limit of object names and label values).
Fixed ports (docs/architecture.md §1.5): vLLM serves the OpenAI API, /health and /metrics on 8000; the
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

{{/* The chart's `helm test` pod (the NetworkPolicy lets it reach the API). */}}
{{- define "ministream.testSelectorLabels" -}}
{{ include "ministream.selectorLabels" . }}
app.kubernetes.io/component: test
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

{{/* "repository@sha256:…" when a digest pins the image, else "repository:tag". */}}
{{- define "ministream.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .repository (default .appVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "ministream.image" -}}
{{- $repo := ternary .Values.image.cpuRepository .Values.image.repository (eq .Values.accelerator.type "cpu") -}}
{{- include "ministream.imageRef" (dict "repository" $repo "image" .Values.image "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{- define "ministream.sidecarImage" -}}
{{- include "ministream.imageRef" (dict "repository" .Values.sidecar.image.repository "image" .Values.sidecar.image "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{/*
PromQL label matchers selecting this release's serving pods (for rules/*.yaml): the
Deployment's "<name>-<hash>-<id>", or a LeaderWorkerSet's leaders "<lws>-<group>" (its workers,
"<lws>-<group>-<index>", serve no metrics).
*/}}
{{- define "ministream.promSelector" -}}
{{- if include "ministream.isMultiNode" . -}}
namespace="{{ .Release.Namespace }}", pod=~"{{ include "ministream.lwsName" . }}-[0-9]+"
{{- else if include "ministream.pdEnabled" . -}}
namespace="{{ .Release.Namespace }}", pod=~"{{ include "ministream.fullname" . }}-(prefill|decode)-[a-z0-9]+-[a-z0-9]+"
{{- else -}}
namespace="{{ .Release.Namespace }}", pod=~"{{ include "ministream.fullname" . }}-[a-z0-9]+-[a-z0-9]+"
{{- end -}}
{{- end -}}
