{{/* Fleet scale: rollout strategy, pod spreading, the autoscalers' signal and behaviour. */}}

{{/*
The Deployment's rollingUpdate: the preset of rollout.mode (surge: maxSurge 1, maxUnavailable
0; inPlace: maxSurge 0, maxUnavailable 1), each field overridden by rollout.maxSurge /
rollout.maxUnavailable when set. values.schema.json refuses a result with both at 0.
*/}}
{{- define "ministream.rollingUpdate" -}}
{{- $r := .Values.rollout -}}
{{- $preset := get (dict "surge" (dict "maxSurge" 1 "maxUnavailable" 0) "inPlace" (dict "maxSurge" 0 "maxUnavailable" 1)) $r.mode -}}
{{- $out := dict -}}
{{- range $key := list "maxSurge" "maxUnavailable" -}}
{{- $set := get $r $key -}}
{{- $_ := set $out $key (ternary (get $preset $key) $set (kindIs "invalid" $set)) -}}
{{- end -}}
maxSurge: {{ if kindIs "string" $out.maxSurge }}{{ $out.maxSurge | quote }}{{ else }}{{ int $out.maxSurge }}{{ end }}
maxUnavailable: {{ if kindIs "string" $out.maxUnavailable }}{{ $out.maxUnavailable | quote }}{{ else }}{{ int $out.maxUnavailable }}{{ end }}
{{- end -}}

{{/* topologySpreadConstraints: a constraint without labelSelector counts this release's serving pods. */}}
{{- define "ministream.topologySpreadConstraints" -}}
{{- $selector := dict "matchLabels" (include "ministream.serverSelectorLabels" . | fromYaml) -}}
{{- $out := list -}}
{{- range .Values.topologySpreadConstraints -}}
{{- $c := deepCopy . -}}
{{- if not (hasKey $c "labelSelector") -}}
{{- $_ := set $c "labelSelector" $selector -}}
{{- end -}}
{{- $out = append $out $c -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
A scaling signal's per-replica query for this release, by its key under autoscaling.target.
The PromQL is generated once (devtools/ministream_observability/autoscaling.py, the same
definition as the dashboards' queue panel) into autoscaling/signals.yaml with the
all-namespaces matcher, replaced here with this release's pods (ministream.promSelector).
*/}}
{{- define "ministream.signal" -}}
{{- $signals := .ctx.Files.Get "autoscaling/signals.yaml" | fromYaml -}}
{{- $signal := get $signals .key -}}
{{- if not $signal -}}
{{- fail (printf "autoscaling/signals.yaml has no signal %q: run python -m ministream_observability generate" .key) -}}
{{- end -}}
{{- $_ := set $signal "query" ($signal.query | replace `namespace=~".*"` (include "ministream.promSelector" .ctx)) -}}
{{- toYaml $signal -}}
{{- end -}}

{{/* The signals in use, in order: requests per replica, then KV-cache usage when its target is set. */}}
{{- define "ministream.signalTargets" -}}
{{- $t := .Values.autoscaling.target -}}
{{- $out := list (dict "key" "requestsPerReplica" "target" $t.requestsPerReplica) -}}
{{- if not (kindIs "invalid" $t.kvCacheUsage) -}}
{{- $out = append $out (dict "key" "kvCacheUsage" "target" $t.kvCacheUsage) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* HPA behavior, shared by the HPA and KEDA's ScaledObject (which hands it to its own HPA). */}}
{{- define "ministream.scalingBehavior" -}}
{{- $a := .Values.autoscaling -}}
scaleUp:
  stabilizationWindowSeconds: 0
  selectPolicy: Max
  policies:
    - type: Pods
      value: {{ int $a.scaleUp.pods }}
      periodSeconds: {{ int $a.scaleUp.periodSeconds }}
scaleDown:
  # Start-up budget + drain timeout (templates/_budgets.tpl).
  stabilizationWindowSeconds: {{ include "ministream.scaleDownStabilizationSeconds" . }}
  selectPolicy: Min
  policies:
    - type: Pods
      value: {{ int $a.scaleDown.pods }}
      periodSeconds: {{ int $a.scaleDown.periodSeconds }}
{{- end -}}
