#!/usr/bin/env bash
# On a 4-GPU H200 host, after setup-host.sh and setup-sglang.sh: the GPU work of the
# scale-out, SGLang and search benchmarks in one detached run, GPUs handed from one
# piece to the next as they free up (start it with setsid; poll.sh collects the results):
#   1. GPUs 0-3: the Qwen2-7B TP 1/2/4 job (qwen2-7b-grpo-8gpu-tp.yaml) on 4 GPUs.
#   2. GPUs 0,1: the same job on 2 GPUs.  Beside it, GPUs 2,3: the SGLang smoke test
#      (variants D and E, one per GPU), then, if both answer, the SGLang Qwen2.5-1.5B job.
#   3. Each GPU, once its piece of 2 is done: a recorder of the H200 landscape
#      (benchmarks/search/jobs/qwen2.5-1.5b-h200-landscape.yaml, one trial per GPU at a
#      time; the recorders share /tmp/at/landscape/qwen2.5-1.5b-h200.json) until it is full.
# usage: setsid nohup bash benchmarks/gpu/scale-out-x4.sh > /tmp/at/logs/plan.out 2>&1 &
set -uo pipefail
export STUDY_PLAN="bash benchmarks/gpu/scale-out-x4.sh"
source benchmarks/gpu/plan-lib.sh
echo $$ > /tmp/at/logs/plan.pid
TP_JOB=benchmarks/jobs/qwen2-7b-grpo-8gpu-tp.yaml
SGLANG_JOB=benchmarks/jobs/qwen2.5-1.5b-grpo-sglang.yaml

log "1: TP job on GPUs 0-3"
study 0,1,2,3 4gpus "$TP_JOB"

log "2: TP job on GPUs 0,1; SGLang on GPUs 2,3"
(study 0,1 2gpus "$TP_JOB"; record 0; record 1) &
(
  for v in D E; do
    gpu=$([ $v = D ] && echo 2 || echo 3)
    (cd /tmp/repo && CUDA_VISIBLE_DEVICES=$gpu PYTHONPATH=/tmp/site-sglang:/tmp/repo \
       timeout 300 python3 benchmarks/gpu/sglang_smoke.py --variants $v --budget-s 240 \
       --timeout-s 230 --out /tmp/at/smoke-$v > /tmp/at/logs/smoke-$v.log 2>&1) &
  done
  wait
  if grep -qE '^D +ok' /tmp/at/logs/smoke-D.log && grep -qE '^E +ok' /tmp/at/logs/smoke-E.log; then
    log "SGLang smoke ok: the SGLang job"
    study 2,3 sglang "$SGLANG_JOB"
  else
    log "SGLang smoke failed: $(grep -E '^[DE] ' /tmp/at/logs/smoke-*.log | tr '\n' ' ')"
  fi
  record 2; record 3
) &
wait
log "3: waiting for the recorders"
for g in 0 1 2 3; do wait_for /tmp/at/logs/record-gpu$g.pid; done
log "landscape: $(tail -n 1 /tmp/at/logs/record-gpu*.log | tr '\n' ' ')"
