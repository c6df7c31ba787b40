{{- define "ragguard.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ragguard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ragguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "ragguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "ragguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ragguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "ragguard.routerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "ragguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end -}}

{{/* The Secret holding the Postgres URL: the chart's own when postgres.url is given, else existingSecret. */}}
{{- define "ragguard.pgSecret" -}}
{{- if .Values.postgres.url -}}
{{- printf "%s-pg" (include "ragguard.fullname" .) -}}
{{- else -}}
{{- .Values.postgres.existingSecret -}}
{{- end -}}
{{- end -}}
