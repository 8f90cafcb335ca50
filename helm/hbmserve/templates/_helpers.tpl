{{/* Names, labels, secrets, and the pieces every Ray pod shares. */}}

{{- define "hbmserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Kept to 40 characters: KubeRay appends a suffix and a hash to name the RayCluster and its pods. */}}
{{- define "hbmserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "hbmserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hbmserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "hbmserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "hbmserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "hbmserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Secret names: the user's existing Secret, or the one this chart creates. */}}
{{- define "hbmserve.rayAuthSecret" -}}
{{- .Values.ray.auth.existingSecret | default (printf "%s-ray-auth" (include "hbmserve.fullname" .)) }}
{{- end }}

{{- define "hbmserve.apiKeysSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-api-keys" (include "hbmserve.fullname" .)) }}
{{- end }}

{{/* Which item of the api-keys Secret is mounted as the admin token file: the `sha256:` digest the
     chart writes, or in a user's Secret the item it has always held (the raw token; the front door
     takes either form). */}}
{{- define "hbmserve.adminTokenFileKey" -}}
{{- .Values.auth.adminTokenFileKey | default (ternary .Values.auth.adminTokenKey "admin_token.sha256" (not (empty .Values.auth.existingSecret))) }}
{{- end }}

{{- define "hbmserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- .Values.serviceAccount.name | default (include "hbmserve.fullname" .) }}
{{- else }}
{{- required "serviceAccount.create is false: set serviceAccount.name to an existing ServiceAccount (KubeRay binds its autoscaler Role to the head's account)" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hbmserve.internalSecret" -}}
{{- .Values.internalToken.existingSecret | default (printf "%s-internal" (include "hbmserve.fullname" .)) }}
{{- end }}

{{- define "hbmserve.topologyConfigMap" -}}
{{- printf "%s-topology" (include "hbmserve.fullname" .) }}
{{- end }}

{{- define "hbmserve.topologyMountPath" -}}/etc/hbmserve/topology{{- end }}

{{/* A random value that survives upgrades: the one already in the Secret, else a new one.
     Args: (list $ secretName key length). `helm template` has no cluster, so it always makes a new one. */}}
{{- define "hbmserve.keptRandom" -}}
{{- $root := index . 0 }}{{- $name := index . 1 }}{{- $key := index . 2 }}{{- $length := index . 3 }}
{{- $existing := lookup "v1" "Secret" $root.Release.Namespace $name }}
{{- if and $existing (hasKey ($existing.data | default dict) $key) }}
{{- index $existing.data $key | b64dec }}
{{- else }}
{{- randAlphaNum $length }}
{{- end }}
{{- end }}

{{/* The number of front doors: one per Ray node the cluster starts with (head and workers). */}}
{{- define "hbmserve.frontDoorReplicas" -}}
{{- $n := 1 }}
{{- range .Values.workerGroups }}{{- $n = add $n .replicas }}{{- end }}
{{- $n }}
{{- end }}

{{/* The Serve config (Ray Serve's ServeDeploySchema) for serveConfigV2: one application per model
     and the front door, built by hbmserve.deployments.apps.declarative from the cluster config as data.
     Python's serve_config() writes the same structure; tests/chart compare the two. */}}
{{- define "hbmserve.serveConfig" -}}
{{- $cluster := deepCopy .Values.cluster }}
{{- $serve := deepCopy (.Values.cluster.serve | default dict) }}
{{- if .Values.auth.enabled }}
{{- $auth := dict "keys_file" (printf "%s/%s" .Values.auth.mountPath .Values.auth.keysKey) }}
{{- if .Values.auth.adminToken.enabled }}
{{- $_ := set $auth "admin_token_file" (printf "%s/%s" .Values.auth.mountPath (include "hbmserve.adminTokenFileKey" .)) }}
{{- end }}
{{- $_ := set $serve "auth" $auth }}
{{- end }}
{{- $_ := set $cluster "serve" $serve }}
{{- /* The weight cache lives on its volume, else on a writable scratch dir: `~` is read-only here. */}}
{{- $cache := deepCopy ($cluster.cache | default dict) }}
{{- if .Values.weightCache.enabled }}
{{- $_ := set $cache "root" .Values.weightCache.mountPath }}
{{- else if not (hasKey $cache "root") }}
{{- $_ := set $cache "root" (printf "%s/hbmserve-weights" (first .Values.writableDirs)) }}
{{- end }}
{{- $_ := set $cluster "cache" $cache }}
{{- if .Values.topology }}
{{- $_ := set $cluster "topology" (printf "%s/cluster.yaml" (include "hbmserve.topologyMountPath" .)) }}
{{- end }}
{{- $tokenFile := printf "%s/%s" .Values.internalToken.mountPath .Values.internalToken.secretKey }}
{{- $apps := list }}
{{- range .Values.cluster.models }}
{{- $args := dict "cluster" $cluster "internal_token_file" $tokenFile "model" .name }}
{{- $apps = append $apps (dict "name" .name "import_path" "hbmserve.deployments.apps.declarative:model_app" "route_prefix" nil "args" $args) }}
{{- end }}
{{- $doorArgs := dict "cluster" $cluster "internal_token_file" $tokenFile "front_door_replicas" (include "hbmserve.frontDoorReplicas" . | int) }}
{{- $apps = append $apps (dict "name" "hbmserve-frontdoor" "import_path" "hbmserve.deployments.apps.declarative:front_door_app" "route_prefix" nil "args" $doorArgs) }}
{{- toYaml (dict "proxy_location" "Disabled" "http_options" (dict "host" (dig "http" "host" "127.0.0.1" $serve)) "applications" $apps) }}
{{- end }}

{{/* Environment of every Ray container. The Ray token comes from its Secret by reference, never inline. */}}
{{- define "hbmserve.rayEnv" -}}
{{- /* Serve replicas (the door, the engines) at the daemons' priority, not Ray's nice 15 for
     workers: cluster/local_head.py SERVING_ENV says why. */}}
- name: RAY_worker_niceness
  value: "0"
{{- if .Values.ray.auth.enabled }}
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "hbmserve.rayAuthSecret" . }}
      key: auth_token
{{- end }}
{{- include "hbmserve.cacheEnv" . }}
{{- if .Values.weightCache.enabled }}
- name: HF_HOME
  value: {{ printf "%s/huggingface" .Values.weightCache.mountPath }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* A read-only root filesystem: the caches of vLLM, PyTorch, Hugging Face and Triton go to the first
     writable emptyDir. */}}
{{- define "hbmserve.cacheEnv" -}}
{{- with (first .Values.writableDirs) }}
- name: XDG_CACHE_HOME
  value: {{ printf "%s/.cache" . }}
- name: XDG_CONFIG_HOME
  value: {{ printf "%s/.config" . }}
- name: TRITON_HOME
  value: {{ . }}
{{- end }}
{{- end }}

{{- define "hbmserve.volumeMounts" -}}
- name: dshm
  mountPath: /dev/shm
{{- range $i, $dir := .Values.writableDirs }}
- name: {{ printf "scratch-%d" $i }}
  mountPath: {{ $dir }}
{{- end }}
- name: internal-token
  mountPath: {{ .Values.internalToken.mountPath }}
  readOnly: true
{{- if .Values.auth.enabled }}
- name: api-keys
  mountPath: {{ .Values.auth.mountPath }}
  readOnly: true
{{- end }}
{{- if .Values.topology }}
- name: topology
  mountPath: {{ include "hbmserve.topologyMountPath" . }}
  readOnly: true
{{- end }}
{{- if .Values.weightCache.enabled }}
- name: weight-cache
  mountPath: {{ .Values.weightCache.mountPath }}
{{- end }}
{{- if .Values.tinyModel.enabled }}
- name: tiny-model
  mountPath: {{ .Values.tinyModel.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "hbmserve.volumes" -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.sharedMemorySize }}
{{- range $i, $dir := .Values.writableDirs }}
- name: {{ printf "scratch-%d" $i }}
  emptyDir: {}
{{- end }}
- name: internal-token
  secret:
    secretName: {{ include "hbmserve.internalSecret" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.internalToken.secretKey }}
        path: {{ .Values.internalToken.secretKey }}
{{- if .Values.auth.enabled }}
{{- /* Only the files the front door reads (serve.auth): the keys file and the admin token file, both
       `sha256:` digests in the chart's Secret. Its raw default key and raw admin token stay in the
       Secret for `kubectl get secret` and Prometheus, never in a pod. Every Ray pod needs the same two:
       each runs a front door (one per node) and may run a Serve application build, which checks the
       keys too (deployments/apps/declarative.py). An item path equals its key: the file is the key's name. */}}
- name: api-keys
  secret:
    secretName: {{ include "hbmserve.apiKeysSecret" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.auth.keysKey }}
        path: {{ .Values.auth.keysKey }}
      {{- if .Values.auth.adminToken.enabled }}
      {{- $adminFile := include "hbmserve.adminTokenFileKey" . }}
      - key: {{ $adminFile }}
        path: {{ $adminFile }}
      {{- end }}
{{- end }}
{{- if .Values.topology }}
- name: topology
  configMap:
    name: {{ include "hbmserve.topologyConfigMap" . }}
{{- end }}
{{- if .Values.weightCache.enabled }}
{{- $c := .Values.weightCache }}
- name: weight-cache
{{- if eq $c.type "hostPath" }}
  hostPath:
    path: {{ $c.hostPath.path }}
    type: {{ $c.hostPath.type }}
{{- else if eq $c.type "ephemeral" }}
  ephemeral:
    volumeClaimTemplate:
      metadata:
        labels:
          {{- include "hbmserve.selectorLabels" . | nindent 10 }}
      spec:
        accessModes: [ReadWriteOnce]
        {{- with $c.ephemeral.storageClassName }}
        storageClassName: {{ . }}
        {{- end }}
        resources:
          requests:
            storage: {{ $c.ephemeral.size }}
{{- else if eq $c.type "persistentVolumeClaim" }}
  persistentVolumeClaim:
    claimName: {{ required "weightCache.persistentVolumeClaim.claimName is required when weightCache.type is persistentVolumeClaim" $c.persistentVolumeClaim.claimName }}
{{- else }}
  emptyDir:
    {{- with $c.emptyDir.sizeLimit }}
    sizeLimit: {{ . }}
    {{- else }} {}
    {{- end }}
{{- end }}
{{- end }}
{{- if .Values.tinyModel.enabled }}
- name: tiny-model
  emptyDir: {}
{{- end }}
{{- end }}

{{/* Init containers of every Ray pod: the tiny model, when asked for, written before Ray starts. */}}
{{- define "hbmserve.initContainers" -}}
{{- if .Values.tinyModel.enabled }}
- name: tiny-model
  image: {{ include "hbmserve.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [hbmserve, model, tiny, --out, {{ printf "%s/tiny-llama" .Values.tinyModel.mountPath | quote }}]
  env:
    {{- include "hbmserve.cacheEnv" . | trim | nindent 4 }}
  resources:
    requests: {cpu: 500m, memory: 1Gi}
    limits: {memory: 1Gi}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: tiny-model
      mountPath: {{ .Values.tinyModel.mountPath }}
    {{- range $i, $dir := .Values.writableDirs }}
    - name: {{ printf "scratch-%d" $i }}
      mountPath: {{ $dir }}
    {{- end }}
{{- end }}
{{- end }}

{{/* The autoscaler sidecar's credentials for the Kubernetes API: the files Kubernetes mounts when a pod
     automounts its token, projected here so that autoscalerOptions.volumeMounts hands them to that one
     container. The Ray head container, which runs Serve replicas and a front door, gets none. Ray's
     KubeRay node provider reads token and ca.crt from the standard path and re-reads the token every
     minute, so the kubelet's rotation reaches it. */}}
{{- define "hbmserve.autoscalerApiVolume" -}}
- name: autoscaler-api-token
  projected:
    defaultMode: 0440
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3600
      - configMap:
          name: kube-root-ca.crt
          items:
            - {key: ca.crt, path: ca.crt}
      - downwardAPI:
          items:
            - path: namespace
              fieldRef: {apiVersion: v1, fieldPath: metadata.namespace}
{{- end }}

{{- define "hbmserve.autoscalerApiMountPath" -}}/var/run/secrets/kubernetes.io/serviceaccount{{- end }}

{{/* Pod-level fields every Ray pod shares. Args: (list $ "head") or (list $ "worker"). */}}
{{- define "hbmserve.podCommon" -}}
{{- $root := index . 0 }}{{- $role := index . 1 }}
serviceAccountName: {{ include "hbmserve.serviceAccountName" $root }}
# Nothing in a Ray container calls the Kubernetes API; only the autoscaler sidecar gets a token.
automountServiceAccountToken: false
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (include "hbmserve.initContainers" $root) }}
initContainers:
  {{- . | trim | nindent 2 }}
{{- end }}
volumes:
  {{- include "hbmserve.volumes" $root | nindent 2 }}
  {{- if and (eq $role "head") $root.Values.autoscaler.enabled }}
  {{- include "hbmserve.autoscalerApiVolume" $root | nindent 2 }}
  {{- end }}
{{- end }}

{{/* `ray start --resources` takes a JSON object; KubeRay passes the value through a shell, hence the quotes. */}}
{{- define "hbmserve.rayResourcesParam" -}}
{{- printf "%q" (toJson .) }}
{{- end }}
