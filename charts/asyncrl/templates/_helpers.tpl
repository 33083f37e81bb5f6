{{/* Names and labels of the chart, from one place. */}}
{{- define "asyncrl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "asyncrl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s-operator" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "asyncrl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "asyncrl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "asyncrl.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "asyncrl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: asyncrl
{{- end -}}

{{- define "asyncrl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "asyncrl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "asyncrl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "asyncrl.jobImage" -}}
{{- printf "%s:%s" .Values.jobImage.repository (default .Chart.AppVersion .Values.jobImage.tag) -}}
{{- end -}}

{{/* The operator's permissions: least privilege for what asyncrl.operator calls. */}}
{{- define "asyncrl.rules" -}}
- apiGroups: ["asyncrl.io"]
  resources: ["asyncrljobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["asyncrl.io"]
  resources: ["asyncrljobs/status"]
  verbs: ["get", "patch"]
# children carry ownerReferences with blockOwnerDeletion: the API server (OwnerReferencesPermissionEnforcement)
# lets only who may update the owner's finalizers set that
- apiGroups: ["asyncrl.io"]
  resources: ["asyncrljobs/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create"]
# services and networkpolicies: a job's headless Service and NetworkPolicy are created once; the agent
# endpoint's <job>-agent Service and NetworkPolicy (spec.task.agent) follow the spec: patched on an edit,
# deleted when the spec drops them (only the job's own, by owner uid), so a peer taken out of allowFrom loses access
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch", "delete"]
# the job's Ray token Secret: created once and read back as metadata only; never listed, watched or changed
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch", "delete"]
# the gang scheduler's PodGroup (volcano or scheduler-plugins coscheduling); it follows the gang's size
- apiGroups: ["scheduling.volcano.sh", "scheduling.x-k8s.io"]
  resources: ["podgroups"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/*
The namespaces whose Prometheus pods a job's NetworkPolicy admits, as JSON matchLabels: {} (any) only
on the explicit prometheusFromAnyNamespace, else the configured labels, else the release namespace.
*/}}
{{- define "asyncrl.prometheusNamespaceSelector" -}}
{{- $np := .Values.jobNetworkPolicy -}}
{{- if $np.prometheusFromAnyNamespace -}}
{}
{{- else if $np.prometheusNamespaceSelector -}}
{{- $np.prometheusNamespaceSelector | toJson -}}
{{- else -}}
{{- dict "kubernetes.io/metadata.name" .Release.Namespace | toJson -}}
{{- end -}}
{{- end -}}
