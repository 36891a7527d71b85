{{/*
Multi-node serving: how one model replica's ranks (the parallel sizes of _vllm.tpl) fill
pods, one node each, and when they span nodes, the LeaderWorkerSet group's names, labels and
Ray workers (the leader's Ray head starts in ministream.vllmCommand).
*/}}

{{/*
The layout of one model replica, as YAML (world, nodes, ranksPerNode):
  world        = tensor x pipeline                 (ranks, one accelerator each)
  world <= perNode:  nodes = 1, ranksPerNode = world       (one pod: the Deployment)
  otherwise:         world must be a multiple of perNode,
                     nodes = world / perNode, ranksPerNode = perNode (a LeaderWorkerSet group)
perNode is accelerator.perNode. Everything that counts pods, accelerators or /dev/shm per pod
reads this helper.
*/}}
{{- define "ministream.layout" -}}
{{- $tp := include "ministream.tensorParallelSize" . | int -}}
{{- $pp := include "ministream.pipelineParallelSize" . | int -}}
{{- $perNode := int .Values.accelerator.perNode -}}
{{- $world := mul $tp $pp -}}
{{- $nodes := 1 -}}
{{- $ranks := $world -}}
{{- if gt $world $perNode -}}
{{- if ne (mod $world $perNode) 0 -}}
{{- fail (printf "parallelism: tensor (%d) x pipeline (%d) = %d accelerators is more than one node holds (accelerator.perNode=%d) and not a multiple of it: a multi-node replica fills whole nodes. Make tensor x pipeline a multiple of %d, or at most %d." $tp $pp $world $perNode $perNode $perNode) -}}
{{- end -}}
{{- $nodes = div $world $perNode -}}
{{- $ranks = $perNode -}}
{{- end -}}
{{- if and (gt $nodes 1) (eq .Values.accelerator.type "cpu") -}}
{{- fail (printf "parallelism: tensor (%d) x pipeline (%d) needs %d nodes, and multi-node serving (LeaderWorkerSet + Ray) needs accelerator.type=gpu; the CPU build serves on one node" $tp $pp $nodes) -}}
{{- end -}}
world: {{ $world }}
nodes: {{ $nodes }}
ranksPerNode: {{ $ranks }}
{{- end -}}

{{/* "true" when one model replica spans several nodes (a LeaderWorkerSet instead of the Deployment). */}}
{{- define "ministream.isMultiNode" -}}
{{- if gt (int (include "ministream.layout" . | fromYaml).nodes) 1 -}}true{{- end -}}
{{- end -}}

{{/* Accelerators (ranks) in one serving pod: the GPU limit, Ray's --num-gpus, /dev/shm. */}}
{{- define "ministream.ranksPerPod" -}}
{{- (include "ministream.layout" . | fromYaml).ranksPerNode | int -}}
{{- end -}}

{{/*
The LeaderWorkerSet's name. Not the full name: the LWS controller creates a headless Service
named after the LWS (the pods' shared subdomain, behind LWS_LEADER_ADDRESS), and the chart's
own Service already holds the full name.
*/}}
{{- define "ministream.lwsName" -}}
{{- include "ministream.componentName" (dict "ctx" . "suffix" "lws") -}}
{{- end -}}

{{/* What the autoscalers scale: the Deployment, or the LeaderWorkerSet (scale subresource, in groups). */}}
{{- define "ministream.scaleTargetRef" -}}
{{- if include "ministream.isMultiNode" . -}}
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
name: {{ include "ministream.lwsName" . }}
{{- else -}}
apiVersion: apps/v1
kind: Deployment
name: {{ include "ministream.fullname" . }}
{{- end -}}
{{- end -}}

{{/*
Labels and annotation of kubernetes-sigs/lws (v0.10.0, api/leaderworkerset/v1): the
controller sets the template revision on every pod of a revision, its pod webhook one group
key on every pod of a group; the exclusive-topology annotation on the LWS makes the webhook
give each pod affinity to its group's domain and anti-affinity to other groups' (1:1 group
per domain). LWS also has subgroup-exclusive-topology, read only with a subGroupPolicy, which
the chart does not set.
*/}}
{{- define "ministream.lwsRevisionLabel" -}}leaderworkerset.sigs.k8s.io/template-revision-hash{{- end -}}
{{- define "ministream.lwsGroupLabel" -}}leaderworkerset.sigs.k8s.io/group-key{{- end -}}
{{- define "ministream.lwsExclusiveAnnotation" -}}leaderworkerset.sigs.k8s.io/exclusive-topology{{- end -}}

{{/* A label selector of every pod of the multi-node groups: leaders (component server) and workers. */}}
{{- define "ministream.groupPodSelector" -}}
matchLabels:
  {{- include "ministream.selectorLabels" . | nindent 2 }}
matchExpressions:
  - key: app.kubernetes.io/component
    operator: In
    values:
      - server
      - worker
{{- end -}}

{{/* Ray's GCS port on the group's leader (the head). */}}
{{- define "ministream.rayPort" -}}6379{{- end -}}

{{/* Options of `ray start` shared by the head and the workers. */}}
{{- define "ministream.rayNodeOptions" -}}
--node-ip-address="$VLLM_HOST_IP" --num-gpus={{ include "ministream.ranksPerPod" . }} --disable-usage-stats
{{- end -}}

{{/*
A worker's command: wait until the leader's Ray head answers (a worker that exited instead
would restart its container, and the group's RecreateGroupOnPodRestart policy would then
recreate the whole group), then join it in the foreground. LWS injects LWS_LEADER_ADDRESS into
every container of the group.
*/}}
{{- define "ministream.rayWorkerCommand" -}}
{{- $address := printf "\"$LWS_LEADER_ADDRESS:%s\"" (include "ministream.rayPort" .) -}}
- sh
- -c
- {{ printf "until ray health-check --address=%s >/dev/null 2>&1; do sleep 5; done && exec ray start --address=%s %s --block" $address $address (include "ministream.rayNodeOptions" .) | quote }}
{{- end -}}

{{/*
A worker's preStop: a group is deleted as a whole, and a worker that left at once would take
its ranks from under the leader while it drains. It stays while the leader's Ray head
answers, at most sidecar.drainTimeoutSeconds + vllm.shutdownTimeoutSeconds (the leader's drain
and vLLM's shutdown), inside the same grace period.
*/}}
{{- define "ministream.rayWorkerPreStop" -}}
{{- $wait := add (int .Values.sidecar.drainTimeoutSeconds) (int .Values.vllm.shutdownTimeoutSeconds) -}}
exec:
  command:
    - sh
    - -c
    - {{ printf "end=$(( $(date +%%s) + %d )); while [ \"$(date +%%s)\" -lt \"$end\" ] && ray health-check --address=\"$LWS_LEADER_ADDRESS:%s\" >/dev/null 2>&1; do sleep 2; done" $wait (include "ministream.rayPort" .) | quote }}
{{- end -}}

{{/* A worker pod's one container: a Ray node holding ranksPerPod accelerators, with the engine's environment and volumes. */}}
{{- define "ministream.rayWorkerContainer" -}}
- name: ray-worker
  image: {{ include "ministream.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    {{- include "ministream.rayWorkerCommand" . | nindent 4 }}
  env:
    {{- include "ministream.engineEnv" . | nindent 4 }}
  {{- with .Values.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  lifecycle:
    preStop:
      {{- include "ministream.rayWorkerPreStop" . | nindent 6 }}
  resources:
    {{- include "ministream.engineResources" . | nindent 4 }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    {{- include "ministream.engineVolumeMounts" . | nindent 4 }}
{{- end -}}
