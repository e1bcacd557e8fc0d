{{/* Names, labels and the operator's command line, shared by every template. */}}

{{- define "finetune-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, or just the release name when it already contains the chart name. */}}
{{- define "finetune-operator.fullname" -}}
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

{{- define "finetune-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "finetune-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "finetune-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "finetune-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: finetune-operator
{{- end }}

{{- define "finetune-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "finetune-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "finetune-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "finetune-operator.peeringName" -}}
{{- default (include "finetune-operator.fullname" .) .Values.peering.name }}
{{- end }}

{{- define "finetune-operator.progressService" -}}
{{- printf "%s-progress" (include "finetune-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "finetune-operator.progressTLSSecret" -}}
{{- default (printf "%s-progress-tls" (include "finetune-operator.fullname" .)) .Values.progress.tls.existingSecret }}
{{- end }}

{{/* The URL trainer pods report progress to: the progress Service's cluster DNS name. */}}
{{- define "finetune-operator.progressURL" -}}
{{- printf "https://%s.%s.svc:%d" (include "finetune-operator.progressService" .) .Release.Namespace (int .Values.progress.port) }}
{{- end }}

{{/* Namespace the helm-test FineTuneJob runs in: test.namespace, else the first watched one. */}}
{{- define "finetune-operator.testNamespace" -}}
{{- if .Values.test.namespace }}
{{- .Values.test.namespace }}
{{- else if .Values.watchNamespaces }}
{{- first .Values.watchNamespaces }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{/* `ftjob operator` flags, one per list item (YAML list of strings). */}}
{{- define "finetune-operator.args" -}}
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- if .Values.peering.enabled }}
- --peering={{ include "finetune-operator.peeringName" . }}
{{- else }}
- --standalone
{{- end }}
- --liveness=http://0.0.0.0:{{ .Values.health.port }}/healthz
- --image={{ .Values.trainer.image }}
- --progress-url={{ include "finetune-operator.progressURL" . }}
- --progress-port={{ .Values.progress.port }}
- --progress-cert=/etc/finetune-operator/tls/tls.crt
- --progress-key=/etc/finetune-operator/tls/tls.key
- --progress-ca=/etc/finetune-operator/tls/ca.crt
- --metrics-port={{ .Values.metrics.port }}
{{- if .Values.verbose }}
- --verbose
{{- end }}
{{- include "finetune-operator.podPolicyArgs" . }}
{{- range .Values.extraArgs }}
- {{ . }}
{{- end }}
{{- end }}

{{/* The pod policy's flags (values podPolicy): each list item one repeatable flag; none keeps the default. */}}
{{- define "finetune-operator.podPolicyArgs" -}}
{{- $flags := dict "allowedImages" "--allowed-image" "allowedServiceAccounts" "--allowed-service-account" "allowedPriorityClasses" "--allowed-priority-class" "allowedAnnotationPrefixes" "--allowed-annotation-prefix" "allowedLabelPrefixes" "--allowed-label-prefix" "allowedTolerations" "--allowed-toleration" }}
{{- $policy := .Values.podPolicy | default dict }}
{{- range $key := keys $flags | sortAlpha }}
{{- range (get $policy $key | default list) }}
- {{ printf "%s=%s" (get $flags $key) . | quote }}
{{- end }}
{{- end }}
- --pod-security-level={{ $policy.securityLevel | default "restricted" }}
{{- end }}
