{{/*
Prefill/decode disaggregation (disaggregation.enabled, docs/fleet.md "Prefill/decode
disaggregation"): two Deployments of the same serving pod, a prefill pool and a decode pool,
behind vLLM's router in P/D mode. Every replica runs vLLM's NixlConnector as kv_both with the
same model, plugin and parallelism (NIXL's compatibility check compares them); only the pod
label ministream.io/pool and the replica count differ. The decode replica pulls the prompt's KV
cache from the prefill replica: the handshake over vLLM's side channel (a ZMQ port), the data
over UCX (TCP here: a fixed port range, so the NetworkPolicy can name it).
*/}}

{{- define "ministream.pdEnabled" -}}
{{- if .Values.disaggregation.enabled -}}true{{- end -}}
{{- end -}}

{{/* The pools, in the order the chart renders them. */}}
{{- define "ministream.pdPools" -}}prefill decode{{- end -}}

{{/* The label whose value tells the pools apart (the router's --prefill-selector / --decode-selector). */}}
{{- define "ministream.poolLabel" -}}ministream.io/pool{{- end -}}

{{/* A pool's Deployment name, "<fullname>-<pool>". Called with (dict "ctx" $ "pool" POOL). */}}
{{- define "ministream.pdPoolName" -}}
{{- include "ministream.componentName" (dict "ctx" .ctx "suffix" .pool) -}}
{{- end -}}

{{/* A pool's selector labels: the serving pods' own plus the pool. Called with (dict "ctx" $ "pool" POOL). */}}
{{- define "ministream.pdPoolSelectorLabels" -}}
{{ include "ministream.serverSelectorLabels" .ctx }}
{{ include "ministream.poolLabel" .ctx }}: {{ .pool }}
{{- end -}}

{{/*
vLLM's NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT, vLLM's default): the decode replica
fetches the prefill replica's NIXL metadata here before its first transfer.
*/}}
{{- define "ministream.nixlSideChannelPort" -}}5600{{- end -}}

{{/* `--kv-transfer-config` of every replica. */}}
{{- define "ministream.kvTransferConfig" -}}
{{- $d := .Values.disaggregation -}}
{{- dict "kv_connector" "NixlConnector" "kv_role" "kv_both" "kv_load_failure_policy" $d.kvLoadFailurePolicy | toJson -}}
{{- end -}}

{{/*
UCX_TLS: disaggregation.nixl.ucxTransports, or when null the accelerator's default: NIXL's UCX
backend refuses to start where NVIDIA GPUs are present unless CUDA memory support is among
the transports (`cuda_copy`, or `cuda` for all of UCX's CUDA transports). Empty: UCX's choice.
*/}}
{{- define "ministream.ucxTransports" -}}
{{- $t := .Values.disaggregation.nixl.ucxTransports -}}
{{- if kindIs "invalid" $t -}}
{{- ternary "tcp,self" "tcp,cuda_copy,self" (eq .Values.accelerator.type "cpu") -}}
{{- else -}}
{{- $t -}}
{{- end -}}
{{- end -}}

{{/*
The engine's NIXL environment. The side channel advertises the pod's IP (vLLM's default,
localhost, reaches only the pod itself). UCX: the transports (UCX_TLS) and the TCP port range
its data connections listen on (UCX_TCP_PORT_RANGE; UCX's default is any ephemeral port).
*/}}
{{- define "ministream.nixlEnv" -}}
{{- $n := .Values.disaggregation.nixl -}}
{{- $tls := include "ministream.ucxTransports" . -}}
- name: VLLM_NIXL_SIDE_CHANNEL_HOST
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: VLLM_NIXL_SIDE_CHANNEL_PORT
  value: {{ include "ministream.nixlSideChannelPort" . | quote }}
{{- with $tls }}
- name: UCX_TLS
  value: {{ . | quote }}
{{- end }}
- name: UCX_TCP_PORT_RANGE
  value: {{ printf "%d-%d" (int $n.ucxPortRange.start) (int $n.ucxPortRange.end) | quote }}
{{- end -}}

