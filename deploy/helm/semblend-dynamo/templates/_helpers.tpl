{{/* Names ------------------------------------------------------------------------------------------- */}}

{{- define "semblend-dynamo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-chart prefix of every resource; 40 characters leave room for the operator's per-component suffixes. */}}
{{- define "semblend-dynamo.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "semblend-dynamo.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "semblend-dynamo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "semblend-dynamo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "semblend-dynamo.labels" -}}
helm.sh/chart: {{ include "semblend-dynamo.chart" . }}
{{ include "semblend-dynamo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: semblend-dynamo
{{- end -}}

{{/* Addresses ---------------------------------------------------------------------------------------- */}}

{{- define "semblend-dynamo.platformNamespace" -}}
{{- default .Release.Namespace .Values.platform.namespace -}}
{{- end -}}

{{- define "semblend-dynamo.natsUrl" -}}
{{- if .Values.nats.url -}}
{{- .Values.nats.url -}}
{{- else -}}
{{- printf "nats://%s-nats.%s:4222" .Values.platform.releaseName (include "semblend-dynamo.platformNamespace" .) -}}
{{- end -}}
{{- end -}}

{{- define "semblend-dynamo.etcdEndpoints" -}}
{{- if .Values.discovery.etcdEndpoints -}}
{{- .Values.discovery.etcdEndpoints -}}
{{- else -}}
{{- printf "http://%s-etcd.%s:2379" .Values.platform.releaseName (include "semblend-dynamo.platformNamespace" .) -}}
{{- end -}}
{{- end -}}

{{/* Dynamo namespaces are NATS subject tokens: no dots. */}}
{{- define "semblend-dynamo.dynamoNamespace" -}}
{{- default (include "semblend-dynamo.fullname" . | replace "." "-") .Values.dynamo.namespace -}}
{{- end -}}

{{- define "semblend-dynamo.workerNamespace" -}}
{{- default (printf "%s-workers" (include "semblend-dynamo.dynamoNamespace" .)) .Values.dynamo.workerNamespace -}}
{{- end -}}

{{- define "semblend-dynamo.workerEndpointUri" -}}
{{- printf "dyn://%s.%s.%s" (include "semblend-dynamo.workerNamespace" .) .Values.dynamo.workerComponent .Values.dynamo.workerEndpoint -}}
{{- end -}}

{{- define "semblend-dynamo.servedModelName" -}}
{{- default .Values.model.path .Values.model.servedName -}}
{{- end -}}

{{- define "semblend-dynamo.routerServiceName" -}}
{{- printf "%s-router-metrics" (include "semblend-dynamo.fullname" .) -}}
{{- end -}}

{{- define "semblend-dynamo.image" -}}
{{- $img := merge (deepCopy .component) .root.Values.image -}}
image: {{ printf "%s:%s" $img.repository $img.tag | quote }}
imagePullPolicy: {{ $img.pullPolicy }}
{{- end -}}

{{/* Environment -------------------------------------------------------------------------------------- */}}

{{/* Renders a values scalar for an env var: integral numbers without the float64 exponent form Helm would use. */}}
{{- define "semblend-dynamo.envValue" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else if kindIs "bool" . -}}
{{- ternary "1" "0" . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* Dynamo runtime env shared by every component (also set graph-wide in spec.env). */}}
{{- define "semblend-dynamo.dynamoEnv" -}}
- name: DYN_EVENT_PLANE
  value: nats
- name: NATS_SERVER
  value: {{ include "semblend-dynamo.natsUrl" . | quote }}
- name: DYN_DISCOVERY_BACKEND
  value: {{ .Values.discovery.backend | quote }}
{{- if eq .Values.discovery.backend "etcd" }}
- name: ETCD_ENDPOINTS
  value: {{ include "semblend-dynamo.etcdEndpoints" . | quote }}
{{- end }}
- name: DYN_REQUEST_PLANE
  value: {{ .Values.dynamo.requestPlane | quote }}
{{- with .Values.nats.tokenSecret.name }}
- name: NATS_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: {{ $.Values.nats.tokenSecret.key | quote }}
{{- end }}
{{- end -}}

{{/*
SEMBLEND_* env for the router and the connector. Mode, block size and isolation follow
trtllm_connector.engine_config.engine_env; the rest come from .Values.semblend.settings by their
SemblendConfig names (tests/helm/test_chart.py derives the allowed names from the Python model).
*/}}
{{- define "semblend-dynamo.semblendEnv" -}}
{{- $mode := .Values.semblend.mode -}}
- name: SEMBLEND_DISCOVERY_ONLY
  value: {{ ternary "1" "0" (eq $mode "discovery_only") | quote }}
- name: SEMBLEND_EXACT_MATERIALIZATION_ONLY
  value: {{ ternary "0" "1" (eq $mode "shifted") | quote }}
- name: SEMBLEND_BLOCK_SIZE
  value: {{ int64 .Values.engine.tokensPerBlock | quote }}
- name: SEMBLEND_ISOLATION
  value: {{ .Values.semblend.isolation | quote }}
- name: SEMBLEND_MODEL_ID
  value: {{ include "semblend-dynamo.servedModelName" . | quote }}
- name: SEMBLEND_NATS_URL
  value: {{ include "semblend-dynamo.natsUrl" . | quote }}
{{- with .Values.nats.tokenSecret.name }}
- name: SEMBLEND_NATS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: {{ $.Values.nats.tokenSecret.key | quote }}
{{- end }}
- name: SEMBLEND_DYNAMO_NAMESPACE
  value: {{ include "semblend-dynamo.workerNamespace" . | quote }}
- name: SEMBLEND_WORKER_COMPONENT
  value: {{ .Values.dynamo.workerComponent | quote }}
- name: SEMBLEND_WORKER_ENDPOINT
  value: {{ .Values.dynamo.workerEndpoint | quote }}
- name: SEMBLEND_ROUTER_COMPONENT
  value: {{ .Values.dynamo.routerComponent | quote }}
{{- range $key, $value := .Values.semblend.settings }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ printf "SEMBLEND_%s" (upper $key) }}
  value: {{ include "semblend-dynamo.envValue" $value | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Prometheus scrape annotations for a pod template; .port and .root. */}}
{{- define "semblend-dynamo.scrapeAnnotations" -}}
{{- if .root.Values.metrics.annotations -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | int64 | quote }}
prometheus.io/path: /metrics
{{- end -}}
{{- end -}}
