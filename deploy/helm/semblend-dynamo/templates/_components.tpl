{{/* Pod-level settings shared by every component; .root and .component (frontend/router/workers values). */}}
{{- define "semblend-dynamo.podSpecCommon" -}}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .component.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .component.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .component.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
One TensorRT-LLM worker component (aggregated, prefill or decode):
.root, .name, .type, .replicas, .disaggregationMode ("" for aggregated), .checksum (engine YAML digest).
*/}}
{{- define "semblend-dynamo.workerComponent" -}}
{{- $root := .root -}}
{{- $w := $root.Values.workers }}

    # TensorRT-LLM worker ({{ .type }}): serves {{ include "semblend-dynamo.workerEndpointUri" $root }}, loads the
    # SemBlend connector through the engine YAML ConfigMap and publishes its KV events on NATS.
    - name: {{ .name }}
      type: {{ .type }}
      replicas: {{ .replicas }}
      podTemplate:
        metadata:
          labels:
            {{- include "semblend-dynamo.selectorLabels" $root | nindent 12 }}
            app.kubernetes.io/component: trtllm-{{ .type }}
          annotations:
            # Restarts workers when the engine YAML changes.
            checksum/engine-config: {{ .checksum }}
            {{- with include "semblend-dynamo.scrapeAnnotations" (dict "root" $root "port" $w.systemPort) }}
            {{- . | nindent 12 }}
            {{- end }}
        spec:
          {{- include "semblend-dynamo.podSpecCommon" (dict "root" $root "component" $w) | nindent 10 }}
          volumes:
            - name: engine-config
              configMap:
                name: {{ include "semblend-dynamo.fullname" $root }}-engine
            {{- if $root.Values.audit.enabled }}
            - name: audit
              {{- if $root.Values.audit.existingClaim }}
              persistentVolumeClaim:
                claimName: {{ $root.Values.audit.existingClaim | quote }}
              {{- else }}
              emptyDir:
                sizeLimit: {{ $root.Values.audit.sizeLimit | quote }}
              {{- end }}
            {{- end }}
          containers:
            - name: main
              {{- include "semblend-dynamo.image" (dict "root" $root "component" $w.image) | nindent 14 }}
              command: [python3, -m, dynamo.trtllm]
              args:
                - --model-path
                - {{ $root.Values.model.path | quote }}
                - --served-model-name
                - {{ include "semblend-dynamo.servedModelName" $root | quote }}
                - --extra-engine-args
                - /etc/semblend/engine.yaml
                - --publish-events-and-metrics
                - --kv-block-size
                - {{ $root.Values.engine.tokensPerBlock | int64 | quote }}
                - --endpoint
                - {{ include "semblend-dynamo.workerEndpointUri" $root | quote }}
                {{- with .disaggregationMode }}
                - --disaggregation-mode
                - {{ . }}
                {{- end }}
                {{- with $w.extraArgs }}
                {{- toYaml . | nindent 16 }}
                {{- end }}
              env:
                # Everything the worker registers or publishes lives in the workers' Dynamo namespace.
                - name: DYN_NAMESPACE
                  value: {{ include "semblend-dynamo.workerNamespace" $root | quote }}
                {{- include "semblend-dynamo.semblendEnv" $root | nindent 16 }}
                - name: SEMBLEND_CONNECTOR_NATS
                  value: "1"
                {{- if $root.Values.audit.enabled }}
                - name: SEMBLEND_AUDIT_PATH
                  value: {{ printf "%s/audit.jsonl" $root.Values.audit.mountPath | quote }}
                {{- end }}
                {{- with $w.extraEnv }}
                {{- toYaml . | nindent 16 }}
                {{- end }}
              volumeMounts:
                - name: engine-config
                  mountPath: /etc/semblend
                  readOnly: true
                {{- if $root.Values.audit.enabled }}
                - name: audit
                  mountPath: {{ $root.Values.audit.mountPath }}
                {{- end }}
              resources:
                {{- toYaml $w.resources | nindent 16 }}
              securityContext:
                {{- toYaml $root.Values.securityContext | nindent 16 }}
{{- end -}}
