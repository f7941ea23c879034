#!/usr/bin/env bash
# On the GPU host (air-gapped): install verl 0.9.1's wheel bundle into a folder of its own,
# /tmp/site-verl (verl pins transformers<5.11; the host has 5.17 and vLLM's folder none), and
# check that verl's trainer, vLLM and this repository's verl step runner import there, with
# /tmp/site-verl before vLLM's /tmp/site on PYTHONPATH. The bundle comes from
#   bash ../shared/gpu-host/make-bundle.sh benchmarks/gpu/verl-0.9.1.txt .bundle/verl
# and its parts go into a folder of their own, /tmp/parts-verl, with the wheel of
# antlr4-python3-runtime 4.9.3 beside them (PyPI has only its source: build it where pip
# works with `pip wheel --no-deps antlr4-python3-runtime==4.9.3`).
# usage: bash benchmarks/gpu/setup-verl.sh [PARTS_DIR]   (default /tmp/parts-verl)
# Then verl's runs get this folder (and vLLM's) as their PYTHONPATH:
#   export AUTOTUNER_ENGINE_PYTHONPATH__VERL=/tmp/site-verl:/tmp/site
set -euo pipefail
parts=${1:-/tmp/parts-verl}
site=/tmp/site-verl
bash "$parts/unpack.sh" "$parts" "$site"
antlr=$(ls "$parts"/antlr4_python3_runtime-4.9.3-*.whl 2>/dev/null | head -1 || true)
[ -n "$antlr" ] || { echo "no antlr4_python3_runtime-4.9.3 wheel in $parts (see the header)" >&2; exit 2; }
python3 -m pip install -q --no-deps --no-index --target "$site" "$antlr"
if [ -d /tmp/flash-attn ] && [ ! -d "$site/flash_attn" ]; then
  echo "note: flash-attn is not in $site; install ../shared/gpu-host/flash-attn's wheel there" >&2
fi
PYTHONPATH=$site:/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 python3 -c "
import verl, vllm, torch, transformers, tensordict, transfer_queue
from verl.trainer import main_ppo
from verl.experimental.agent_loop.agent_loop import AgentLoopBase
import trials.verl.runner, trials.verl.agent_loop
print('verl', verl.__version__, 'vllm', vllm.__version__, 'torch', torch.__version__,
      'transformers', transformers.__version__, 'tensordict', tensordict.__version__)"
PYTHONPATH=/tmp/site:$PWD AUTOTUNER_ENGINE_PYTHONPATH__VERL=$site:/tmp/site python3 -c "
from autotuner.settings import Settings
from trials.launcher import engine_importable
s = Settings()
print('verl runs:', engine_importable('verl', s.verl_python() or 'python3', s.trial_env_for('verl')) or 'ok')"
