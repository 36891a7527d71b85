{{/*
The inference gateway's side of the release: where its proxies connect from.
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
