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
for lane in $(compgen -e | grep -E '^LANE_[0-9]+$' | sort); do
  gpu=${lane#LANE_}
  out=/tmp/at/probe-verl/lane-$gpu.json
  outs+=("$out")
  prefix_var=LANE_PYTHONPATH_$gpu
  prefix=${!prefix_var:-}
  [ "$prefix" = verl-transformers ] && prefix=/tmp/verl-transformers
  log "lane $gpu: verl_compare ${!lane}${prefix:+ (PYTHONPATH first: $prefix)}"
  # shellcheck disable=SC2086
  PYTHONPATH=${prefix:+$prefix:}$PYTHONPATH CUDA_VISIBLE_DEVICES=$gpu VLLM_CACHE_ROOT=/tmp/at/vllm-cache-$gpu \
    TORCHINDUCTOR_CACHE_DIR=/tmp/at/inductor-$gpu TRITON_CACHE_DIR=/tmp/at/triton-$gpu \
    python3 -m benchmarks.gpu.verl_compare --job "$job" ${!lane} \
    --cache-dir /tmp/at/verl-cache-$gpu --out "$out" > /tmp/at/logs/verl-$gpu.log 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
log "lanes done"
python3 -m benchmarks.gpu.verl_compare merge "${outs[@]}" --out /tmp/at/probe-verl/compare.json
log "plan done"
