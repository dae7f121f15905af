{{/*
The approval admission policies of files/admission/ (a symlink to manifests/admission/), one
entry per object: {object, source, owner}. They are cluster-wide with fixed names, so one copy
serves every release and the kubectl install (`kubectl apply -f manifests/admission/`):
- an object that does not exist yet, or that this release installed, is this release's (owner
  ""): templates/admission-policies.yaml renders it, with helm.sh/resource-policy: keep, so
  that uninstalling one release never removes the policies the others rely on;
- an object that exists and is someone else's (another release, or kubectl) is left alone, and
  owner says whose it is (NOTES.txt tells).
lookup only answers against a cluster: `helm template`, `helm lint` and client-side dry runs
render every object.
*/}}
{{- define "agentrun-operator.admissionPolicies" -}}
{{- $entries := list }}
{{- range $path, $_ := .Files.Glob "files/admission/*.yaml" }}
{{- range $text := regexSplit "(?m)^---[ \t]*$" ($.Files.Get $path) -1 }}
{{- $object := fromYaml $text }}
{{- if and $object (hasKey $object "kind") }}
{{- $live := lookup $object.apiVersion $object.kind "" $object.metadata.name }}
{{- $owner := "" }}
{{- if $live }}
{{- $annotations := $live.metadata.annotations | default dict }}
{{- $release := get $annotations "meta.helm.sh/release-name" }}
{{- $namespace := get $annotations "meta.helm.sh/release-namespace" }}
{{- if not (and (eq $release $.Release.Name) (eq $namespace $.Release.Namespace)) }}
{{- $owner = ternary (printf "Helm release %s in namespace %s" $release $namespace) "kubectl (outside Helm)" (ne $release "") }}
{{- end }}
{{- end }}
{{- $entries = append $entries (dict "object" $object "source" (base $path) "owner" $owner) }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml (dict "objects" $entries) }}
{{- end }}
