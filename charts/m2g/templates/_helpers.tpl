{{/* Labels on every object: the same app.kubernetes.io/part-of as deploy/, plus Helm's own. */}}
{{- define "m2g.labels" -}}
app.kubernetes.io/part-of: m2g
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The controller pods' selector (the same as deploy/'s). */}}
{{- define "m2g.selector" -}}
app.kubernetes.io/name: m2g
app.kubernetes.io/component: controller
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "m2g.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* An annotations: block with the Argo CD sync wave ("wave" in the dict), when enabled. */}}
{{- define "m2g.wave" -}}
{{- if .root.Values.argocd.syncWaves -}}
annotations:
  argocd.argoproj.io/sync-wave: {{ .wave | quote }}
{{- end -}}
{{- end -}}

{{/* The site configuration: .Values.config when given, else the chart's default file. */}}
{{- define "m2g.config" -}}
{{- if .Values.config -}}
{{ toYaml .Values.config }}
{{- else -}}
{{ .Files.Get "files/site-config.yaml" }}
{{- end -}}
{{- end -}}
