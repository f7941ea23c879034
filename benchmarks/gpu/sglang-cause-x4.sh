#!/usr/bin/env bash
# A 4-GPU H200 run of 2026-11-21 (benchmarks/README.md), after setup-host.sh and setup-sglang.sh,
# detached:
#   1. GPU 0: a recorder of the H200 landscape (resuming benchmarks/search/landscapes/).
#      GPUs 1-3: benchmarks/gpu/engine_train_probe.py (where the SGLang trials' slow train
#      phases come from: SGLang with sleep_on_idle on GPU 1, SGLang as the trials run it on
#      GPU 2, vLLM on GPU 3), then a recorder each, until the landscape is full.
#   2. GPUs 0-3: the controlled TP sweep (jobs/qwen2-7b-grpo-8gpu-tp-sweep.yaml: TP 1, 2, 4
#      with the TP job's best train knobs).
# usage: setsid nohup bash benchmarks/gpu/sglang-cause-x4.sh > /tmp/at/logs/plan.out 2>&1 &
set -uo pipefail
export STUDY_PLAN="bash benchmarks/gpu/sglang-cause-x4.sh"
source benchmarks/gpu/plan-lib.sh
echo $$ > /tmp/at/logs/plan.pid
[ -f "$LANDSCAPE" ] || cp benchmarks/search/landscapes/qwen2.5-1.5b-h200.json "$LANDSCAPE"

log "1: landscape recorder on GPU 0; engine/train probe on GPUs 1-3"
record 0
(cd /tmp/repo && source benchmarks/gpu/env.sh &&
 python3 -m benchmarks.gpu.engine_train_probe --engines sglang:sleep_on_idle,sglang,vllm \
   --gpus 1,2,3 --out /tmp/at/probe > /tmp/at/logs/probe.log 2>&1)
log "probe done: $(tail -n 12 /tmp/at/logs/probe.log | tr '\n' '|')"
for g in 1 2 3; do record $g; done
for g in 0 1 2 3; do wait_for /tmp/at/logs/record-gpu$g.pid; done
log "landscape: $(tail -n 1 /tmp/at/logs/record-gpu*.log | tr '\n' ' ')"

log "2: TP sweep on GPUs 0-3"
study 0,1,2,3 4gpus benchmarks/jobs/qwen2-7b-grpo-8gpu-tp-sweep.yaml
log "plan done"