{{/* What P/D cannot be combined with, each refused with the reason. */}}
{{- define "ministream.pdValidate" -}}
{{- $v := .Values -}}
{{- if $v.disaggregation.enabled -}}
{{- if not $v.router.enabled -}}
{{- fail "disaggregation.enabled needs router.enabled=true: vLLM's router (in P/D mode) sends each request to a prefill and then a decode replica; without it nothing would pair them" -}}
{{- end -}}
{{- if include "ministream.isMultiNode" . -}}
{{- fail "disaggregation.enabled works with single-node replicas only (a Deployment per pool): lower parallelism.tensor x parallelism.pipeline to accelerator.perNode or below" -}}
{{- end -}}
{{- if $v.autoscaling.enabled -}}
{{- fail "disaggregation.enabled and autoscaling.enabled: the autoscaler scales one workload, P/D renders two (set disaggregation.prefill.replicas and disaggregation.decode.replicas instead)" -}}
{{- end -}}
{{- if $v.gateway.enabled -}}
{{- fail "disaggregation.enabled and gateway.enabled: the InferencePool would send requests to prefill and decode pods alike; the router is the P/D front (gateway.httpRoute with router.expose reaches it)" -}}
{{- end -}}
{{- $ucx := $v.disaggregation.nixl.ucxPortRange -}}
{{- if gt (int $ucx.start) (int $ucx.end) -}}
{{- fail (printf "disaggregation.nixl.ucxPortRange: start (%d) must not exceed end (%d)" (int $ucx.start) (int $ucx.end)) -}}
{{- end -}}
{{- $tls := include "ministream.ucxTransports" . -}}
{{- if and $tls (eq $v.accelerator.type "gpu") (not (has "cuda_copy" (splitList "," $tls))) (not (has "cuda" (splitList "," $tls))) -}}
{{- fail (printf "disaggregation.nixl.ucxTransports=%q on GPUs: NIXL's UCX backend refuses to start where NVIDIA GPUs are present unless cuda_copy (or cuda) is among the transports; add cuda_copy, or leave it null for the GPU default (tcp,cuda_copy,self)" $tls) -}}
{{- end -}}
{{- if $v.vllm.kvOffload.sizeGiB -}}
{{- fail "disaggregation.enabled and vllm.kvOffload.sizeGiB: both take vLLM's one KV connector (NixlConnector for P/D, OffloadingConnector for offload)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
A pool's Deployment (deployment-prefill.yaml, deployment-decode.yaml): the serving Deployment
of deployment.yaml with the pool's name, selector, labels and replica count.
Called with (dict "ctx" $ "pool" POOL).
*/}}
{{- define "ministream.pdDeployment" -}}
{{- $pool := .pool -}}
{{- with .ctx -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "ministream.pdPoolName" (dict "ctx" . "pool" $pool) }}
  labels:
    {{- include "ministream.labels" . | nindent 4 }}
    app.kubernetes.io/component: server
    {{ include "ministream.poolLabel" . }}: {{ $pool }}
spec:
  replicas: {{ int (get .Values.disaggregation $pool).replicas }}
  revisionHistoryLimit: {{ int .Values.rollout.revisionHistoryLimit }}
  minReadySeconds: {{ int .Values.rollout.minReadySeconds }}
  # A rollout may legitimately spend the whole startup budget loading weights, plus warmup.
  progressDeadlineSeconds: {{ add (include "ministream.startupBudgetSeconds" . | int) 600 }}
  strategy:
    type: RollingUpdate
    # rollout.mode={{ .Values.rollout.mode }} preset, overridden by rollout.maxSurge / maxUnavailable.
    rollingUpdate:
      {{- include "ministream.rollingUpdate" . | nindent 6 }}
  selector:
    matchLabels:
      {{- include "ministream.pdPoolSelectorLabels" (dict "ctx" . "pool" $pool) | nindent 6 }}
  template:
    {{- include "ministream.podTemplate" (dict "ctx" . "role" "server" "pool" $pool) | nindent 4 }}
{{- end -}}
{{- end -}}
