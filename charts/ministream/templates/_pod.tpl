{{/*
The serving pod, one template for every workload that runs it:
  role "server"  the Deployment's pod (one node holds the whole replica)
  role "leader"  a LeaderWorkerSet group's leader: the same pod, vLLM started after a Ray head
  role "worker"  a group's other pods: one Ray node each (templates/_multinode.tpl), no sidecar,
                 the engine's environment and volumes, so every loading mode reaches every rank
Called with (dict "ctx" $ "role" ROLE).
*/}}
{{- define "ministream.podTemplate" -}}
{{- $role := .role -}}
{{- with .ctx -}}
{{- $tp := include "ministream.tensorParallelSize" . | int -}}
{{- $ranks := include "ministream.ranksPerPod" . | int -}}
{{- $sidecarPort := include "ministream.sidecarPort" . | int -}}
{{- $vllmPort := include "ministream.vllmPort" . | int -}}
{{- $events := and .Values.sidecar.events.enabled (ne $role "worker") -}}
{{- $main := ternary "ray-worker" "vllm" (eq $role "worker") -}}
{{- /* vLLM's processes stamp their start here; the sidecar reads it (startup_log.py). */ -}}
{{- $startupDir := "/var/run/ministream/startup" -}}
{{- $startupLog := printf "%s/vllm.log" $startupDir -}}
metadata:
  labels:
    {{- include "ministream.labels" . | nindent 4 }}
    app.kubernetes.io/component: {{ ternary "worker" "server" (eq $role "worker") }}
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
  {{- if and .Values.topologySpreadConstraints (ne $role "worker") }}
  topologySpreadConstraints:
    {{- include "ministream.topologySpreadConstraints" . | nindent 4 }}
  {{- end }}
  {{- if eq $role "worker" }}
  containers:
    {{- include "ministream.rayWorkerContainer" . | nindent 4 }}
  {{- else }}
  initContainers:
    {{- if and (include "ministream.isSharded" .) (eq .Values.loading.sharded.prepare.mode "initContainer") }}
    # Idempotent: exits at once when valid shards for this TP and model exist.
    - name: shard
      image: {{ include "ministream.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command:
        {{- include "ministream.shardCommand" . | nindent 8 }}
      env:
        {{- include "ministream.shardEnv" . | nindent 8 }}
      volumeMounts:
        {{- include "ministream.shardVolumeMounts" . | nindent 8 }}
      resources:
        {{- include "ministream.shardResources" . | nindent 8 }}
      {{- with .Values.securityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    {{- end }}
    {{- if .Values.persistence.compileCache.seedArchive }}
    # Seeds the empty compile cache when the archive was made for this vLLM, torch, GPU and
    # model; otherwise it says why and leaves the cache empty. It never fails the pod. Same
    # environment, volumes and accelerators as vLLM (nvidia-smi names the GPU).
    - name: compile-cache-seed
      image: {{ include "ministream.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command:
        {{- toYaml (list "ministream" "compile-cache" "unpack" "--archive" .Values.persistence.compileCache.seedArchive "--cache-root" (include "ministream.compileCacheRoot" .) "--model" (include "ministream.sourceModelUri" .)) | nindent 8 }}
      env:
        {{- include "ministream.engineEnv" . | nindent 8 }}
      volumeMounts:
        {{- include "ministream.engineVolumeMounts" . | nindent 8 }}
      resources:
        {{- include "ministream.engineResources" . | nindent 8 }}
      {{- with .Values.securityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    {{- end }}
    {{- with .Values.initContainers }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    # Native sidecar (restartPolicy: Always): started before vLLM and stopped only after
    # vLLM has exited, so vLLM's preStop can call /drain while the sidecar still serves.
    - name: sidecar
      image: {{ include "ministream.sidecarImage" . | quote }}
      imagePullPolicy: {{ .Values.sidecar.image.pullPolicy }}
      restartPolicy: Always
      command:
        - ministream-sidecar
      ports:
        - name: sidecar
          containerPort: {{ $sidecarPort }}
          protocol: TCP
      env:
        - name: MINISTREAM_SIDECAR_PORT
          value: {{ $sidecarPort | quote }}
        - name: MINISTREAM_SIDECAR_VLLM_URL
          value: {{ printf "http://127.0.0.1:%d" $vllmPort | quote }}
        - name: MINISTREAM_SIDECAR_MODEL_NAME
          value: {{ .Values.model.name | quote }}
        {{- if .Values.apiKey.enabled }}
        - name: MINISTREAM_SIDECAR_API_KEY
          valueFrom:
            secretKeyRef:
              name: {{ .Values.apiKey.existingSecret | quote }}
              key: {{ .Values.apiKey.key | quote }}
        # An empty or blank key in the Secret stops the pod here, before vLLM (which would
        # take an empty VLLM_API_KEY as "no key") starts serving open.
        - name: MINISTREAM_SIDECAR_API_KEY_REQUIRED
          value: "true"
        {{- end }}
        {{- if .Values.sidecar.token.existingSecret }}
        - name: MINISTREAM_SIDECAR_TOKEN
          valueFrom:
            secretKeyRef:
              name: {{ .Values.sidecar.token.existingSecret | quote }}
              key: {{ .Values.sidecar.token.key | quote }}
        - name: MINISTREAM_SIDECAR_TOKEN_REQUIRED
          value: "true"
        {{- end }}
        # /warmup and /drain answer loopback peers only unless this is true.
        - name: MINISTREAM_SIDECAR_CONTROL_FROM_NETWORK
          value: {{ .Values.sidecar.control.fromNetwork | quote }}
        - name: MINISTREAM_SIDECAR_WARMUP_REQUESTS
          value: {{ int .Values.sidecar.warmup.requests | quote }}
        - name: MINISTREAM_SIDECAR_WARMUP_CONCURRENCY
          value: {{ int .Values.sidecar.warmup.concurrency | quote }}
        - name: MINISTREAM_SIDECAR_WARMUP_PROMPT_TOKENS
          value: {{ int .Values.sidecar.warmup.promptTokens | quote }}
        - name: MINISTREAM_SIDECAR_WARMUP_MAX_TOKENS
          value: {{ int .Values.sidecar.warmup.maxTokens | quote }}
        - name: MINISTREAM_SIDECAR_DRAIN_TIMEOUT_SECONDS
          value: {{ int .Values.sidecar.drainTimeoutSeconds | quote }}
        - name: MINISTREAM_SIDECAR_DRAIN_MIN_SECONDS
          value: {{ .Values.sidecar.drainMinSeconds | quote }}
        - name: MINISTREAM_SIDECAR_LIVENESS_FAILURE_THRESHOLD
          value: {{ int .Values.sidecar.livenessFailureThreshold | quote }}
        - name: MINISTREAM_SIDECAR_HEALTH_INTERVAL_SECONDS
          value: {{ .Values.sidecar.healthIntervalSeconds | quote }}
        - name: MINISTREAM_SIDECAR_INFO_REVISION
          value: {{ .Values.model.revision | quote }}
        - name: MINISTREAM_SIDECAR_INFO_LOAD_FORMAT
          value: {{ include "ministream.loadFormat" . | quote }}
        - name: MINISTREAM_SIDECAR_INFO_TENSOR_PARALLEL_SIZE
          value: {{ $tp | quote }}
        - name: MINISTREAM_SIDECAR_STARTUP_LOG
          value: {{ $startupLog | quote }}
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        - name: POD_UID
          valueFrom:
            fieldRef:
              fieldPath: metadata.uid
        - name: HOME
          value: /tmp
        {{- with .Values.sidecar.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
          subPath: sidecar
        - name: startup-log
          mountPath: {{ $startupDir }}
          readOnly: true
        {{- if $events }}
        - name: kube-api-access
          mountPath: /var/run/secrets/kubernetes.io/serviceaccount
          readOnly: true
        {{- end }}
      resources:
        {{- toYaml .Values.sidecar.resources | nindent 8 }}
      {{- with .Values.securityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  containers:
    - name: vllm
      image: {{ include "ministream.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command:
        {{- include "ministream.vllmCommand" . | nindent 8 }}
      args:
        {{- include "ministream.vllmArgs" . | nindent 8 }}
      ports:
        - name: http
          containerPort: {{ $vllmPort }}
          protocol: TCP
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
        # The plugin stamps vLLM's start into it, for the sidecar's cold-start phases.
        - name: MINISTREAM_SIDECAR_STARTUP_LOG
          value: {{ $startupLog | quote }}
        {{- include "ministream.engineEnv" . | nindent 8 }}
      {{- with .Values.envFrom }}
      envFrom:
        {{- toYaml . | nindent 8 }}
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
          {{- include "ministream.preStopDrain" . | nindent 10 }}
      resources:
        {{- include "ministream.engineResources" . | nindent 8 }}
      {{- with .Values.securityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: startup-log
          mountPath: {{ $startupDir }}
        {{- include "ministream.engineVolumeMounts" . | nindent 8 }}
    {{- with .Values.extraContainers }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: {{ .Values.scratch.tmpSizeLimit | quote }}
    # Tensor-parallel workers exchange data through shared memory: sized per rank.
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ printf "%dGi" (mul (int .Values.scratch.shmGiBPerRank) $ranks) | quote }}
    - name: model-cache
      emptyDir:
        sizeLimit: {{ .Values.scratch.modelCacheSizeLimit | quote }}
    - name: compile-cache
      {{- if .Values.persistence.compileCache.enabled }}
      persistentVolumeClaim:
        claimName: {{ default (include "ministream.componentName" (dict "ctx" . "suffix" "compile-cache")) .Values.persistence.compileCache.existingClaim | quote }}
      {{- else }}
      emptyDir:
        sizeLimit: {{ .Values.scratch.compileCacheSizeLimit | quote }}
      {{- end }}
    - name: prometheus-multiproc
      emptyDir:
        sizeLimit: 256Mi
    {{- if ne $role "worker" }}
    - name: startup-log
      emptyDir:
        sizeLimit: 8Mi
    {{- end }}
    {{- if include "ministream.usesModelVolume" . }}
    {{- include "ministream.modelVolume" . | nindent 4 }}
    {{- end }}
    {{- if include "ministream.hasS3Ca" . }}
    {{- include "ministream.s3CaVolume" . | trim | nindent 4 }}
    {{- end }}
    {{- if $events }}
    - name: kube-api-access
      projected:
        defaultMode: 0444
        sources:
          - serviceAccountToken:
              path: token
              expirationSeconds: 3607
          - configMap:
              name: kube-root-ca.crt
              items:
                - key: ca.crt
                  path: ca.crt
          - downwardAPI:
              items:
                - path: namespace
                  fieldRef:
                    apiVersion: v1
                    fieldPath: metadata.namespace
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
{{- end -}}

{{/* vLLM's compile cache (VLLM_CACHE_ROOT, Triton's cache inside it): the compile-cache volume. */}}
{{- define "ministream.compileCacheRoot" -}}/var/cache/vllm{{- end -}}

{{/*
The engine's environment: vLLM on the server or leader, the Ray worker on the other pods of a
group (the ranks Ray starts there inherit it; vLLM forwards only its own VLLM_* variables).
*/}}
{{- define "ministream.engineEnv" -}}
# Read-only root filesystem: every path vLLM writes to is a mounted volume.
- name: HOME
  value: /tmp
- name: HF_HOME
  value: /var/cache/ministream/hf
- name: VLLM_CACHE_ROOT
  value: {{ include "ministream.compileCacheRoot" . }}
- name: TRITON_CACHE_DIR
  value: {{ include "ministream.compileCacheRoot" . }}/triton
- name: PROMETHEUS_MULTIPROC_DIR
  value: /var/run/ministream/prometheus
- name: VLLM_WORKER_MULTIPROC_METHOD
  value: {{ .Values.vllm.workerMultiprocMethod | quote }}
{{- if .Values.model.hash }}
{{- include "ministream.modelHashEnv" . | trim | nindent 0 }}
{{- end }}
{{- if include "ministream.usesS3" . }}
{{- include "ministream.s3Env" . | trim | nindent 0 }}
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
- name: prometheus-multiproc
  mountPath: /var/run/ministream/prometheus
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

{{/* The engine container's resources: vllm.resources plus ranksPerPod accelerators (templates/_multinode.tpl). */}}
{{- define "ministream.engineResources" -}}
{{- $res := deepCopy (default dict .Values.vllm.resources) }}
{{- if eq .Values.accelerator.type "gpu" }}
{{- $limits := default dict $res.limits }}
{{- $_ := set $limits .Values.accelerator.resourceName (include "ministream.ranksPerPod" . | int) }}
{{- $_ = set $res "limits" $limits }}
{{- end }}
{{- toYaml $res }}
{{- end -}}
