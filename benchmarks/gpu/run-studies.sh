#!/usr/bin/env bash
# On the GPU host, after setup-host.sh: start a Ray head over the host's GPUs and run the
# given job specs as concurrent studies on it (AUTOTUNER_RAY_ADDRESS), each with its own
# SQLite database under /tmp/at/<job>. Everything is started detached (setsid), so the
# studies outlive the device call that started them; poll.sh collects their results.
# The code runs from a private copy (/tmp/repo), so later calls that refresh the working
# tree cannot change it under a running study.
# usage: [STUDY_GPUS=0,1,2] [STUDY_TAG=x] [RAY_RESTART=1] bash benchmarks/gpu/run-studies.sh JOB.yaml...
# STUDY_GPUS: the GPUs Ray may give trials (default: all), leaving the rest for other work.
# STUDY_TAG: suffix of each study's directory (the same job run again on other GPUs).
# RAY_RESTART=1: stop the Ray head an earlier call started (its studies must be done).
# STUDY_RAY=local: no shared head; each study starts a local Ray over STUDY_GPUS (studies on
# other GPUs of the host, beside a head that an earlier call started over its own).
# STUDY_RESUME=DIR: go on with a job an earlier host started: DIR holds the <name>.db that
# poll.sh packed there (carried back in a later device call); its unfinished job resumes
# (`autotuner resume`: finished trials are kept, a silent runner's job is taken over), and
# <name>.command, the commands that ran it so far, when poll.sh packed one.
# The tuner and vLLM's trials use /tmp/site (setup-host.sh); the trials of sglang jobs get
# /tmp/site-sglang instead when setup-sglang.sh made it (AUTOTUNER_ENGINE_PYTHONPATH__SGLANG).
set -euo pipefail
mkdir -p /tmp/at/logs
if [ "${RAY_RESTART:-0}" = 1 ]; then
  PYTHONPATH=/tmp/site python3 -m ray.scripts.scripts stop --force > /tmp/at/logs/ray-stop.log 2>&1 || true
fi
if [ ! -d /tmp/repo ] || [ "${RAY_RESTART:-0}" = 1 ]; then
  rm -rf /tmp/repo && mkdir -p /tmp/repo
  cp -r autotuner trials storage benchmarks pyproject.toml /tmp/repo/
fi
cd /tmp/repo
source benchmarks/gpu/env.sh
if [ -n "${STUDY_GPUS:-}" ]; then
  export CUDA_VISIBLE_DEVICES=$STUDY_GPUS
  gpus=$(tr ',' '\n' <<< "$STUDY_GPUS" | grep -c .)
else
  gpus=$(nvidia-smi -L | wc -l)
fi
address=127.0.0.1:6390
if [ "${STUDY_RAY:-}" = local ]; then
  address=
elif [ "${RAY_RESTART:-0}" = 1 ] || [ ! -f /tmp/at/logs/ray.log ]; then  # one head per GPU set
  setsid python3 -m ray.scripts.scripts start --head --port 6390 --num-gpus "$gpus" \
    --include-dashboard=false --disable-usage-stats > /tmp/at/logs/ray.log 2>&1
fi
for job in "$@"; do
  name=$(basename "$job" .yaml)${STUDY_TAG:+-$STUDY_TAG}
  mkdir -p "/tmp/at/$name"
  # a resumed job's record starts with the commands of the hosts before (poll.sh packs it)
  if [ -n "${STUDY_RESUME:-}" ] && [ -f "$STUDY_RESUME/$name.command" ] && [ ! -f "/tmp/at/$name/command" ]; then
    cp "$STUDY_RESUME/$name.command" "/tmp/at/$name/command"
  fi
  echo "${STUDY_GPUS:+STUDY_GPUS=$STUDY_GPUS }${STUDY_TAG:+STUDY_TAG=$STUDY_TAG }${STUDY_RAY:+STUDY_RAY=$STUDY_RAY }${STUDY_RESUME:+STUDY_RESUME=$STUDY_RESUME }bash benchmarks/gpu/run-studies.sh $job${STUDY_PLAN:+ (from $STUDY_PLAN)}" >> "/tmp/at/$name/command"
  command=(tune "$job")
  if [ -n "${STUDY_RESUME:-}" ] && [ -f "$STUDY_RESUME/$name.db" ]; then
    cp "$STUDY_RESUME/$name.db" "/tmp/at/$name/autotuner.db"
    id=$(python3 -c "import sqlite3,sys; r=sqlite3.connect(sys.argv[1]).execute(\"select id from jobs where status in ('running','queued') order by created_at desc limit 1\").fetchone(); print(r[0] if r else '')" "/tmp/at/$name/autotuner.db")
    [ -n "$id" ] || { echo "no unfinished job in $STUDY_RESUME/$name.db"; continue; }
    command=(resume "$id")
  fi
  AUTOTUNER_RAY_ADDRESS=$address AUTOTUNER_DATA_DIR=/tmp/at/$name \
    setsid nohup python3 -m autotuner.cli "${command[@]}" >> "/tmp/at/logs/$name.log" 2>&1 < /dev/null &
  echo "$!" > "/tmp/at/logs/$name.pid"
  echo "started $name (pid $!, ${command[0]}) on ${address:-a local Ray} with $gpus GPUs"
done
