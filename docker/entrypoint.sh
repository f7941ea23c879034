#!/usr/bin/env bash
# One entrypoint for every autotuner container; the first argument is its role:
#   head            a Ray head (no CPUs or GPUs of its own for trials)
#   api             a Ray node without trial resources that runs the API service and
#                   its job runner (the Ray driver) against the head
#   worker          a Ray node offering this container's GPUs to trials
# Environment: RAY_HEAD (host:port of the head, default ray-head:6379); the API reads
# AUTOTUNER_* (database URL, token, ...).
set -euo pipefail
role=${1:?usage: entrypoint.sh head|api|worker}
head=${RAY_HEAD:-ray-head:6379}
case "$role" in
  head)
    exec ray start --head --port="${head##*:}" --num-cpus=0 --num-gpus=0 \
      --include-dashboard=false --disable-usage-stats --block
    ;;
  api)
    ray start --address="$head" --num-cpus=0 --num-gpus=0 --disable-usage-stats
    export AUTOTUNER_RAY_ADDRESS=auto
    exec autotuner serve
    ;;
  worker)
    exec ray start --address="$head" --disable-usage-stats --block
    ;;
  *) echo "unknown role $role: use head, api or worker" >&2; exit 2 ;;
esac
