{{/*
The serving pod, one template for every workload that runs it:
  role "server"  the Deployment's pod (one node holds the whole replica)
  role "leader"  a LeaderWorkerSet group's leader: the same pod, vLLM started after a Ray head
  role "worker"  a group's other pods: one Ray node each (templates/_multinode.tpl), no sidecar,
                 the engine's environment and volumes, so every loading mode reaches every rank
Called with (dict "ctx" $ "role" ROLE), and "pool" POOL for a P/D pool's pod (_disaggregation.tpl).
*/}}
{{- define "ministream.podTemplate" -}}
{{- $role := .role -}}
{{- $pool := .pool -}}
{{- with .ctx -}}
{{- $main := ternary "ray-worker" "vllm" (eq $role "worker") -}}
metadata:
  labels:
    {{- include "ministream.labels" . | nindent 4 }}
    app.kubernetes.io/component: {{ ternary "worker" "server" (eq $role "worker") }}
    {{- with $pool }}
    {{ include "ministream.poolLabel" $ }}: {{ . }}
    {{- end }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    kubectl.kubernetes.io/default-container: {{ $main }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "ministream.serviceAccountName" . }}
  # Only the sidecar talks to the API server; it alone gets a token (projected below).
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ include "ministream.terminationGracePeriodSeconds" . }}
  {{- with .Values.podSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . | quote }}
    {{- end }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . | quote }}
  {{- end }}
  {{- with .Values.runtimeClassName }}
  runtimeClassName: {{ . | quote }}
  {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- include "ministream.topologySpreadConstraints" (dict "ctx" . "role" $role) | nindent 4 }}
  {{- end }}
  {{- if eq $role "worker" }}
  containers:
    {{- include "ministream.rayWorkerContainer" . | nindent 4 }}
  {{- else }}
  initContainers:
    {{- if and (include "ministream.isSharded" .) (eq .Values.loading.sharded.prepare.mode "initContainer") }}
    {{- include "ministream.shardInitContainer" . | nindent 4 }}
    {{- end }}
    {{- if .Values.persistence.compileCache.seedArchive }}
    {{- include "ministream.compileCacheSeedInitContainer" . | nindent 4 }}
    {{- end }}
    {{- if include "ministream.loraEnabled" . }}
    {{- include "ministream.fetchAdaptersInitContainer" . | nindent 4 }}
    {{- end }}
    {{- with .Values.initContainers }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- include "ministream.sidecarContainer" . | nindent 4 }}
  containers:
    {{- include "ministream.vllmContainer" . | nindent 4 }}
    {{- with .Values.extraContainers }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  volumes:
    {{- include "ministream.podVolumes" (dict "ctx" . "role" $role) | nindent 4 }}
{{- end -}}
{{- end -}}
