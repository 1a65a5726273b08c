{{/*
Names, labels and shared pod fragments for every Sluice component.
Components: "operator", "target", "gateway".
*/}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified base name, <= 42 chars so "<base>-target-<ordinal>" stays a valid label. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 42 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. Call with (dict "ctx" $ "component" "target"). */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" .ctx }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end -}}

{{/* Immutable selector labels. Call with (dict "ctx" $ "component" "target"). */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{- define "sluice.componentName" -}}
{{- printf "%s-%s" (include "sluice.fullname" .ctx) .component -}}
{{- end -}}

{{/* The ConfigMap holding the cluster map (members, buckets): written by the gateways. */}}
{{- define "sluice.clusterMapName" -}}
{{- include "sluice.componentName" (dict "ctx" . "component" "cluster-map") -}}
{{- end -}}

{{/* The Secret of the S3 API's keys (the gateways make it on the first key). */}}
{{- define "sluice.s3KeysName" -}}
{{- include "sluice.componentName" (dict "ctx" . "component" "s3-keys") -}}
{{- end -}}

{{- define "sluice.clusterKeySecretName" -}}
{{- default (printf "%s-cluster-key" (include "sluice.fullname" .)) .Values.clusterKey.existingSecret -}}
{{- end -}}

{{- define "sluice.tokenSecretName" -}}
{{- default (printf "%s-token" (include "sluice.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "sluice.readTokenSecretName" -}}
{{- default (printf "%s-read-token" (include "sluice.fullname" .)) .Values.auth.readTokenExistingSecret -}}
{{- end -}}

{{/* True (non-empty) when servers must check a read token on reads. */}}
{{- define "sluice.readTokenEnabled" -}}
{{- if or .Values.auth.readToken .Values.auth.readTokenExistingSecret -}}true{{- end -}}
{{- end -}}

{{/* True (non-empty) when servers must check a user token. */}}
{{- define "sluice.tokenEnabled" -}}
{{- if or .Values.auth.token .Values.auth.existingSecret -}}true{{- end -}}
{{- end -}}

{{/* Kopf peering is needed as soon as two operator replicas could both handle an ETL. */}}
{{- define "sluice.peeringEnabled" -}}
{{- if or .Values.operator.peering.enabled (gt (int .Values.operator.replicas) 1) -}}true{{- end -}}
{{- end -}}

{{/* Image reference. Call with (dict "ctx" $ "image" .Values.images.server). */}}
{{- define "sluice.image" -}}
{{- $tag := .image.tag | default .ctx.Values.images.tag | default .ctx.Chart.AppVersion -}}
{{- $repo := .image.repository -}}
{{- with .ctx.Values.images.registry -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" .) $repo -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (toString $tag) -}}
{{- end -}}
{{- end -}}

{{- define "sluice.imagePullSecrets" -}}
{{- with .Values.images.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Environment shared by targets and the gateway: who am I, the cluster key, the user token. */}}
{{- define "sluice.serverEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: SLUICE_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: SLUICE_CLUSTER_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "sluice.clusterKeySecretName" . }}
      key: cluster-key
{{- if include "sluice.tokenEnabled" . }}
- name: SLUICE_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "sluice.tokenSecretName" . }}
      key: {{ .Values.auth.existingSecretKey | default "token" }}
{{- end }}
{{- if include "sluice.readTokenEnabled" . }}
- name: SLUICE_READ_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "sluice.readTokenSecretName" . }}
      key: {{ .Values.auth.readTokenExistingSecretKey | default "read-token" }}
{{- end }}
{{- with .Values.auth.oidc }}{{ if .issuer }}
- name: SLUICE_OIDC_ISSUER
  value: {{ .issuer | quote }}
- name: SLUICE_OIDC_AUDIENCE
  value: {{ required "auth.oidc.audience is required with auth.oidc.issuer" .audience | quote }}
- name: SLUICE_OIDC_CLAIM
  value: {{ .claim | default "scope" | quote }}
{{- if .admin }}
- name: SLUICE_OIDC_ADMIN
  value: {{ .admin | quote }}
{{- end }}
{{- end }}{{ end }}
- name: PYTHONUNBUFFERED
  value: "1"
{{- end -}}

{{/*
A pod's annotations: Prometheus' scrape annotations for its /metrics (when
metrics.scrapeAnnotations) under the component's podAnnotations, which win.
Call with (dict "ctx" $ "port" 8080 "extra" .Values.target.podAnnotations).
*/}}
{{- define "sluice.podAnnotations" -}}
{{- $scrape := dict -}}
{{- if .ctx.Values.metrics.scrapeAnnotations -}}
{{- $scrape = dict "prometheus.io/scrape" "true" "prometheus.io/port" (toString .port) "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- with merge (deepCopy (.extra | default dict)) $scrape }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* Pod-level security context shared by every component. */}}
{{- define "sluice.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext -}}
{{- end -}}

{{- define "sluice.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext -}}
{{- end -}}

{{/*
Soft or hard anti-affinity that spreads a component's pods across nodes.
Call with (dict "ctx" $ "component" "target" "preset" "soft").
*/}}
{{- define "sluice.antiAffinity" -}}
{{- if eq .preset "hard" }}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "sluice.selectorLabels" . | nindent 10 }}
{{- else if eq .preset "soft" }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "sluice.selectorLabels" . | nindent 12 }}
{{- end }}
{{- end -}}

{{/* nodeSelector / tolerations / affinity block. Call with (dict "ctx" $ "component" "target" "values" .Values.target). */}}
{{- define "sluice.scheduling" -}}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .values.affinity }}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else if and .values.podAntiAffinity (ne .values.podAntiAffinity "none") }}
affinity:
  {{- include "sluice.antiAffinity" (dict "ctx" .ctx "component" .component "preset" .values.podAntiAffinity) | nindent 2 }}
{{- end }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/*
Remote buckets: each provider's environment of targets and gateways.
*/}}
{{- define "sluice.remoteEnv" -}}
{{- with .Values.remote.endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.remote.region }}
- name: AWS_REGION
  value: {{ . | quote }}
{{- end }}
{{- with (.Values.remote.gcp | default dict) }}
{{- with .endpoint }}
- name: STORAGE_EMULATOR_HOST
  value: {{ . | quote }}
{{- end }}
{{- with .project }}
- name: GOOGLE_CLOUD_PROJECT
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- with (.Values.remote.azure | default dict) }}
{{- with .endpoint }}
- name: AZURE_STORAGE_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with .account }}
- name: AZURE_STORAGE_ACCOUNT_NAME
  value: {{ . | quote }}
{{- end }}
{{- end }}
- name: SLUICE_REMOTE_CACHE_BYTES
  value: {{ .Values.remote.cacheBytes | int64 | quote }}
