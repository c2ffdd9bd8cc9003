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

{{/* The labels a Prometheus Operator object adds to the chart's: monitorLabels, and the
     object's own (which win). Called with (dict "root" $ "own" the object's labels). */}}
{{- define "otel-gpu.monitorLabels" -}}
{{- $labels := merge (deepCopy (.own | default dict)) (deepCopy (.root.Values.monitorLabels | default dict)) }}
{{- with $labels }}{{ toYaml . }}{{ end }}
{{- end }}

{{/* Whether the DaemonSet's priority class is one GKE admits only against a ResourceQuota. */}}
{{- define "otel-gpu.criticalPriority" -}}
{{- if has .Values.priorityClassName (list "system-node-critical" "system-cluster-critical") }}true{{ end }}
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
- matchExpressions:
    # Karpenter on EKS
    - {key: karpenter.k8s.aws/instance-gpu-manufacturer, operator: In, values: [nvidia]}
- matchExpressions:
    # EKS Auto Mode
    - {key: eks.amazonaws.com/instance-gpu-manufacturer, operator: In, values: [nvidia]}
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

{{/* How scrapers reach /metrics through the web config: "https" or "http". */}}
{{- define "otel-gpu.scrapeScheme" -}}
{{- $w := .Values.webConfig }}
{{- $s := $w.scrape }}
{{- if not $w.enabled }}http
{{- else if $s.scheme }}{{ $s.scheme }}
{{- else if or ($w.config | default dict).tls_server_config $s.caSecret.name $s.clientCertSecret.name $s.insecureSkipVerify (eq $w.probeScheme "HTTPS") }}https
{{- else }}http
{{- end }}
{{- end }}

{{/* The name Prometheus checks the server's certificate against. */}}
{{- define "otel-gpu.scrapeServerName" -}}
{{- .Values.webConfig.scrape.serverName | default (printf "%s.%s.svc" (include "otel-gpu.fullname" .) .Release.Namespace) }}
{{- end }}

{{/* Whether the inline web config asks scrapers for a client certificate. */}}
{{- define "otel-gpu.webConfigRequiresClientCert" -}}
{{- $tls := (.Values.webConfig.config | default dict).tls_server_config | default dict }}
{{- if has ($tls.client_auth_type | default "") (list "RequireAnyClientCert" "RequireAndVerifyClientCert") }}true{{ end }}
{{- end }}

{{/* The scrape endpoint's scheme, tlsConfig and basicAuth (ServiceMonitor and PodMonitor
     alike), from webConfig.scrape; refuses, in one line, a monitor that could not scrape.
     Called with (dict "root" $ "endpoint" the monitor's own endpoint value). */}}
{{- define "otel-gpu.scrapeEndpoint" -}}
{{- $root := .root }}
{{- $w := $root.Values.webConfig }}
{{- $s := $w.scrape }}
{{- $user := .endpoint | default dict }}
{{- $e := dict "scheme" (include "otel-gpu.scrapeScheme" $root) }}
{{- if and $w.enabled (eq $e.scheme "https") (not (hasKey $user "tlsConfig")) }}
{{- if not (or $s.caSecret.name $s.insecureSkipVerify) }}
{{- fail "webConfig: Prometheus cannot verify otel-gpu's certificate: set webConfig.scrape.caSecret.name (a Secret holding the CA that signed it) or webConfig.scrape.insecureSkipVerify=true" }}
{{- end }}
{{- if and (include "otel-gpu.webConfigRequiresClientCert" $root) (not $s.clientCertSecret.name) }}
{{- fail "webConfig: the web config requires a client certificate: set webConfig.scrape.clientCertSecret.name (a Secret holding Prometheus's tls.crt and tls.key)" }}
{{- end }}
{{- $tls := dict }}
{{- if $s.insecureSkipVerify }}
{{- $_ := set $tls "insecureSkipVerify" true }}
{{- else }}
{{- $_ := set $tls "ca" (dict "secret" (dict "name" $s.caSecret.name "key" $s.caSecret.key)) }}
{{- $_ := set $tls "serverName" (include "otel-gpu.scrapeServerName" $root) }}
{{- end }}
{{- with $s.clientCertSecret.name }}
{{- $_ := set $tls "cert" (dict "secret" (dict "name" . "key" $s.clientCertSecret.certKey)) }}
{{- $_ := set $tls "keySecret" (dict "name" . "key" $s.clientCertSecret.keyKey) }}
{{- end }}
{{- $_ := set $e "tlsConfig" $tls }}
{{- end }}
{{- if and $w.enabled (not (hasKey $user "basicAuth")) }}
{{- if $s.basicAuthSecret.name }}
{{- $b := $s.basicAuthSecret }}
{{- $_ := set $e "basicAuth" (dict "username" (dict "name" $b.name "key" $b.usernameKey) "password" (dict "name" $b.name "key" $b.passwordKey)) }}
{{- else if ($w.config | default dict).basic_auth_users }}
{{- fail "webConfig: the web config asks for a password: set webConfig.scrape.basicAuthSecret.name (a Secret holding Prometheus's username and password)" }}
{{- end }}
{{- end }}
{{- toYaml $e }}
{{- end }}

{{/* Refuses, in one line, an inline web config naming files the pod would not have. */}}
{{- define "otel-gpu.checkWebConfigFiles" -}}
{{- $w := .Values.webConfig }}
{{- $tls := ($w.config | default dict).tls_server_config | default dict }}
{{- range $key := list "cert_file" "key_file" "client_ca_file" }}
{{- $path := get $tls $key | toString }}
{{- if and (hasKey $tls $key) (not $w.tlsSecret) (not $w.existingSecret) }}
{{- fail (printf "webConfig.config.tls_server_config.%s: %s is not in the pod, which gets only web-config.yml: set webConfig.tlsSecret (a Secret holding it, mounted beside web-config.yml in /etc/otel-gpu/web/)" $key $path) }}
{{- end }}
{{- if and (not $w.existingSecret) (hasPrefix "/" $path) (not (hasPrefix "/etc/otel-gpu/web/" $path)) }}
{{- fail (printf "webConfig.config.tls_server_config.%s: %s is not in the pod: name it relative to web-config.yml (tls.crt) or under /etc/otel-gpu/web/, where webConfig.tlsSecret is mounted" $key $path) }}
{{- end }}
{{- end }}
{{- end }}
