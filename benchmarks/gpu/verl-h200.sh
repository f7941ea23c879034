#!/usr/bin/env bash
# One H200: the Qwen2.5-1.5B GRPO-like job's configs measured by the tuner's trial and by
# verl 0.9.1 itself (verl_compare.py), detached. Wheels first: vLLM 0.24.0 + the control
# bundle in /tmp/parts, verl's bundle and antlr4's wheel in /tmp/parts-verl, flash-attn
# 2.8.3.post2's four parts in /tmp/parts-fa (see setup-verl.sh and ../shared/gpu-host).
# COMPARE_ARGS replaces the default comparison (three configs, 32 prompts x 8 per step),
# COMPARE_JOB the job (default: the Qwen2.5-1.5B GRPO-like job). On a host of several GPUs
# every GPU is visible: a job whose cluster names them all (e.g.
# jobs/qwen2-7b-grpo-4gpu-world.yaml on four) runs its trials and verl over all of them.
# usage: setsid nohup bash benchmarks/gpu/verl-h200.sh > /tmp/at/logs/plan.out 2>&1 &
#        then: bash benchmarks/gpu/poll.sh SECONDS (packs $OUT/results.tgz)
set -uo pipefail
source benchmarks/gpu/verl-host.sh
args=${COMPARE_ARGS:-"--config defaults --config example --config winner=benchmarks/results/qwen2.5-1.5b-grpo-packed-h200.json#2 --train-batch-size 32 --ppo-mini-batch-size 8"}
log "verl_compare $args"
# shellcheck disable=SC2086
python3 -m benchmarks.gpu.verl_compare --job "${COMPARE_JOB:-benchmarks/jobs/qwen2.5-1.5b-grpo.yaml}" $args \
  --out /tmp/at/probe-verl/compare.json > /tmp/at/logs/verl.log 2>&1
log "plan done"
