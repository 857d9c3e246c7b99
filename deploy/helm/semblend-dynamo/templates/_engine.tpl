{{/*
The TensorRT-LLM engine YAML. It must stay byte-identical to
trtllm_connector.engine_config.render_engine_yaml for the same settings (tests/helm/test_chart.py checks it):
fixed key order, integers as integers, free_gpu_memory_fraction as %.2f.
*/}}
{{- define "semblend-dynamo.engineYaml" -}}
{{- $mode := .Values.semblend.mode -}}
{{- $isolation := .Values.semblend.isolation -}}
{{- $e := .Values.engine -}}
{{- $fraction := float64 $e.freeGpuMemoryFraction -}}
{{- if ne (float64 (printf "%.2f" $fraction)) $fraction -}}
{{- fail (printf "engine.freeGpuMemoryFraction=%v must have at most two decimals" $fraction) -}}
{{- end -}}
# SemBlend TensorRT-LLM engine config: mode={{ $mode }} isolation={{ $isolation }}
backend: pytorch
kv_cache_config:
  enable_block_reuse: {{ not (and (eq $mode "shifted") (eq $isolation "no_block_reuse")) }}
  enable_partial_reuse: {{ $e.enablePartialReuse }}
  tokens_per_block: {{ int64 $e.tokensPerBlock }}
  free_gpu_memory_fraction: {{ printf "%.2f" $fraction }}
  event_buffer_max_size: {{ int64 $e.eventBufferMaxSize }}
kv_connector_config:
  connector_module: trtllm_connector.connector
  connector_scheduler_class: SemBlendConnectorScheduler
  connector_worker_class: SemBlendConnectorWorker
{{- if eq .Values.workers.topology "disaggregated" }}
cache_transceiver_config:
  backend: {{ .Values.workers.cacheTransceiverBackend }}
{{- end }}
{{ end -}}
