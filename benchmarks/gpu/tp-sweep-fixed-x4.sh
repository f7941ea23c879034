#!/usr/bin/env bash
# The 4-GPU H200 run of 2026-11-21 after sglang-cause-x4.sh's (benchmarks/README.md), after
# setup-host.sh and setup-sglang.sh, detached (about 25 minutes):
#   1. GPUs 0-3: the controlled TP sweep again (jobs/qwen2-7b-grpo-8gpu-tp-sweep.yaml: TP 1, 2,
#      4 with the TP job's best train knobs), now that every rank of a multi-GPU trial trains
#      without cuDNN attention (sglang-cause-x4.sh's sweep was confounded by it:
#      benchmarks/README.md): HybridFlow's question.
#   2. GPUs 0-2: the SGLang job (jobs/qwen2.5-1.5b-grpo-sglang.yaml, three trials at a time, 20
#      measured trials or 15 minutes at most); GPU 3: its vLLM twin, the same workload, baselines
#      (verl's defaults, the production command, a landscape point) and sampler, one at a
#      time; then python3 -m benchmarks.gpu.report --compare TWIN.json SGLANG.json. The host
#      may be taken back first: poll.sh packs what is recorded by then.
# usage: setsid nohup bash benchmarks/gpu/tp-sweep-fixed-x4.sh > /tmp/at/logs/plan.out 2>&1 &
set -uo pipefail
export STUDY_PLAN="bash benchmarks/gpu/tp-sweep-fixed-x4.sh"
source benchmarks/gpu/plan-lib.sh
echo $$ > /tmp/at/logs/plan.pid

log "1: TP sweep on GPUs 0-3"
study 0,1,2,3 4gpus benchmarks/jobs/qwen2-7b-grpo-8gpu-tp-sweep.yaml

log "2: the SGLang job on GPUs 0-2, its vLLM twin on GPU 3"
study 0,1,2 pair benchmarks/jobs/qwen2.5-1.5b-grpo-sglang.yaml &
study 3 pair benchmarks/jobs/qwen2.5-1.5b-grpo-vllm-twin.yaml &
wait
log "plan done"
