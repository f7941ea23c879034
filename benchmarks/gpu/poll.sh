#!/usr/bin/env bash
# On the GPU host: wait up to SECONDS (default 540) or until every study that
# run-studies.sh started has exited, then write each job's trials as JSON
# (dump_results) and a copy of its SQLite database to $OUT, and show the logs' tails.
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
for d in /tmp/at/*/; do
  name=$(basename "$d")
  [ "$name" = logs ] && continue
  AUTOTUNER_DATA_DIR=$d python3 -m benchmarks.gpu.dump_results "$OUT/$name.json" \
    "$(cat "$d/command" 2>/dev/null || echo "python3 -m autotuner.cli tune benchmarks/jobs/$name.yaml")" \
    "(concurrent studies on one Ray head started by benchmarks/gpu/run-studies.sh)"
  python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d)" \
    "$d/autotuner.db" "$OUT/$name.db"
done
for f in /tmp/at/logs/*.log; do echo "== $f"; tail -n 25 "$f"; done
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv
free -g | head -2
