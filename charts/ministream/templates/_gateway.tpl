{{/*
The inference gateway's side of the release: where its proxies connect from, the pool they
route to, and the chart's endpoint picker (the *-picker.yaml templates).
*/}}

{{/*
Namespaces (a YAML list) the NetworkPolicy admits on the API port for the gateway: the
namespace of every Gateway the chart's HTTPRoute attaches to (gateway.httpRoute.parentRefs, the
same value the route renders; a ref without one names the release's namespace), other than
the release's own. Istio, kgateway and NGINX Gateway Fabric run a Gateway's proxies in its
namespace. Without the chart's route the Gateway is unknown here: refused unless
networkPolicy.apiFrom or apiNamespaces names the peers, since the namespace-only default
would refuse a shared gateway's proxies.
*/}}
{{- define "ministream.gatewayNamespaces" -}}
{{- $g := .Values.gateway -}}
{{- $np := .Values.networkPolicy -}}
{{- $out := list -}}
{{- if and $g.enabled $np.enabled -}}
{{- if $g.httpRoute.enabled -}}
{{- range $g.httpRoute.parentRefs -}}
{{- $ns := default $.Release.Namespace .namespace -}}
{{- if ne $ns $.Release.Namespace -}}
{{- $out = append $out $ns -}}
{{- end -}}
{{- end -}}
{{- else if not (or $np.apiFrom $np.apiNamespaces) -}}
{{- fail "gateway.enabled with networkPolicy.enabled and no gateway.httpRoute: the NetworkPolicy would admit the API port only from this namespace and refuse the gateway's proxies. Set networkPolicy.apiNamespaces to the namespace the gateway's proxies run in (or networkPolicy.apiFrom to their pods), or enable gateway.httpRoute with its parentRefs" -}}
{{- end -}}
{{- end -}}
{{- toYaml (uniq $out) -}}
{{- end -}}

{{/*
The pool's pod selector: the InferencePool's spec.selector and the picker's --pool-name
both come from here, so the pool, the picker and the serving pods cannot drift apart.
*/}}
{{- define "ministream.poolName" -}}
{{- include "ministream.fullname" . -}}
{{- end -}}

{{- define "ministream.poolSelector" -}}
{{ include "ministream.serverSelectorLabels" . }}
{{- end -}}

{{/*
The chart's endpoint picker (gateway.picker): "true" when the release deploys it (every
*-picker.yaml template renders under this), its name, its pods' labels.
*/}}
{{- define "ministream.pickerEnabled" -}}
{{- if and .Values.gateway.enabled .Values.gateway.picker.enabled -}}true{{- end -}}
{{- end -}}

{{- define "ministream.pickerName" -}}
{{- include "ministream.componentName" (dict "ctx" . "suffix" "epp") -}}
{{- end -}}

{{/*
The ClusterRole (and its binding) that lets a picker with gateway.picker.metricsAuthSecret
review scrape tokens: cluster-scoped, so the namespace is part of the name.
*/}}
{{- define "ministream.pickerMetricsAuthName" -}}
{{- printf "%s-%s-metrics-auth" .Release.Namespace (include "ministream.pickerName" .) -}}
{{- end -}}

{{- define "ministream.pickerSelectorLabels" -}}
{{ include "ministream.selectorLabels" . }}
app.kubernetes.io/component: endpoint-picker
{{- end -}}

{{/* Ports of the upstream picker (v1.5.0): ext-proc gRPC, gRPC health, Prometheus metrics. */}}
{{- define "ministream.pickerGrpcPort" -}}9002{{- end -}}
{{- define "ministream.pickerHealthPort" -}}9003{{- end -}}
{{- define "ministream.pickerMetricsPort" -}}9090{{- end -}}

{{/* The Service the InferencePool's endpointPickerRef names: the chart's picker, or the user's. */}}
{{- define "ministream.pickerService" -}}
{{- $g := .Values.gateway -}}
{{- if $g.picker.enabled -}}
{{- include "ministream.pickerName" . -}}
{{- else if $g.endpointPicker.serviceName -}}
{{- $g.endpointPicker.serviceName -}}
{{- else -}}
{{- fail "gateway.enabled needs an endpoint picker: set gateway.picker.enabled=true to deploy it with the chart, or gateway.endpointPicker.serviceName to the Service of one installed separately" -}}
{{- end -}}
{{- end -}}

{{/*
Peers (a YAML list of NetworkPolicy `from` entries) of the API port, which are also the
gateway's proxies that call the chart's endpoint picker: networkPolicy.apiFrom (this
namespace when empty), networkPolicy.apiNamespaces and the gateway's namespaces.
*/}}
{{- define "ministream.apiPeers" -}}
{{- $np := .Values.networkPolicy -}}
{{- $out := default (list (dict "podSelector" dict)) $np.apiFrom -}}
{{- range concat $np.apiNamespaces (include "ministream.gatewayNamespaces" . | fromYamlArray) | uniq -}}
{{- $out = append $out (dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .))) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
