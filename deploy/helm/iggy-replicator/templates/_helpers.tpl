{{/* The chart name, or nameOverride. */}}
{{- define "iggy-replicator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 50 | trimSuffix "-" }}
{{- end }}

{{/*
The resource name prefix. At most 50 characters: pod names (<fullname>-<ordinal>)
and the headless Service (<fullname>-raft) must stay valid DNS labels.
*/}}
{{- define "iggy-replicator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "iggy-replicator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "iggy-replicator.labels" -}}
helm.sh/chart: {{ include "iggy-replicator.chart" . }}
{{ include "iggy-replicator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: iggy-replicator
{{- end }}

{{/* The labels that select the members' pods. */}}
{{- define "iggy-replicator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "iggy-replicator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The Secret with the credentials: existingSecret, or the one the chart creates. */}}
{{- define "iggy-replicator.secretName" -}}
{{- .Values.existingSecret | default (printf "%s-credentials" (include "iggy-replicator.fullname" .)) }}
{{- end }}

{{- define "iggy-replicator.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* "true" when the admin API serves HTTPS, empty otherwise. */}}
{{- define "iggy-replicator.apiTls" -}}
{{- if and .Values.tls.enabled .Values.tls.api }}true{{ end }}
{{- end }}

{{/* Stops the rendering on values that cannot make a working cluster. */}}
{{- define "iggy-replicator.validate" -}}
{{- $initial := int .Values.cluster.initialMembers }}
{{- if lt $initial 1 }}
{{- fail "cluster.initialMembers must be at least 1" }}
{{- end }}
{{- if lt (int .Values.replicaCount) $initial }}
{{- fail "replicaCount must be at least cluster.initialMembers: the founding members must all exist to bootstrap" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled needs tls.secretName: a Secret with tls.crt, tls.key and ca.crt" }}
{{- end }}
{{- if not .Values.existingSecret }}
{{- if lt (len .Values.secrets.clusterSecret) 16 }}
{{- fail "secrets.clusterSecret must be at least 16 characters" }}
{{- end }}
{{- if lt (len .Values.secrets.adminToken) 16 }}
{{- fail "secrets.adminToken must be at least 16 characters" }}
{{- end }}
{{- end }}
{{- if not (has .Values.antiAffinity.mode (list "required" "preferred" "none")) }}
{{- fail "antiAffinity.mode must be required, preferred or none" }}
{{- end }}
{{- end }}

{{/*
Every member's config. entrypoint.sh replaces @NODE_ID@ with the pod ordinal + 1;
the replicator replaces ${NAME} from the container environment.
*/}}
{{- define "iggy-replicator.config" -}}
{{- $fullname := include "iggy-replicator.fullname" . }}
{{- $domain := printf "%s-raft.${POD_NAMESPACE}.svc" $fullname }}
{{- $tls := "/etc/iggy-replicator/tls" -}}
# Config template of every member, rendered by the iggy-replicator chart.
# entrypoint.sh replaces @NODE_ID@ with the pod ordinal + 1; the replicator
# substitutes ${NAME} from the container environment (POD_NAME and
# POD_NAMESPACE from the downward API, credentials from the Secret).

[node]
id = @NODE_ID@
data_dir = "/var/lib/iggy-replicator"
raft_addr = "${POD_NAME}.{{ $domain }}:7100"
api_addr = "0.0.0.0:7180"
advertised_api_addr = "${POD_NAME}.{{ $domain }}:7180"
{{- if include "iggy-replicator.apiTls" . }}
api_tls = { cert_file = "{{ $tls }}/tls.crt", key_file = "{{ $tls }}/tls.key" }
{{- end }}

[cluster]
secret = "${REPLICATOR_SECRET}"
admin_token = "${REPLICATOR_ADMIN_TOKEN}"
initial_members = { {{- range $i := until (int .Values.cluster.initialMembers) }}{{ if $i }},{{ end }} {{ add1 $i }} = "{{ $fullname }}-{{ $i }}.{{ $domain }}:7100"{{- end }} }
{{- if .Values.tls.enabled }}
tls = { cert_file = "{{ $tls }}/tls.crt", key_file = "{{ $tls }}/tls.key", ca_file = "{{ $tls }}/ca.crt" }
{{- end }}
{{- range $key, $value := .Values.cluster.settings }}
{{ $key }} = {{ $value | toString | quote }}
{{- end }}

{{ .Values.config.replication | trim }}
{{ end }}

{{/* The downward-API variables both containers derive their names from. */}}
{{- define "iggy-replicator.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: RAFT_SERVICE
  value: {{ include "iggy-replicator.fullname" . }}-raft
{{- end }}

{{/* The hardened container securityContext (both containers). */}}
{{- define "iggy-replicator.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* The pod affinity: values.affinity, or the anti-affinity of antiAffinity.mode. */}}
{{- define "iggy-replicator.affinity" -}}
{{- if .Values.affinity }}
{{- toYaml .Values.affinity }}
{{- else if eq .Values.antiAffinity.mode "required" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: {{ .Values.antiAffinity.topologyKey }}
      labelSelector:
        matchLabels:
          {{- include "iggy-replicator.selectorLabels" . | nindent 10 }}
{{- else if eq .Values.antiAffinity.mode "preferred" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: {{ .Values.antiAffinity.weight }}
      podAffinityTerm:
        topologyKey: {{ .Values.antiAffinity.topologyKey }}
        labelSelector:
          matchLabels:
            {{- include "iggy-replicator.selectorLabels" . | nindent 12 }}
{{- end }}
{{- end }}
