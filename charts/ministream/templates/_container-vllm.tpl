{{/* The vLLM container of the server or leader pod: the OpenAI API, the probes, the preStop drain. */}}
{{- define "ministream.vllmContainer" -}}
{{- $sidecarPort := include "ministream.sidecarPort" . | int -}}
{{- $vllmPort := include "ministream.vllmPort" . | int -}}
{{- $startupDir := include "ministream.startupLogDir" . -}}
{{- $startupLog := include "ministream.startupLog" . -}}
- name: vllm
  image: {{ include "ministream.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    {{- include "ministream.vllmCommand" . | nindent 4 }}
  args:
    {{- include "ministream.vllmArgs" . | nindent 4 }}
  ports:
    - name: http
      containerPort: {{ $vllmPort }}
      protocol: TCP
    {{- if include "ministream.pdEnabled" . }}
    - name: nixl-side
      containerPort: {{ include "ministream.nixlSideChannelPort" . | int }}
      protocol: TCP
    {{- end }}
  env:
    {{- if .Values.apiKey.enabled }}
    - name: VLLM_API_KEY
      valueFrom:
        secretKeyRef:
          name: {{ .Values.apiKey.existingSecret | quote }}
          key: {{ .Values.apiKey.key | quote }}
    {{- end }}
    {{- if .Values.sidecar.token.existingSecret }}
    # Read by the preStop hook to authenticate its POST /drain.
    - name: MINISTREAM_SIDECAR_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ .Values.sidecar.token.existingSecret | quote }}
          key: {{ .Values.sidecar.token.key | quote }}
    {{- end }}
    {{- if and .Values.lora.enabled .Values.lora.dynamic.enabled }}
    # POST /v1/load_lora_adapter and /v1/unload_lora_adapter, behind the API key (schema).
    - name: VLLM_ALLOW_RUNTIME_LORA_UPDATING
      value: "True"
    {{- end }}
    # The plugin stamps vLLM's start into it, for the sidecar's cold-start phases.
    - name: MINISTREAM_SIDECAR_STARTUP_LOG
      value: {{ $startupLog | quote }}
    {{- include "ministream.engineEnv" . | nindent 4 }}
  {{- with .Values.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  startupProbe:
    # Budget {{ include "ministream.startupBudgetSeconds" . }} s = baseSeconds + ceil(sizeGiB x secondsPerGiB[{{ .Values.loading.mode }}]{{ if include "ministream.isSharded" . }} / (TP x PP){{ end }}).
    httpGet:
      path: /health
      port: http
    periodSeconds: {{ int .Values.probes.startup.periodSeconds }}
    timeoutSeconds: {{ int .Values.probes.startup.timeoutSeconds }}
    failureThreshold: {{ include "ministream.startupFailureThreshold" . }}
  # Readiness and liveness ask the sidecar (same network namespace), but sit on this
  # container so that a liveness failure restarts vLLM, not the sidecar.
  readinessProbe:
    httpGet:
      path: /readyz
      port: {{ $sidecarPort }}
    periodSeconds: {{ int .Values.probes.readiness.periodSeconds }}
    timeoutSeconds: {{ int .Values.probes.readiness.timeoutSeconds }}
    failureThreshold: {{ int .Values.probes.readiness.failureThreshold }}
  livenessProbe:
    httpGet:
      path: /livez
      port: {{ $sidecarPort }}
    periodSeconds: {{ int .Values.probes.liveness.periodSeconds }}
    timeoutSeconds: {{ int .Values.probes.liveness.timeoutSeconds }}
    failureThreshold: {{ int .Values.probes.liveness.failureThreshold }}
  lifecycle:
    preStop:
      {{- include "ministream.preStopDrain" . | nindent 6 }}
  resources:
    {{- include "ministream.engineResources" . | nindent 4 }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: startup-log
      mountPath: {{ $startupDir }}
    {{- if include "ministream.loraEnabled" . }}
    - name: adapters
      mountPath: {{ include "ministream.loraAdapterDir" . }}
      readOnly: true
    {{- end }}
    {{- include "ministream.engineVolumeMounts" . | nindent 4 }}
{{- end -}}
