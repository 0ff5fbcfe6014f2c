{{/* The chart's name. */}}
{{- define "mpx.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object names: the release name when it already says the chart's name. */}}
{{- define "mpx.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "mpx.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "mpx.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the pod; never change them on upgrade (selectors are immutable). */}}
{{- define "mpx.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mpx.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "mpx.labels" -}}
{{ include "mpx.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: modelpool-extproc
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The image reference: pinned by digest when one is given. */}}
{{- define "mpx.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "mpx.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "mpx.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Namespaces watched (namespaced mode), as a list. */}}
{{- define "mpx.watchNamespaces" -}}
{{- if .Values.watch.namespaces -}}
{{- toYaml .Values.watch.namespaces -}}
{{- else -}}
{{- toYaml (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{/* The Gateway a route attaches to: name and namespace. */}}
{{- define "mpx.gatewayNamespace" -}}
{{- default .Release.Namespace .Values.envoyGateway.gateway.namespace -}}
{{- end -}}

{{/* Pool namespaces, each with the names of its pools' HTTPRoutes: {ns: [pool, ...]}. */}}
{{- define "mpx.routesByNamespace" -}}
{{- $out := dict -}}
{{- range .Values.pools -}}
{{- $ns := default $.Release.Namespace .namespace -}}
{{- $_ := set $out $ns (append (get $out $ns | default list) .name) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The Lease verbs: exactly the calls of the service's Lease client (RBAC and FlowSchema). */}}
{{- define "mpx.leaseVerbs" -}}
get, list, watch, create, update, delete
{{- end -}}
