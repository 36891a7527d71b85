{{/* Arithmetic the chart must do, each formula in exactly one helper. */}}

{{/*
startupProbe budget in seconds:
  baseSeconds + ceil(sizeGiB * secondsPerGiB[mode] / d), d = TP x PP for sharded modes (each
  rank reads only its own shard, in parallel), else 1.
*/}}
{{- define "ministream.startupBudgetSeconds" -}}
{{- $s := .Values.probes.startup -}}
{{- $load := mulf .Values.model.sizeGiB (index $s.secondsPerGiB .Values.loading.mode) -}}
{{- if include "ministream.isSharded" . -}}
{{- $load = divf $load (include "ministream.layout" . | fromYaml).world -}}
{{- end -}}
{{- add (int $s.baseSeconds) (int (ceil $load)) -}}
{{- end -}}

{{/* failureThreshold = ceil(budget / periodSeconds), unless set directly. */}}
{{- define "ministream.startupFailureThreshold" -}}
{{- $s := .Values.probes.startup -}}
{{- $budget := include "ministream.startupBudgetSeconds" . | int -}}
{{- default (ceil (divf $budget (int $s.periodSeconds))) $s.failureThreshold | int -}}
{{- end -}}

{{/*
Grace period: the preStop hook waits up to the drain timeout, then vLLM gets SIGTERM and
lets in-flight requests run for up to --shutdown-timeout; the margin covers the hook's own
HTTP slack (5 s) and process teardown:
  minimum = sidecar.drainTimeoutSeconds + vllm.shutdownTimeoutSeconds + shutdown.marginSeconds
The value is that minimum when terminationGracePeriodSeconds is null; a smaller value would
cut requests off and is refused.
*/}}
{{- define "ministream.terminationGracePeriodSeconds" -}}
{{- $v := .Values -}}
{{- $min := add (int $v.sidecar.drainTimeoutSeconds) (int $v.vllm.shutdownTimeoutSeconds) (int $v.shutdown.marginSeconds) -}}
{{- $set := $v.terminationGracePeriodSeconds -}}
{{- if and (not (kindIs "invalid" $set)) (lt (int $set) $min) -}}
{{- fail (printf "terminationGracePeriodSeconds=%d is too short: it must be >= sidecar.drainTimeoutSeconds (%d) + vllm.shutdownTimeoutSeconds (%d) + shutdown.marginSeconds (%d) = %d. Set terminationGracePeriodSeconds >= %d, leave it null to compute it, or lower the timeouts." (int $set) (int $v.sidecar.drainTimeoutSeconds) (int $v.vllm.shutdownTimeoutSeconds) (int $v.shutdown.marginSeconds) $min $min) -}}
{{- end -}}
{{- ternary $min $set (kindIs "invalid" $set) | int -}}
{{- end -}}

{{/*
Scale-down stabilization of the autoscaler, in seconds: a pod is removed only after the load
has stayed low for as long as a removed pod may take to come back (the longest start the
startupProbe allows) plus the time it takes to leave (the drain timeout), so a dip shorter
than one cold start never trades a serving pod for a cold start:
  computed = startupFailureThreshold x probes.startup.periodSeconds + sidecar.drainTimeoutSeconds
(the first term is the start-up budget rounded up to whole probe periods).
autoscaling.scaleDown.stabilizationWindowSeconds may raise it; a smaller value is refused,
and so is anything above the HPA's limit of 3600 s. KEDA's cooldownPeriod (the idle time
before going from one pod to zero) is the same window.
*/}}
{{- define "ministream.scaleDownStabilizationSeconds" -}}
{{- $v := .Values -}}
{{- $startup := mul (include "ministream.startupFailureThreshold" . | int) (int $v.probes.startup.periodSeconds) -}}
{{- $drain := int $v.sidecar.drainTimeoutSeconds -}}
{{- $min := add $startup $drain -}}
{{- $set := $v.autoscaling.scaleDown.stabilizationWindowSeconds -}}
{{- $window := ternary $min $set (kindIs "invalid" $set) | int -}}
{{- if lt $window $min -}}
{{- fail (printf "autoscaling.scaleDown.stabilizationWindowSeconds=%d is too short: it must be >= the startupProbe's longest start (%d s) + sidecar.drainTimeoutSeconds (%d) = %d. Set it >= %d or leave it null to compute it." $window $startup $drain $min $min) -}}
{{- end -}}
{{- if gt $window 3600 -}}
{{- fail (printf "autoscaling: the scale-down stabilization window (%d s: the startupProbe's longest start %d s + sidecar.drainTimeoutSeconds %d, or autoscaling.scaleDown.stabilizationWindowSeconds) exceeds the HPA's limit of 3600 s: lower probes.startup or the drain timeout." $window $startup $drain) -}}
{{- end -}}
{{- $window -}}
{{- end -}}

