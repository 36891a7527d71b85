{{/* The pod's volumes. Called with (dict "ctx" $ "role" ROLE), as ministream.podTemplate. */}}
{{- define "ministream.podVolumes" -}}
{{- $role := .role -}}
{{- with .ctx -}}
{{- $ranks := include "ministream.ranksPerPod" . | int -}}
{{- $events := and .Values.sidecar.events.enabled (ne $role "worker") -}}
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
{{- if ne $role "worker" }}
- name: startup-log
  emptyDir:
    sizeLimit: 8Mi
{{- end }}
{{- if and (include "ministream.loraEnabled" .) (ne $role "worker") }}
# Verified LoRA adapters (fetch-adapters init container), read-only to vLLM.
- name: adapters
  emptyDir:
    sizeLimit: {{ .Values.lora.adapterVolumeSizeLimit | quote }}
{{- end }}
{{- if include "ministream.usesModelVolume" . }}
{{- include "ministream.modelVolume" . | nindent 0 }}
{{- end }}
{{- if include "ministream.hasS3Ca" . }}
{{- include "ministream.s3CaVolume" . | trim | nindent 0 }}
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
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end -}}
{{- end -}}
