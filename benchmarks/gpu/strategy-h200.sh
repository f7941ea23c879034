#!/usr/bin/env bash
# One GPU: the trials' actor built as verl v0.9's default strategy builds it (FSDP1, `fsdp`)
# against FSDP2 (`fsdp2`), detached. Wheels as for verl-h200.sh (vLLM 0.24.0 + the control
# bundle in /tmp/parts, verl's bundle and antlr4's wheel in /tmp/parts-verl, flash-attn's
# parts in /tmp/parts-fa). In order, each step skipped when its variable is empty:
# - GPU_TESTS (default "fsdp1"): the GPU tests (test_gpu.py, test_weight_sync.py) selected
#   by `pytest -k`;
# - LAYOUT_ARGS (default "--strategy fsdp --repeats 3"): layout_bench.py's rows;
# - COMPARE_ARGS (default: verl's defaults, trials with both strategies, then verl on it, 32
#   prompts x 8 per step): verl_compare.py on the Qwen2.5-1.5B GRPO-like job, or on
#   COMPARE_JOB (e.g. jobs/qwen2-7b-grpo-4gpu-world.yaml on a host of four GPUs).
# usage: setsid nohup bash benchmarks/gpu/strategy-h200.sh > /tmp/at/logs/plan.out 2>&1 &
#        then: bash benchmarks/gpu/poll.sh SECONDS (packs $OUT/results.tgz)
set -uo pipefail
src=$PWD
source benchmarks/gpu/verl-host.sh
mkdir -p /tmp/at/probe-layout
tests=${GPU_TESTS-fsdp1}
layout=${LAYOUT_ARGS-"--strategy fsdp --repeats 3"}
compare=${COMPARE_ARGS-"--config defaults --actor-strategy fsdp --actor-strategy fsdp2 --train-batch-size 32 --ppo-mini-batch-size 8 --trace --trial-timeout 420 --verl-timeout 1100"}
if [ -n "$tests" ]; then
  log "GPU tests -k $tests"
  (cd "$src" && PYTHONPATH=/tmp/site:$src python3 -m pytest -p no:cacheprovider -m gpu \
    tests/trials/test_gpu.py tests/trials/test_weight_sync.py -k "$tests" -v > /tmp/at/logs/gpu-tests.log 2>&1)
  log "GPU tests: $(tail -n 1 /tmp/at/logs/gpu-tests.log)"
fi
if [ -n "$layout" ]; then
  log "layout_bench $layout"
  # shellcheck disable=SC2086
  python3 -m benchmarks.gpu.layout_bench $layout --out /tmp/at/probe-layout/layout.json \
    > /tmp/at/logs/layout.log 2>&1
  log "layout done"
fi
if [ -n "$compare" ]; then
  log "verl_compare $compare"
  # shellcheck disable=SC2086
  python3 -m benchmarks.gpu.verl_compare --job "${COMPARE_JOB:-benchmarks/jobs/qwen2.5-1.5b-grpo.yaml}" $compare \
    --out /tmp/at/probe-verl/compare.json > /tmp/at/logs/verl.log 2>&1
fi
log "plan done"
