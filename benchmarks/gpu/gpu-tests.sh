#!/usr/bin/env bash
# One GPU host: pytest's `gpu` tests that need verl beside vLLM, detached. Wheels as for
# verl-h200.sh (vLLM 0.24.0 + the control bundle in /tmp/parts, verl's bundle and antlr4's
# wheel in /tmp/parts-verl, flash-attn's parts in /tmp/parts-fa). TESTS: pytest's paths and
# arguments (default: a tuning job that verifies in verl, tests/autotuner/test_gpu_verification.py).
# The tests run from the private copy of the code in /tmp/repo; each test job's SQLite
# database is packed by poll.sh.
# usage: setsid nohup bash benchmarks/gpu/gpu-tests.sh > /tmp/at/logs/plan.out 2>&1 &
#        then: bash benchmarks/gpu/poll.sh SECONDS (packs $OUT/results.tgz)
set -uo pipefail
src=$PWD
source benchmarks/gpu/verl-host.sh
cp -r "$src/tests" /tmp/repo/
tests=${TESTS:-tests/autotuner/test_gpu_verification.py}
log "GPU tests $tests"
# shellcheck disable=SC2086
python3 -m pytest -p no:cacheprovider -p no:xdist -m gpu $tests -v -rP -rs --durations=10 \
  > /tmp/at/logs/gpu-tests.log 2>&1
log "GPU tests: $(tail -n 1 /tmp/at/logs/gpu-tests.log)"
log "plan done"