{{/* Cross-field checks JSON Schema cannot state: a comparison of two values, a key named by a value. */}}
{{- define "ministream.validate" -}}
{{- $v := .Values -}}
{{- $_ := include "ministream.terminationGracePeriodSeconds" . -}}
{{- $_ = include "ministream.layout" . -}}
{{- $_ = include "ministream.pdValidate" . -}}
{{- if gt (float64 $v.sidecar.drainMinSeconds) (float64 $v.sidecar.drainTimeoutSeconds) -}}
{{- fail (printf "sidecar.drainMinSeconds (%v) must not exceed sidecar.drainTimeoutSeconds (%v): the minimum wait is part of the drain timeout" $v.sidecar.drainMinSeconds $v.sidecar.drainTimeoutSeconds) -}}
{{- end -}}
{{- with $v.model.attentionHeads -}}
{{- $tp := include "ministream.tensorParallelSize" $ | int -}}
{{- if mod (int .) $tp -}}
{{- $fits := list -}}
{{- range $n := untilStep 1 (add (int .) 1 | int) 1 -}}
{{- if not (mod (int $.Values.model.attentionHeads) $n) }}{{ $fits = append $fits $n }}{{ end -}}
{{- end -}}
{{- fail (printf "parallelism.tensor=%d does not divide model.attentionHeads=%d: each rank serves whole heads. Set parallelism.tensor to one of %s." $tp (int .) (join ", " $fits)) -}}
{{- end -}}
{{- end -}}
{{- if gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas) -}}
{{- fail (printf "autoscaling.minReplicas (%d) must not exceed autoscaling.maxReplicas (%d)" (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) -}}
{{- end -}}
{{- if $v.autoscaling.enabled -}}
{{- $_ := include "ministream.scaleDownStabilizationSeconds" . -}}
{{- end -}}
{{- if hasKey (default dict $v.vllm.resources.limits) $v.accelerator.resourceName -}}
{{- fail (printf "do not set vllm.resources.limits.%s: the chart requests the devices itself (%s per pod, from parallelism and accelerator.perNode)" $v.accelerator.resourceName (include "ministream.ranksPerPod" .)) -}}
{{- end -}}
{{- end -}}

{{/*
A pod's share of the KV offload tier, in MiB: vLLM pins vllm.kvOffload.sizeGiB of host memory
summed over the replica's ranks (world = tensor x pipeline), each rank its equal part, so
  share = ceil(sizeGiB x 1024 x ranksPerPod / world)
0 when offload is off. vLLM's CPU build has no offloading: refused there.
*/}}
{{- define "ministream.kvOffloadMiBPerPod" -}}
{{- $size := .Values.vllm.kvOffload.sizeGiB -}}
{{- if $size -}}
{{- if eq .Values.accelerator.type "cpu" -}}
{{- fail (printf "vllm.kvOffload.sizeGiB=%v: vLLM's CPU build has no KV offloading (its engine stops at start: \"CPU Offloading is currently only supported on CUDA-alike and XPU GPUs\"). Leave vllm.kvOffload.sizeGiB null with accelerator.type=cpu." $size) -}}
{{- end -}}
{{- $layout := include "ministream.layout" . | fromYaml -}}
{{- ceil (divf (mulf $size 1024 (int $layout.ranksPerNode)) (int $layout.world)) | int -}}
{{- else -}}0{{- end -}}
{{- end -}}

{{/*
A Kubernetes memory quantity in MiB, rounded up: plain bytes, the decimal suffixes k M G T and
the binary Ki Mi Gi Ti (dict "quantity" Q "at" "the value's path", for the error).
*/}}
{{- define "ministream.memoryMiB" -}}
{{- $q := toString .quantity -}}
{{- $m := regexFindAll "^([0-9]+(?:\\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$" $q -1 -}}
{{- if not $m -}}
{{- fail (printf "%s=%q is not a memory quantity this chart can add to: write it as a number of bytes or with one of the suffixes Ki Mi Gi Ti k M G T (e.g. 32Gi)" .at $q) -}}
{{- end -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $q | float64 -}}
{{- $unit := trimPrefix (regexFind "^[0-9]+(\\.[0-9]+)?" $q) $q -}}
{{- $bytes := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 -}}
{{- ceil (divf (mulf $num (index $bytes $unit)) 1048576.0) | int -}}
{{- end -}}

{{/*
vLLM's KV cache per rank in bytes (`--kv-cache-memory-bytes`), or "" to let vLLM profile it.
Given, vLLM skips its memory profiling at start (H200: 1.8 s -> 0.6-0.9 s, docs/benchmarks.md
runs 13 and 17). vllm.kvCacheMemoryGiB wins; else, on a GPU with accelerator.memoryGiB set:
  floor((memoryGiB x U - sizeGiB / (tensor x pipeline) - vllm.kvCacheReserveGiB) x 2^30)
U = vllm.gpuMemoryUtilization or vLLM's own default (0.92 in vLLM 0.32, CacheConfig;
tests/charts check it against the installed vLLM), the reserve covers activations, CUDA graphs
and the CUDA context. scripts/gpu/h200.sh computes its KV_BYTES the same way.
*/}}
{{- define "ministream.kvCacheBytes" -}}
{{- $v := .Values -}}
{{- $given := $v.vllm.kvCacheMemoryGiB -}}
{{- if not (kindIs "invalid" $given) -}}
{{- if le (float64 $given) 0.0 -}}
{{- fail (printf "vllm.kvCacheMemoryGiB=%v: the KV cache needs a size above 0 GiB. Set a positive size, or leave it null." $given) -}}
{{- end -}}
{{- floor (mulf $given 1073741824) | int64 -}}
{{- else if and (eq $v.accelerator.type "gpu") (not (kindIs "invalid" $v.accelerator.memoryGiB)) -}}
{{- $u := $v.vllm.gpuMemoryUtilization | default 0.92 -}}
{{- $world := (include "ministream.layout" . | fromYaml).world -}}
{{- $weights := divf $v.model.sizeGiB $world -}}
{{- $gib := subf (mulf $v.accelerator.memoryGiB $u) $weights $v.vllm.kvCacheReserveGiB -}}
{{- $bytes := floor (mulf $gib 1073741824) | int64 -}}
{{- if le $bytes 0 -}}
{{- fail (printf "no room for a KV cache: accelerator.memoryGiB (%v) x gpu-memory-utilization (%v) - model.sizeGiB (%v) / tensor x pipeline (%v) - vllm.kvCacheReserveGiB (%v) = %v GiB. Check accelerator.memoryGiB and model.sizeGiB, raise parallelism, lower vllm.kvCacheReserveGiB, or set vllm.kvCacheMemoryGiB." $v.accelerator.memoryGiB $u $v.model.sizeGiB $world $v.vllm.kvCacheReserveGiB $gib) -}}
{{- end -}}
{{- $bytes -}}
{{- end -}}
{{- end -}}
