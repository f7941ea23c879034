#!/usr/bin/env bash
# One GPU: the same config's trial from several checkouts of the code, interleaved (A, B, A,
# B, ...), to tell a change of the trials' own step from the host's noise; then, with
# AB_VERL=1, verl's run of the config. Wheels as for strategy-h200.sh (verl-host.sh).
# - AB_TREES: NAME=DIR pairs, in the order each round runs them; DIR holds a checkout's
#   autotuner, trials, storage, benchmarks and pyproject.toml (`.` is this one), e.g. one
#   made here by `git archive REV autotuner trials storage benchmarks/__init__.py
#   benchmarks/gpu pyproject.toml | tar x -C .ab/REV` and carried;
# - AB_ROUNDS (default 3); AB_JOB (default the Qwen2.5-0.5B weight-sync job), this
#   checkout's file, which every tree runs; AB_CONFIG (default verl's defaults); AB_THEN:
#   NAME=DIR pairs run once each after the rounds.
# Each trial is `verl_compare --skip-verl` of its checkout, into
# /tmp/at/probe-ab/NAME-ROUND.json; the host's speed (host_speed.py) is measured first.
# usage: AB_TREES="old=.ab/8761727 new=." setsid nohup bash benchmarks/gpu/trial-ab.sh \
#          > /tmp/at/logs/plan.out 2>&1 &   then: bash benchmarks/gpu/poll.sh SECONDS
set -uo pipefail
src=$PWD
source benchmarks/gpu/verl-host.sh
job=$PWD/${AB_JOB:-benchmarks/jobs/qwen2.5-0.5b-weight-sync.yaml}
config=${AB_CONFIG:-defaults}
out=/tmp/at/probe-ab
mkdir -p "$out"
python3 -m benchmarks.gpu.host_speed --ops 100000 --out "$out/host-speed.json" > /tmp/at/logs/host-speed.log 2>&1
log "host speed: $(tail -n 4 /tmp/at/logs/host-speed.log | tr '\n' ' ')"
declare -A trees=()
for pair in ${AB_TREES:?NAME=DIR pairs} ${AB_THEN:-}; do
  name=${pair%%=*} dir=${pair#*=}
  [ -n "${trees[$name]:-}" ] && continue
  trees[$name]=/tmp/ab/$name
  rm -rf "/tmp/ab/$name" && mkdir -p "/tmp/ab/$name"
  (cd "$src/$dir" && cp -r autotuner trials storage benchmarks pyproject.toml "/tmp/ab/$name/")
  log "tree $name: $dir"
done
trial() {  # NAME ROUND
  log "trial $1 round $2"
  (cd "${trees[$1]}" && PYTHONPATH=/tmp/site:${trees[$1]} python3 -m benchmarks.gpu.verl_compare \
    --job "$job" --config "$config" --skip-verl "$config" --steps 4 --trial-timeout 400 \
    --out "$out/$1-$2.json" > "/tmp/at/logs/ab-$1-$2.log" 2>&1)
  log "  $( (grep -m1 -E '^  [a-z]+ ' "/tmp/at/logs/ab-$1-$2.log" || tail -n 1 "/tmp/at/logs/ab-$1-$2.log") | cut -c1-240)"
}
for round in $(seq 0 $(( ${AB_ROUNDS:-3} - 1 ))); do
  for pair in $AB_TREES; do trial "${pair%%=*}" "$round"; done
done
for pair in ${AB_THEN:-}; do trial "${pair%%=*}" then; done
if [ "${AB_VERL:-0}" = 1 ]; then
  log "verl $config"
  python3 -m benchmarks.gpu.verl_compare --job "$job" --config "$config" --skip-trial "$config" \
    --trace --steps 4 --verl-timeout 600 --out "$out/verl.json" > /tmp/at/logs/ab-verl.log 2>&1
  log "  $( (grep -m1 -E '^  [a-z]+ ' /tmp/at/logs/ab-verl.log || tail -n 1 /tmp/at/logs/ab-verl.log) | cut -c1-240)"
fi
log "plan done"
