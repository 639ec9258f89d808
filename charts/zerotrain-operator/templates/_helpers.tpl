{{/*
Names, labels, RBAC rules and value checks shared by the templates.
*/}}

{{/* Chart name, overridable with nameOverride. */}}
{{- define "zerotrain-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: prefix of every resource name. DNS-1123 labels are at most 63 characters; the release name is
not repeated when it already contains the chart name.
*/}}
{{- define "zerotrain-operator.fullname" -}}
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

{{/* chart label value: name-version, with + (not allowed in labels) replaced. */}}
{{- define "zerotrain-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator pod; never change them after a release (Deployment selectors are immutable). */}}
{{- define "zerotrain-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "zerotrain-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of every object of the chart. */}}
{{- define "zerotrain-operator.labels" -}}
helm.sh/chart: {{ include "zerotrain-operator.chart" . }}
{{ include "zerotrain-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: zerotrain
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "zerotrain-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "zerotrain-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is pinned. */}}
{{- define "zerotrain-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Labels every training pod carries (zerotrain.operator.naming.job_labels; tests/chart/test_monitoring.py checks a pod
built by the operator matches): the PodMonitor selects on them.
*/}}
{{- define "zerotrain-operator.trainingPodSelector" -}}
matchLabels:
  app.kubernetes.io/managed-by: zerotrain-operator
matchExpressions:
  - key: zerotrain.dev/job
    operator: Exists
{{- end }}

{{/*
The RBAC rules of the operator, shared by the ClusterRole (cluster scope) and the per-namespace Roles (namespaced
scope). They grant exactly the API calls the operator makes (zerotrain.operator.api_calls.API_CALLS; the chart tests fail
when the two differ): no wildcards, no verb or resource it does not use.
*/}}
{{- define "zerotrain-operator.rules" -}}
# The jobs: kopf watches them and removes the finalizer older releases left (patch); the operator reads a job fresh
# before reconciling (get) and deletes it after ttlSecondsAfterFinished (delete).
- apiGroups: ["zerotrain.dev"]
  resources: ["zerotrainingjobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Status is written through the status subresource, once per reconcile when it changed.
- apiGroups: ["zerotrain.dev"]
  resources: ["zerotrainingjobs/status"]
  verbs: ["patch"]
# Children's owner references set blockOwnerDeletion; with the OwnerReferencesPermissionEnforcement admission plugin
# (OpenShift, many hardened clusters) creating them needs update on the job's finalizers, though none is ever set.
- apiGroups: ["zerotrain.dev"]
  resources: ["zerotrainingjobs/finalizers"]
  verbs: ["update"]
# The ranks: the operator watches the jobs' pods (operator/reflector.py), the operator creates a gang and deletes it to restart or suspend.
# An in-place restart patches the kept pods' gang label and round annotation. `get` is never requested: each job's
# Role grants it (with watch and patch) to the job's pods on their own pods, and a Role may grant only what its
# author holds.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# Per-job children applied before the pods: the headless Service (rendezvous DNS) and the ranks' ServiceAccount,
# watched into the operator's cache. Written by server-side apply (patch; create where the apply creates them).
# Owner references delete them with the job, so no delete verb.
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["list", "watch", "create", "patch"]
# One immutable ConfigMap per gang (the runtime's config): created with the gang, the earlier gangs' deleted by
# name (pods kept in place by an in-place restart keep the one they mount until a gang is created afresh).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["create", "delete"]
# A Role and RoleBinding per job that let its ranks patch only that job's status. The operator holds every
# permission it grants there, so it needs neither `escalate` nor `bind` (the RoleBinding is created once its Role
# exists: the server checks the Role's rules against the operator's). Watched into the operator's cache.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["list", "watch", "create", "patch"]
{{- if .Values.rbac.kueue }}
# Jobs admitted through Kueue (label kueue.x-k8s.io/queue-name): the operator checks their LocalQueue exists, and
# reads a held gang's Workload for Kueue's own reason (what quota it waits for).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["localqueues", "workloads"]
  verbs: ["get"]
{{- end }}
# Events of kopf and the operator on the jobs; a repeat within 10 minutes patches the first one's count.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.rbac.gangScheduling.coscheduling }}
# Gang scheduling with the scheduler-plugins coscheduling plugin (scheduling.gang=coscheduling).
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups"]
  verbs: ["create", "patch"]
{{- end }}
{{- if .Values.rbac.gangScheduling.volcano }}
# Gang scheduling with Volcano (scheduling.gang=volcano).
- apiGroups: ["scheduling.volcano.sh"]
  resources: ["podgroups"]
  verbs: ["create", "patch"]
{{- end }}
{{- end }}

{{/*
Fail early, with the key, the value and the fix, on values that contradict each other. The schema
(values.schema.json) catches single bad values; this catches combinations.
*/}}
{{- define "zerotrain-operator.validate" -}}
{{- $v := .Values }}
{{- if and (gt (int $v.replicaCount) 1) (not $v.leaderElection.enabled) }}
{{- fail (printf "replicaCount is %v but leaderElection.enabled is false: two replicas would both reconcile every job. Set leaderElection.enabled=true, or replicaCount to 1 (or 0 to stop the operator)." $v.replicaCount) }}
{{- end }}
{{- if and $v.leaderElection.enabled (le (float64 $v.leaderElection.leaseSeconds) (float64 $v.leaderElection.renewSeconds)) }}
{{- fail (printf "leaderElection.leaseSeconds (%v) must exceed leaderElection.renewSeconds (%v): a leader would lose its lease between renewals." $v.leaderElection.leaseSeconds $v.leaderElection.renewSeconds) }}
{{- end }}
{{- if and (eq $v.operator.scope "namespaced") (empty $v.operator.watchNamespaces) }}
{{- fail "operator.scope is namespaced but operator.watchNamespaces is empty: list the namespaces to watch (e.g. --set operator.watchNamespaces={team-a}), or set operator.scope=cluster." }}
{{- end }}
{{- if and (eq $v.operator.scope "cluster") (not (empty $v.operator.watchNamespaces)) }}
{{- fail (printf "operator.watchNamespaces is %v but operator.scope is cluster, which watches every namespace: set operator.scope=namespaced to watch only those, or empty operator.watchNamespaces." $v.operator.watchNamespaces) }}
{{- end }}
{{- if ne (len $v.operator.watchNamespaces) (len (uniq $v.operator.watchNamespaces)) }}
{{- fail (printf "operator.watchNamespaces %v lists a namespace twice: list each namespace once." $v.operator.watchNamespaces) }}
{{- end }}
{{- if and $v.serviceMonitor.enabled (not $v.metrics.enabled) }}
{{- fail "serviceMonitor.enabled is true but metrics.enabled is false: the ServiceMonitor would scrape a Service that does not exist. Enable metrics or disable the ServiceMonitor." }}
{{- end }}
{{- if and (not $v.serviceAccount.create) (not $v.serviceAccount.name) }}
{{- fail "serviceAccount.create is false but serviceAccount.name is empty: name the existing ServiceAccount the operator runs as, or set serviceAccount.create=true." }}
{{- end }}
{{- if eq (int $v.metrics.port) (int $v.healthPort) }}
{{- fail (printf "metrics.port and healthPort are both %v: the operator serves /metrics and /healthz on separate ports; choose two different ports." $v.healthPort) }}
{{- end }}
{{- end }}
