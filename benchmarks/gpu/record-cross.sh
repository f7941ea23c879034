#!/usr/bin/env bash
# On the GPU host, after setup-host.sh: record the search benchmark's cross design
# (benchmarks/search/jobs/qwen2.5-1.5b-h200-cross.yaml: 39 configs on the cross and 8 held
# out, each run twice), one recorder per GPU, detached; poll.sh packs the landscape
# (/tmp/at/landscape/*.json) with the recorders' logs. The recording resumes where a file
# carried from an earlier host of the same kind stopped: the landscape is named by the host's
# CPU count, and the recorders refuse a file recorded on another kind of host.
# usage: [RECORD_RESUME=FILE] [RECORD_GPUS="0 1"] [RECORD_UNTIL=WHEN] bash benchmarks/gpu/record-cross.sh
# RECORD_RESUME: the sides landscape an earlier host packed (its runs are kept, its design reused).
# RECORD_UNTIL: when the host is given back (epoch seconds or ISO 8601): the recorders start no
# run not expected to end by then and exit (record.py --until), so poll.sh returns as they do.
set -euo pipefail
export LANDSCAPE_JOB=benchmarks/search/jobs/qwen2.5-1.5b-h200-cross.yaml
export LANDSCAPE=/tmp/at/landscape/qwen2.5-1.5b-h200-cross-sides-$(nproc --all)cpu.json
# The base's train side is dynamic batches of 28,672 tokens, the largest micro-batches the job
# searches; the other 35 engine settings run as engine sides alone (no training) and compose
# with it.
export RECORD_ARGS="--design cross --held-out 8 --repeats 2 --base actor_rollout_ref.actor.use_dynamic_bsz=true --base actor_rollout_ref.actor.ppo_max_token_len_per_gpu=28672${RECORD_UNTIL:+ --until $RECORD_UNTIL}"
source benchmarks/gpu/plan-lib.sh
if [ -n "${RECORD_RESUME:-}" ] && [ ! -f "$LANDSCAPE" ]; then
  cp "$RECORD_RESUME" "$LANDSCAPE"
  log "resuming $RECORD_RESUME"
fi
for gpu in ${RECORD_GPUS:-$(seq 0 $(($(nvidia-smi -L | wc -l) - 1)))}; do
  record "$gpu"
done
