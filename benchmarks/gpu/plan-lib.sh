# Sourced by the GPU plans (scale-out-x4.sh, sglang-cause-x4.sh, tp-sweep-fixed-x4.sh): run pieces of GPU work on chosen
# GPUs of one host, detached, each waiting for the GPUs it needs. Logs in /tmp/at/logs.
LANDSCAPE_JOB=${LANDSCAPE_JOB:-benchmarks/search/jobs/qwen2.5-1.5b-h200-landscape.yaml}
LANDSCAPE=${LANDSCAPE:-/tmp/at/landscape/qwen2.5-1.5b-h200.json}
mkdir -p /tmp/at/logs /tmp/at/landscape
if [ ! -d /tmp/repo ]; then  # the private copy run-studies.sh makes, for the recorders too
  mkdir -p /tmp/repo && cp -r autotuner trials storage benchmarks pyproject.toml /tmp/repo/
fi
log() { echo "[$(date +%T)] $*"; }
wait_for() { while kill -0 "$(cat "$1")" 2>/dev/null; do sleep 5; done; }
study() {  # GPUS TAG JOB: a study on a local Ray of its own over GPUS; waits for it
  STUDY_RAY=local STUDY_GPUS=$1 STUDY_TAG=$2 bash benchmarks/gpu/run-studies.sh "$3"
  wait_for "/tmp/at/logs/$(basename "$3" .yaml)-$2.pid"
  log "study $(basename "$3" .yaml)-$2 done: $(tail -n 1 "/tmp/at/logs/$(basename "$3" .yaml)-$2.log")"
}
record() {  # GPU: a landscape recorder on that GPU (detached, like the studies); RECORD_ARGS
  # go to the recorder (e.g. "--design cross --held-out 8 --repeats 2")
  # shellcheck disable=SC2086
  (cd /tmp/repo && source benchmarks/gpu/env.sh &&
   CUDA_VISIBLE_DEVICES=$1 AUTOTUNER_DATA_DIR=/tmp/at-record/gpu$1 \
     setsid nohup python3 -m benchmarks.search.record "$LANDSCAPE_JOB" "$LANDSCAPE" ${RECORD_ARGS:-} \
     > "/tmp/at/logs/record-gpu$1.log" 2>&1 < /dev/null &
   echo $! > "/tmp/at/logs/record-gpu$1.pid")
  log "recorder on GPU $1"
}
