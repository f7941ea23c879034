#!/usr/bin/env bash
# The test suite, as the README's test command and .ci/run run it. Most tests spend their
# time waiting (trial processes, engine and Ray start-ups, servers, polling), so they run on
# AUTOTUNER_TEST_WORKERS pytest-xdist workers (default 3, on 2 cores), long tests first;
# tests sharing a server or browser fixture run on one worker (tests/conftest.py). Tests
# marked `serial` run alone first. Arguments go to both pytest runs (e.g. tests/api, -x).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
status=0
if grep -rqs --include='*.py' "mark.serial" tests; then
  "$PY" -m pytest -p no:xdist -m serial "$@" || { rc=$?; [ "$rc" -eq 5 ] || status=$rc; }  # 5: none selected
fi
"$PY" -m pytest -n "${AUTOTUNER_TEST_WORKERS:-3}" --dist loadgroup -m "not serial" --durations=15 "$@" || status=$?
exit "$status"
