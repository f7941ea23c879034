#!/usr/bin/env bash
# On an H200 host: the trials' train phase against verl's layouts (layout_bench.py), then the
# Qwen2.5-1.5B GRPO-like job with verl's two baselines (jobs/qwen2.5-1.5b-grpo.yaml), detached.
# PLAN_JOB=benchmarks/jobs/qwen2-7b-grpo-8gpu.yaml: that job instead (any job spec); PLAN_JOB=none:
# no job (with PLAN_THEN=cross, the cross design alone on STUDY_GPUS).
# Wheels first: vLLM 0.24.0 + the control bundle in /tmp/parts (../shared/gpu-host/make-bundle.sh),
# flash-attn 2.8.3.post2's four parts in /tmp/parts-fa (../shared/gpu-host/flash-attn).
# PLAN_LAYOUT=0: the job alone. STUDY_GPUS=0,1,2,3: the job's trials on those GPUs (default 0).
# The host's speed (host_speed.py) is measured first, into /tmp/at/probe-host/host-speed.json.
# STUDY_RESUME=DIR: go on with the job whose database an earlier host packed (run-studies.sh).
# PLAN_THEN=cross: once the job has ended, the search benchmark's cross design on the job's GPUs
# (record-cross.sh), resuming benchmarks/search/landscapes/qwen2.5-1.5b-h200-cross-sides-<N>cpu.json
# for a host of N CPUs (one landscape per kind of host) where the checkout has it (the landscape
# poll.sh packed on an earlier host of that kind). RECORD_UNTIL=WHEN: the recorders start no run
# not expected to end by then (record-cross.sh).
# usage: setsid nohup bash benchmarks/gpu/fidelity-h200.sh > /tmp/at/logs/plan.out 2>&1 &
#        then: bash benchmarks/gpu/poll.sh SECONDS (packs $OUT/results.tgz)
set -uo pipefail
mkdir -p /tmp/at/logs /tmp/at/probe-layout
echo $$ > /tmp/at/logs/plan.pid
log() { echo "[$(date +%T)] $*"; }
log "installing"
bash /tmp/parts/unpack.sh /tmp/parts /tmp/site
cat /tmp/parts-fa/fa.part.* > /tmp/flash_attn-2.8.3.post2-cp312-cp312-linux_x86_64.whl
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  /tmp/flash_attn-2.8.3.post2-cp312-cp312-linux_x86_64.whl
rm -rf /tmp/repo && mkdir -p /tmp/repo && cp -r autotuner trials storage benchmarks pyproject.toml /tmp/repo/
cd /tmp/repo
source benchmarks/gpu/env.sh
python3 -c "import vllm, flash_attn, ray, optuna, torch; print('vllm', vllm.__version__, 'flash_attn', flash_attn.__version__, 'torch', torch.__version__)"
# the host's speed at driving its GPU, before anything runs (poll.sh packs probe-host/)
mkdir -p /tmp/at/probe-host
python3 -m benchmarks.gpu.host_speed --ops 100000 --out /tmp/at/probe-host/host-speed.json \
  > /tmp/at/logs/host-speed.log 2>&1
log "host speed: $(tail -n 3 /tmp/at/logs/host-speed.log | tr '\n' ' ')"
if [ "${PLAN_LAYOUT:-1}" = 1 ]; then
  log "1: layout benchmark"
  python3 -m benchmarks.gpu.layout_bench --out /tmp/at/probe-layout/layout-h200.json --repeats 3 \
    > /tmp/at/logs/layout.log 2>&1
  log "layout done: $(tail -n 8 /tmp/at/logs/layout.log)"
fi
job=${PLAN_JOB:-benchmarks/jobs/qwen2.5-1.5b-grpo.yaml}
if [ "$job" != none ]; then
  log "2: the job $job"
  STUDY_RAY=local STUDY_GPUS=${STUDY_GPUS:-0} bash benchmarks/gpu/run-studies.sh "$job"
  study=$(basename "$job" .yaml)${STUDY_TAG:+-$STUDY_TAG}
  while kill -0 "$(cat "/tmp/at/logs/$study.pid")" 2>/dev/null; do sleep 5; done
  log "the job ended: $(tail -n 1 "/tmp/at/logs/$study.log")"
fi
if [ "${PLAN_THEN:-}" = cross ]; then
  sides=benchmarks/search/landscapes/qwen2.5-1.5b-h200-cross-sides-$(nproc --all)cpu.json
  log "3: the search benchmark's cross design${STUDY_GPUS:+ on GPUs $STUDY_GPUS}"
  RECORD_GPUS=$(tr ',' ' ' <<< "${STUDY_GPUS:-0}") RECORD_RESUME=$([ -f "$sides" ] && echo "$sides") \
    bash benchmarks/gpu/record-cross.sh
fi
log "plan done"
