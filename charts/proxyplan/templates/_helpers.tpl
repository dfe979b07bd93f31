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

{{/*
"true" when the agent's /metrics listens beyond loopback (agent.metrics.bindAddress), so
Prometheus can scrape it: the agent runs on the host network, where 127.0.0.0/8 and ::1
are the node's own loopback.
*/}}
{{- define "proxyplan.agentMetricsScrapeable" -}}
{{- $addr := .Values.agent.metrics.bindAddress | trimPrefix "[" | trimSuffix "]" -}}
{{- if not (or (hasPrefix "127." $addr) (eq $addr "::1") (eq $addr "localhost")) -}}
true
{{- end -}}
{{- end -}}

{{/* PromQL label matchers of the agents' series in the alert rules. */}}
{{- define "proxyplan.agentSelector" -}}
{{- $default := printf "job=%q" (printf "%s/%s" .Release.Namespace (include "proxyplan.agent.fullname" .)) -}}
{{- default $default .Values.metrics.prometheusRule.agentSelector -}}
{{- end -}}

{{/* PromQL label matchers of the controller's series in the alert rules. */}}
{{- define "proxyplan.controllerSelector" -}}
{{- $default := printf "job=%q" (printf "%s/%s" .Release.Namespace (include "proxyplan.controller.fullname" .)) -}}
{{- default $default .Values.metrics.prometheusRule.controllerSelector -}}
{{- end -}}

{{/* The relabelings and scrape settings both PodMonitor endpoints share. */}}
{{- define "proxyplan.podMetricsEndpoint" -}}
{{- $m := .Values.metrics.podMonitor -}}
- port: metrics
  path: /metrics
  scheme: http
  {{- with $m.interval }}
  interval: {{ . }}
  {{- end }}
  {{- with $m.scrapeTimeout }}
  scrapeTimeout: {{ . }}
  {{- end }}
  relabelings:
    # The node the pod runs on, for alerts and dashboards that name nodes.
    - action: replace
      sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: node
    {{- with $m.relabelings }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $m.metricRelabelings }}
  metricRelabelings:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
