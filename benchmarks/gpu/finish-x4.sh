#!/usr/bin/env bash
# On a 4-GPU H200 host, after setup-host.sh and setup-sglang.sh: what the fourth session's
# run (scale-out-x4.sh; benchmarks/README.md) left, in one detached run:
#   1. GPUs 0-3: the rollout's TP alone, the other knobs fixed
#      (jobs/qwen2-7b-grpo-8gpu-tp-sweep.yaml: TP 1, 2 and 4, verl's defaults first).
#   2. GPUs 0,1: the same sweep on 2 GPUs (TP 4 refused there). Beside it, GPU 2 and GPU 3:
#      the SGLang job's train phases alone (no engine) in SGLang's and in vLLM's trial
#      environment (jobs/qwen2.5-1.5b-train-only-{sglang,vllm}-env.yaml), to tell whether
#      the slow training of the SGLang trials comes from that environment or from the engine.
#   3. Each GPU, once its piece of 2 is done: a recorder of the H200 landscape, resuming the
#      file in benchmarks/search/landscapes/ (12 of 24 configs recorded) until it is full.
# usage: setsid nohup bash benchmarks/gpu/finish-x4.sh > /tmp/at/logs/plan.out 2>&1 &
set -uo pipefail
export STUDY_PLAN="bash benchmarks/gpu/finish-x4.sh"
source benchmarks/gpu/plan-lib.sh
echo $$ > /tmp/at/logs/plan.pid
SWEEP=benchmarks/jobs/qwen2-7b-grpo-8gpu-tp-sweep.yaml
[ -f "$LANDSCAPE" ] || cp benchmarks/search/landscapes/qwen2.5-1.5b-h200.json "$LANDSCAPE"

log "1: TP sweep on GPUs 0-3"
study 0,1,2,3 4gpus "$SWEEP"

log "2: TP sweep on GPUs 0,1; train-only in SGLang's and vLLM's environments on GPUs 2, 3"
(study 0,1 2gpus "$SWEEP"; record 0; record 1) &
(study 2 diag benchmarks/jobs/qwen2.5-1.5b-train-only-sglang-env.yaml; record 2) &
(study 3 diag benchmarks/jobs/qwen2.5-1.5b-train-only-vllm-env.yaml; record 3) &
wait
log "3: waiting for the recorders"
for g in 0 1 2 3; do wait_for /tmp/at/logs/record-gpu$g.pid; done
log "landscape: $(tail -n 1 /tmp/at/logs/record-gpu*.log | tr '\n' ' ')"
