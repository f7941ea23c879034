#!/usr/bin/env bash
# On the GPU host (air-gapped): install SGLang's wheel bundle into a folder of its own,
# /tmp/site-sglang, beside vLLM's /tmp/site (the engines pin different versions of shared
# packages: flashinfer, xgrammar, transformers), and check that its offline Engine and this
# repository's trial code import there, with nothing of /tmp/site. The bundle comes from
#   bash ../shared/gpu-host/make-bundle.sh benchmarks/gpu/sglang-min.txt .bundle/sglang
# and its parts go into a folder of their own, /tmp/parts-sglang (setup-host.sh installs
# every bundle it finds in /tmp/parts into vLLM's folder).
# usage: bash benchmarks/gpu/setup-sglang.sh [PARTS_DIR]   (default /tmp/parts-sglang)
# run-studies.sh then gives the trials of sglang jobs this folder as their PYTHONPATH
# (AUTOTUNER_ENGINE_PYTHONPATH__SGLANG); the tuner itself keeps /tmp/site.
set -euo pipefail
parts=${1:-/tmp/parts-sglang}
site=/tmp/site-sglang
bash "$parts/unpack.sh" "$parts" "$site"
PYTHONPATH=$site:$PWD python3 -c "
import sglang, torch, transformers
from sglang.srt.entrypoints.engine import Engine
import trials.rollout.sglang, trials.train
print('sglang', sglang.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
PYTHONPATH=/tmp/site:$PWD AUTOTUNER_ENGINE_PYTHONPATH__SGLANG=$site python3 -c "
from autotuner.settings import Settings
from trials.launcher import engine_importable
s = Settings()
print('sglang trials:', engine_importable('sglang', s.python_for('sglang') or 'python3', s.trial_env_for('sglang')) or 'ok')"
