#!/usr/bin/env bash
# One host with several GPUs: verl_compare.py side by side, one comparison ("lane") per GPU,
# each with its own GPU (CUDA_VISIBLE_DEVICES), caches and output, then merged into one
# file and one table (verl_compare.py merge). Each trial and each verl run has a whole GPU
# to itself, as on a one-GPU host; the lanes share the host's CPUs. Wheels as for
# verl-h200.sh (vLLM 0.24.0 + the control bundle in /tmp/parts, verl's bundle and antlr4's
# wheel in /tmp/parts-verl, flash-attn's parts in /tmp/parts-fa).
# LANE_0, LANE_1, ... hold each lane's verl_compare arguments besides --job and --out;
# COMPARE_JOB the job spec (default the Qwen2.5-1.5B GRPO-like job).
# LANE_PYTHONPATH_0, ...: a folder put before that lane's PYTHONPATH; `verl-transformers`
# names /tmp/verl-transformers, which holds verl's transformers (5.10.4, with the tokenizers
# and huggingface-hub it takes, linked from verl's folder) and nothing else, so that a lane's
# trials run the model code verl runs (each trial records the transformers it ran).
# LANE_0_THEN, ...: a second comparison on that lane's GPU once its first has ended (its own
# output, merged with the rest).
# Before the lanes start and after they end, each lane's host speed alone (host_speed.py, on
# its GPU and CPUs; probe-verl/host-speed-{before,after}-GPU.json): a step paced by the host
# moves with it.
# LANE_CPUS=numa: each lane runs on its share of its GPU's CPUs (lane_cpus.py: the cores NVML
# names near the GPU, split evenly among the lanes whose GPUs share them), as a host of one
# GPU would give it its own cores; unset: the lanes share all of the host's CPUs.
# usage: LANE_0="--config defaults ..." LANE_1="--config example ..." \
#          setsid nohup bash benchmarks/gpu/verl-lanes.sh > /tmp/at/logs/plan.out 2>&1 &
#        then: bash benchmarks/gpu/poll.sh SECONDS (packs $OUT/results.tgz, the merged
#        comparison in probe-verl/compare.json)
set -uo pipefail
source benchmarks/gpu/verl-host.sh
job=${COMPARE_JOB:-benchmarks/jobs/qwen2.5-1.5b-grpo.yaml}
pids=() outs=()
if compgen -e | grep -qE '^LANE_PYTHONPATH_'; then
  mkdir -p /tmp/verl-transformers
  for pkg in transformers tokenizers huggingface_hub; do
    ln -sfn /tmp/site-verl/$pkg /tmp/verl-transformers/$pkg
    for info in /tmp/site-verl/$pkg-*.dist-info; do ln -sfn "$info" /tmp/verl-transformers/; done
  done
fi
lanes=$(compgen -e | grep -E '^LANE_[0-9]+$' | sort)
declare -A cpus=()
if [ "${LANE_CPUS:-}" = numa ]; then
  nvidia-smi topo -m > /tmp/at/logs/topo.txt 2>&1
  # shellcheck disable=SC2086
  while read -r gpu list; do cpus[$gpu]=$list; done < <(python3 -m benchmarks.gpu.lane_cpus ${lanes//LANE_/})
fi
compare() {  # GPU ARGS OUT LOG: one comparison on that GPU (on its lane's CPUs where pinned)
  local gpu=$1 args=$2 out=$3 prefix_var=LANE_PYTHONPATH_$1 pin=()
  local prefix=${!prefix_var:-}
  [ "$prefix" = verl-transformers ] && prefix=/tmp/verl-transformers
  [ -n "${cpus[$gpu]:-}" ] && pin=(taskset -c "${cpus[$gpu]}")
  log "lane $gpu: verl_compare $args${prefix:+ (PYTHONPATH first: $prefix)}${pin:+ (CPUs ${cpus[$gpu]})}"
  # shellcheck disable=SC2086
  PYTHONPATH=${prefix:+$prefix:}$PYTHONPATH CUDA_VISIBLE_DEVICES=$gpu VLLM_CACHE_ROOT=/tmp/at/vllm-cache-$gpu \
    TORCHINDUCTOR_CACHE_DIR=/tmp/at/inductor-$gpu TRITON_CACHE_DIR=/tmp/at/triton-$gpu \
    "${pin[@]}" python3 -m benchmarks.gpu.verl_compare --job "$job" $args \
    --cache-dir /tmp/at/verl-cache-$gpu --out "$out" >> "$4" 2>&1
}
host_speed() {  # WHEN: each lane's host speed alone, on its GPU and CPUs (host_speed.py)
  local gpu pin
  for lane in $lanes; do
    gpu=${lane#LANE_} pin=()
    [ -n "${cpus[$gpu]:-}" ] && pin=(taskset -c "${cpus[$gpu]}")
    CUDA_VISIBLE_DEVICES=$gpu "${pin[@]}" python3 -m benchmarks.gpu.host_speed \
      --out "/tmp/at/probe-verl/host-speed-$1-$gpu.json" >> /tmp/at/logs/host-speed.log 2>&1
  done
}
host_speed before
for lane in $lanes; do
  gpu=${lane#LANE_}
  then_var=${lane}_THEN
  outs+=(/tmp/at/probe-verl/lane-$gpu.json)
  [ -n "${!then_var:-}" ] && outs+=(/tmp/at/probe-verl/lane-$gpu-then.json)
  (compare "$gpu" "${!lane}" /tmp/at/probe-verl/lane-$gpu.json /tmp/at/logs/verl-$gpu.log
   if [ -n "${!then_var:-}" ]; then
     compare "$gpu" "${!then_var}" /tmp/at/probe-verl/lane-$gpu-then.json /tmp/at/logs/verl-$gpu.log
   fi) &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
log "lanes done"
host_speed after
present=()
for o in "${outs[@]}"; do [ -f "$o" ] && present+=("$o"); done
python3 -m benchmarks.gpu.verl_compare merge "${present[@]}" --out /tmp/at/probe-verl/compare.json
log "plan done"
