{{- define "gpu-dra.labels" -}}
app.kubernetes.io/part-of: gpu-dra-driver
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}
{{- /* The first of a list of values that is set and not "", as a string ("" if none is). */ -}}
{{- define "gpu-dra.first" -}}
{{- $out := "" -}}
{{- range . -}}
{{- if and (eq $out "") (not (kindIs "invalid" .)) (ne (toString .) "") -}}
{{- $out = toString . -}}
{{- end -}}
{{- end -}}
{{- $out -}}
{{- end }}
{{- define "gpu-dra.image" -}}
{{ .Values.image.repository }}/{{ .Values.image.name }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
