{{- define "otel-gpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "otel-gpu.fullname" -}}
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

{{- define "otel-gpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "otel-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "otel-gpu.labels" -}}
{{ include "otel-gpu.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "otel-gpu.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "otel-gpu.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference; none is published, so image.repository must be set. */}}
{{- define "otel-gpu.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion }}
{{- $hint := printf "image.repository is not set: push the image with scripts/push-image.sh REGISTRY/otel-gpu:%s, then --set image.repository=REGISTRY/otel-gpu" $tag }}
{{- printf "%s:%s" (required $hint .Values.image.repository) $tag }}
{{- end }}

{{- define "otel-gpu.webConfigSecret" -}}
{{- default (printf "%s-web-config" (include "otel-gpu.fullname" .)) .Values.webConfig.existingSecret }}
{{- end }}

{{/* ServiceMonitor: the value when set, else on when the Prometheus Operator API exists. */}}
{{- define "otel-gpu.serviceMonitorEnabled" -}}
{{- if kindIs "bool" .Values.serviceMonitor.enabled }}
{{- if .Values.serviceMonitor.enabled }}true{{ end }}
{{- else if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true
{{- end }}
{{- end }}

{{/* The configuration file otel-gpu reads. */}}
{{- define "otel-gpu.config" -}}
{{- $c := dict "listen" (printf "0.0.0.0:%d" (int .Values.port)) "interval" .Values.interval "naming" .Values.naming "log_format" .Values.logFormat }}
{{- $_ := set $c "pod_attribution" .Values.podAttribution.enabled }}
{{- if .Values.podAttribution.enabled }}
{{- $_ := set $c "kubelet_socket" "/var/lib/kubelet/pod-resources/kubelet.sock" }}
{{- end }}
{{- if .Values.numa.enabled }}
{{- $_ := set $c "sysfs_root" "/host" }}
{{- end }}
{{- $_ := set $c "process_usage" .Values.processUsage.enabled }}
{{- if .Values.webConfig.enabled }}
{{- $_ := set $c "web_config_file" "/etc/otel-gpu/web/web-config.yml" }}
{{- end }}
{{- if .Values.healthListen.port }}
{{- $_ := set $c "health_listen" (printf "0.0.0.0:%d" (int .Values.healthListen.port)) }}
{{- end }}
{{- if .Values.otlp.endpoint }}
{{- $_ := set $c "otlp_endpoint" .Values.otlp.endpoint }}
{{- if .Values.otlp.protocol }}
{{- $_ := set $c "otlp_protocol" .Values.otlp.protocol }}
{{- end }}
{{- if .Values.otlp.headersSecret.name }}
{{- $_ := set $c "otlp_headers_file" (printf "/etc/otel-gpu/otlp/%s" .Values.otlp.headersSecret.key) }}
{{- end }}
{{- end }}
{{- toYaml (mergeOverwrite $c .Values.config) }}
{{- end }}

{{/* Node labels that only GPU nodes carry: any one of them will do (the terms are ORed). */}}
{{- define "otel-gpu.gpuNodeSelectorTerms" -}}
- matchExpressions:
    # NVIDIA GPU Feature Discovery (GPU operator)
    - {key: nvidia.com/gpu.present, operator: In, values: ["true"]}
- matchExpressions:
    # Node Feature Discovery: a PCI device of vendor 10de (NVIDIA)
    - {key: feature.node.kubernetes.io/pci-10de.present, operator: In, values: ["true"]}
- matchExpressions:
    - {key: cloud.google.com/gke-accelerator, operator: Exists}
- matchExpressions:
    - {key: k8s.amazonaws.com/accelerator, operator: Exists}
- matchExpressions:
    - {key: kubernetes.azure.com/accelerator, operator: Exists}
{{- end }}

{{/* The pod's affinity: .Values.affinity, plus the GPU-node affinity unless it sets nodeAffinity. */}}
{{- define "otel-gpu.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) }}
{{- if and .Values.gpuNodeAffinity.enabled (not (hasKey $affinity "nodeAffinity")) }}
{{- $terms := concat (include "otel-gpu.gpuNodeSelectorTerms" . | fromYamlArray) .Values.gpuNodeAffinity.extraNodeSelectorTerms }}
{{- $_ := set $affinity "nodeAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" $terms)) }}
{{- end }}
{{- if $affinity }}{{ toYaml $affinity }}{{ end }}
{{- end }}
