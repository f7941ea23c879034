#!/usr/bin/env bash
# The update's micro-batch layouts in verl itself, each beside the tuner's trial of it, detached:
# five copies of verl's defaults that differ in the update's layout alone, on the Qwen2.5-1.5B
# GRPO-like job at 32 prompts x 8 a step (verl_compare.py, verl's workers traced):
#   p4, p8, p16  packed micro-batches of 4, 8, 16 sequences (ppo_micro_batch_size_per_gpu)
#   dyn16384     dynamic batches of 16,384 tokens (use_dynamic_bsz, ppo_max_token_len_per_gpu)
#   pad4         rows padded to the micro-batch's longest at 4 (use_remove_padding false)
# The log-prob passes keep the defaults' settings (2 sequences a micro-batch) except where verl
# ties them to the update: its worker asserts one use_dynamic_bsz for the update and the
# log-prob passes, so dyn16384 runs those in dynamic batches too (16,384 tokens, the defaults'
# budget), and use_remove_padding is the model's, so pad4 pads them too. The update's rates,
# each as a ratio to p4's, are set against the probe's by benchmarks/claims/layout_verl.py.
# Wheels as for verl-h200.sh (vLLM 0.24.0 + the control bundle in /tmp/parts, verl's bundle and
# antlr4's wheel in /tmp/parts-verl, flash-attn's parts in /tmp/parts-fa).
# On a host of one GPU the configs run in sequence (verl-h200.sh); on a host of several, one
# comparison per GPU side by side (verl-lanes.sh, each lane on its share of its GPU's cores:
# LANE_CPUS=numa unless set), the configs dealt out over the lanes in order, so that with more
# configs than GPUs a lane runs a second one after its first (on four GPUs: p4, then pad4).
# Each config: a trial, verl's run (4 steps, the first a warm-up), a second trial; on the host
# of four H200 of 2026-11-27 that took 16-20 minutes a config
# (results/verl-qwen2.5-1.5b-h200x4-lanes.json), and without the second trial (--rounds 1)
# 14-18 minutes, the four layouts at once (results/verl-qwen2.5-1.5b-h200x4-layouts.json).
# LAYOUT_CONFIGS: the configs, in order (default "p4 p8 p16 dyn16384 pad4"; keep p4, the
# ratios' reference, among them); LAYOUT_GPUS: how many GPUs (default: the host's);
# LAYOUT_COMPARE_ARGS: verl_compare's arguments besides the configs (default below);
# LAYOUT_SKIP_VERL=1: the trials alone (each config --skip-verl; verl's environment is still
# installed, for the verl cut the trials count), e.g. with --rounds 3 to measure a change to
# the trials against a file of verl's runs already taken.
# usage: setsid nohup bash benchmarks/gpu/layout-verl.sh > /tmp/at/logs/plan.out 2>&1 &
#        on a host of four, one config a GPU: LAYOUT_CONFIGS="p4 p16 dyn16384 pad4" setsid ...
#        then: bash benchmarks/gpu/poll.sh SECONDS (packs $OUT/results.tgz, the comparison in
#        probe-verl/compare.json)
set -uo pipefail
A=actor_rollout_ref.actor.
declare -A layout=(
  [p4]="--set p4:${A}ppo_micro_batch_size_per_gpu=4"
  [p8]="--set p8:${A}ppo_micro_batch_size_per_gpu=8"
  [p16]="--set p16:${A}ppo_micro_batch_size_per_gpu=16"
  [dyn16384]="--set dyn16384:${A}use_dynamic_bsz=true --set dyn16384:${A}ppo_max_token_len_per_gpu=16384"
  [pad4]="--set pad4:${A}ppo_micro_batch_size_per_gpu=4 --set pad4:actor_rollout_ref.model.use_remove_padding=false"
)
configs=${LAYOUT_CONFIGS:-"p4 p8 p16 dyn16384 pad4"}
common=${LAYOUT_COMPARE_ARGS:-"--train-batch-size 32 --ppo-mini-batch-size 8 --trace --rounds 2 --verl-rounds 1 --trial-timeout 420 --verl-timeout 1000"}
for c in $configs; do
  [ -n "${layout[$c]:-}" ] || { echo "unknown config $c: give some of p4 p8 p16 dyn16384 pad4" >&2; exit 2; }
  [ -n "${LAYOUT_SKIP_VERL:-}" ] && layout[$c]+=" --skip-verl $c"
done
read -ra names <<< "$configs"
gpus=${LAYOUT_GPUS:-$(nvidia-smi -L | grep -c '^GPU')}
lanes=$((gpus < ${#names[@]} ? gpus : ${#names[@]}))
if [ "$lanes" -le 1 ]; then
  args=""
  for c in "${names[@]}"; do args+="--config $c=defaults ${layout[$c]} "; done
  COMPARE_ARGS="$args$common" exec bash benchmarks/gpu/verl-h200.sh
fi
for v in $(compgen -e | grep -E '^LANE_[0-9]+(_THEN)?$'); do unset "$v"; done
for i in "${!names[@]}"; do
  lane=LANE_$((i % lanes)) c=${names[$i]}
  export "$lane=${!lane:-}--config $c=defaults ${layout[$c]} "
done
for ((g = 0; g < lanes; g++)); do lane=LANE_$g; export "$lane=${!lane}$common"; done
export LANE_CPUS=${LANE_CPUS-numa}
exec bash benchmarks/gpu/verl-lanes.sh
