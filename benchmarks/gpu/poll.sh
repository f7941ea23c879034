#!/usr/bin/env bash
# On the GPU host: wait up to SECONDS (default 540) or until every study, recorder and plan
# that run-studies.sh / scale-out-x4.sh / verl-h200.sh / verl-lanes.sh started has exited,
# then pack into $OUT/results.tgz each job's trials as JSON (dump_results) with a copy of its
# SQLite database and the commands that ran it (<name>.command, which STUDY_RESUME reads),
# the landscapes, the GPU tests' job databases (gpu-tests.sh), the SGLang smoke summaries,
# the probes' reports, the profiles of `verl_compare --profile /tmp/at/profiles`, the logs
# and plan outputs (those under 2 MiB), and each verl run's folder so far (metrics.jsonl,
# trace/, arrivals.json and the end of verl.log: what `verl_compare recover` rebuilds a run
# cut off with its host from); show the logs' tails. Safe to call while they run: it packs
# what is there so far.
# usage: bash benchmarks/gpu/poll.sh [SECONDS]
set -uo pipefail
cd /tmp/repo
export PYTHONPATH=/tmp/site:/tmp/repo
end=$((SECONDS + ${1:-540}))
while [ "$SECONDS" -lt "$end" ]; do
  alive=0
  for f in /tmp/at/logs/*.pid; do kill -0 "$(cat "$f")" 2>/dev/null && alive=1; done
  [ "$alive" = 0 ] && break
  sleep 10
done
pack=/tmp/at-out
# a consistent copy of a SQLite database that a job may still be writing
backup_db() {
  python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d)" "$1" "$2"
}
rm -rf "$pack" && mkdir -p "$pack/logs"
for d in /tmp/at/*/; do
  name=$(basename "$d")
  [ -f "$d/autotuner.db" ] || continue
  # every host's command, in order (a job resumed with STUDY_RESUME ran under several)
  [ -f "$d/command" ] && cp "$d/command" "$pack/$name.command"
  AUTOTUNER_DATA_DIR=$d python3 -m benchmarks.gpu.dump_results "$pack/$name.json" \
    "$(awk 'NR > 1 { printf "; then " } { printf "%s", $0 }' "$d/command" 2>/dev/null ||
      echo "python3 -m autotuner.cli tune benchmarks/jobs/$name.yaml")" \
    "(benchmarks/gpu/run-studies.sh: one SQLite database per study)"
  backup_db "$d/autotuner.db" "$pack/$name.db"
done
cp /tmp/at/landscape/*.json "$pack/" 2>/dev/null
shopt -s nullglob
# profiles of update micro-batches (verl_compare --profile /tmp/at/profiles)
[ -d /tmp/at/profiles ] && cp -r /tmp/at/profiles "$pack/"
for p in /tmp/at/probe*/; do mkdir -p "$pack/$(basename "$p")" && cp "$p"*.json "$pack/$(basename "$p")/" 2>/dev/null; done
# verl runs still going (or cut off): what they logged so far, for verl_compare recover.
for r in /tmp/verl-*/run; do
  [ -f "$r/metrics.jsonl" ] || continue
  dest="$pack/verl-runs/$(basename "$(dirname "$r")")"
  mkdir -p "$dest/trace" && cp "$r/metrics.jsonl" "$dest/" && cp "$r"/trace/*.jsonl "$dest/trace/" 2>/dev/null
  cp "$r/arrivals.json" "$dest/" 2>/dev/null
  tail -c 2000000 "$r/verl.log" > "$dest/verl.log" 2>/dev/null
done
# the jobs of GPU tests (gpu-tests.sh): each test's SQLite database, named by its test folder
for db in /tmp/pytest-of-*/pytest-*/*/data/autotuner.db; do
  name=$(basename "$(dirname "$(dirname "$db")")")
  mkdir -p "$pack/gpu-tests" && backup_db "$db" "$pack/gpu-tests/$name.db"
done
for s in /tmp/at/smoke-*/summary.json; do [ -f "$s" ] && cp "$s" "$pack/$(basename "$(dirname "$s")").json"; done
find /tmp/at /tmp/at-record \( -name '*.log' -o -name '*.out' \) -size -2M -print0 2>/dev/null |
  while IFS= read -r -d '' f; do cp "$f" "$pack/logs/$(echo "${f#/tmp/}" | tr '/' '_')"; done
tar czf "$OUT/results.tgz" -C "$pack" .
ls -la "$OUT/results.tgz"
for f in /tmp/at/logs/*.log /tmp/at/logs/*.out; do [ -f "$f" ] && { echo "== $f"; tail -n 15 "$f"; }; done
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv
free -g | head -2
