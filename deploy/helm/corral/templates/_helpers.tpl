{{- define "corral.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "corral.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "corral.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "corral.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "corral.selectorLabels" -}}
app.kubernetes.io/name: {{ include "corral.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "corral.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "corral.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "corral.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "corral.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Whether the store is PostgreSQL (a Secret holds its URL). */}}
{{- define "corral.postgres" -}}
{{- if .Values.store.postgresql.urlSecret.name }}true{{ end }}
{{- end }}

{{/* What the values must satisfy; a render that breaks a rule fails with the reason. */}}
{{- define "corral.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not (include "corral.postgres" .)) }}
{{- fail "replicaCount > 1 needs PostgreSQL: set store.postgresql.urlSecret.name (SQLite serves one engine)" }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.keys.existingSecret) }}
{{- fail "replicaCount > 1 needs keys.existingSecret: engines sharing a store must share secrets.key and audit.key" }}
{{- end }}
{{- if and (not .Values.http.insecure) (not .Values.http.tls.secretName) }}
{{- fail "the HTTP API needs http.tls.secretName, or http.insecure: true for plain HTTP" }}
{{- end }}
{{- range .Values.secretEnv }}
{{- if or (not .name) (not .secretName) (not .key) }}
{{- fail "each secretEnv entry needs name, secretName and key (values come from Secrets only)" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The HTTP scheme of the API and its probes. */}}
{{- define "corral.scheme" -}}
{{- if .Values.http.insecure }}HTTP{{ else }}HTTPS{{ end }}
{{- end }}

{{/* corral.yaml: the configured mapping, with the Ray cluster's environment and the shared
key files filled in. */}}
{{- define "corral.config" -}}
{{- $config := deepCopy .Values.config }}
{{- if .Values.ray.cluster.enabled }}
{{- $envs := default (dict) (get $config "environments") }}
{{- $address := printf "ray://%s-head-svc.%s.svc:10001" .Values.ray.cluster.name .Release.Namespace }}
{{- $_ := set $envs .Values.ray.cluster.environment (dict "kind" "ray" "address" $address "max_inflight" (int .Values.ray.cluster.maxInflight)) }}
{{- $_ := set $config "environments" $envs }}
{{- end }}
{{- if .Values.keys.existingSecret }}
{{- $_ := set $config "secrets" (dict "key_file" "/etc/corral/keys/secrets.key") }}
{{- $_ := set $config "audit" (merge (dict "key_file" "/etc/corral/keys/audit.key") (default (dict) (get $config "audit"))) }}
{{- end }}
{{- toYaml $config }}
{{- end }}
