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

{{/*
topologySpreadConstraints of a serving pod, called with (dict "ctx" $ "role" ROLE) as
ministream.podTemplate. The Deployment's pods and a group's leaders: the values' constraints, one
without labelSelector counting this release's serving pods. On leaders, pod-template-hash
(set by Deployments only: on an LWS pod the key is absent and the constraint would count
every revision) becomes the LWS template revision label. Workers: the group's pods on distinct
hosts (soft, like the defaults), counted per group; which zone or rack holds a group is
multinode.exclusiveTopology's job, not a spread's (a group split across zones is the problem).
*/}}
{{- define "ministream.topologySpreadConstraints" -}}
{{- $role := .role -}}
{{- with .ctx -}}
{{- if eq $role "worker" -}}
- maxSkew: 1
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: ScheduleAnyway
  matchLabelKeys:
    - {{ include "ministream.lwsGroupLabel" . }}
  labelSelector:
    {{- include "ministream.groupPodSelector" . | nindent 4 }}
{{- else -}}
{{- $selector := dict "matchLabels" (include "ministream.serverSelectorLabels" . | fromYaml) -}}
{{- $out := list -}}
{{- range .Values.topologySpreadConstraints -}}
{{- $c := deepCopy . -}}
{{- if not (hasKey $c "labelSelector") -}}
{{- $_ := set $c "labelSelector" $selector -}}
{{- end -}}
{{- if and (eq $role "leader") (hasKey $c "matchLabelKeys") -}}
{{- $keys := list -}}
{{- range $c.matchLabelKeys -}}
{{- $keys = append $keys (ternary (include "ministream.lwsRevisionLabel" $) . (eq . "pod-template-hash")) -}}
{{- end -}}
{{- $_ := set $c "matchLabelKeys" (uniq $keys) -}}
{{- end -}}
{{- $out = append $out $c -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
{{- end -}}
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