- name: SLUICE_REMOTE_CACHE_HIGH_WM
  value: {{ .Values.remote.highWatermark | quote }}
{{- end -}}

{{- define "sluice.remoteEnvFrom" -}}
{{- $names := list .Values.remote.secretName (.Values.remote.gcp | default dict).secretName (.Values.remote.azure | default dict).secretName | compact | uniq }}
{{- if $names }}
envFrom:
{{- range $names }}
  - secretRef:
      name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "sluice.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "sluice.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}

{{- /* tls.enabled: the certificate, its key and the CA, for every server (core/tls.py) */ -}}
{{- define "sluice.tlsEnv" -}}
{{- if .Values.tls.enabled }}
- name: SLUICE_TLS_CERT
  value: /etc/sluice/tls/tls.crt
- name: SLUICE_TLS_KEY
  value: /etc/sluice/tls/tls.key
- name: SLUICE_CA
  value: /etc/sluice/tls/ca.crt
{{- end }}
{{- end -}}

{{- define "sluice.tlsMounts" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/sluice/tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "sluice.tlsVolumes" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "sluice.tlsSecretName" . }}
{{- end }}
{{- end -}}

{{- define "sluice.remoteSecretMounts" -}}
{{- range .Values.remote.bucketSecrets }}
- name: remote-secret-{{ . }}
  mountPath: /etc/sluice/secrets/{{ . }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "sluice.remoteSecretVolumes" -}}
{{- range .Values.remote.bucketSecrets }}
- name: remote-secret-{{ . }}
  secret:
    secretName: {{ . }}
{{- end }}
{{- end -}}
