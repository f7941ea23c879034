#!/usr/bin/env bash
# Started beside sglang-cause-x4.sh once the probe had found the cause of the SGLang trials'
# slow training (cuDNN's attention backend, which importing vLLM turns off and SGLang does
# not; trials/actor.py without_cudnn_attention): when that plan is done, on the fixed code,
#   GPUs 0,1: the probe again (SGLang, vLLM): the first train pass must be as fast as the next;
#   GPUs 2,3: the SGLang job (a first look at its trials' train phases with the fix).
# usage: setsid nohup bash benchmarks/gpu/sglang-cause-after.sh > /tmp/at/logs/after.out 2>&1 &
set -uo pipefail
export STUDY_PLAN="bash benchmarks/gpu/sglang-cause-after.sh"
source benchmarks/gpu/plan-lib.sh
echo $$ > /tmp/at/logs/after.pid
cp trials/actor.py /tmp/repo/trials/actor.py
wait_for /tmp/at/logs/plan.pid
log "GPUs 0,1: probe with the fix; GPUs 2,3: the SGLang job"
(cd /tmp/repo && source benchmarks/gpu/env.sh &&
 python3 -m benchmarks.gpu.engine_train_probe --engines sglang,vllm --gpus 0,1 \
   --out /tmp/at/probe-fixed > /tmp/at/logs/probe-fixed.log 2>&1) &
study 2,3 fixed benchmarks/jobs/qwen2.5-1.5b-grpo-sglang.yaml &
wait
log "after done"
