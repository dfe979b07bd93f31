{{/* Chart name. */}}
{{- define "proxyplan.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix of every object. */}}
{{- define "proxyplan.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "proxyplan.controller.fullname" -}}
{{- printf "%s-controller" (include "proxyplan.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "proxyplan.agent.fullname" -}}
{{- printf "%s-agent" (include "proxyplan.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "proxyplan.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "proxyplan.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "proxyplan.controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "proxyplan.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "proxyplan.agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "proxyplan.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "proxyplan.controller.labels" -}}
{{ include "proxyplan.labels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "proxyplan.agent.labels" -}}
{{ include "proxyplan.labels" . }}
app.kubernetes.io/component: agent
{{- end }}

{{/* image: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "proxyplan.image" -}}
{{- printf "%s:%s" .image.repository (default .appVersion .image.tag) }}
{{- end }}

{{/* API server address overrides (env entries), when set. */}}
{{- define "proxyplan.apiServerEnv" -}}
{{- with .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
{{- end }}
{{- with .Values.apiServer.port }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ . | toString | quote }}
{{- end }}
{{- end }}

{{/*
The agent flags about the node itself (conntrack sysctls, localhost node ports), shared by
`proxyplan-agent setup` in the privileged init container and `proxyplan-agent run`.
*/}}
{{- define "proxyplan.agentNodeArgs" -}}
{{- $a := .Values.agent -}}
{{- $c := $a.conntrack -}}
- --conntrack-max-per-core={{ int64 $c.maxPerCore }}
- --conntrack-min={{ int64 $c.min }}
- --conntrack-tcp-timeout-established={{ $c.tcpEstablishedTimeout }}
- --conntrack-tcp-timeout-close-wait={{ $c.tcpCloseWaitTimeout }}
- --conntrack-udp-timeout={{ $c.udpTimeout }}
- --conntrack-udp-timeout-stream={{ $c.udpStreamTimeout }}
{{- if $c.tcpBeLiberal }}
- --conntrack-tcp-be-liberal
{{- end }}
{{- if and (eq $a.mode "iptables") $a.iptables.localhostNodePorts }}
- --iptables-localhost-nodeports
{{- end }}
{{- end -}}
