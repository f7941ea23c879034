#!/usr/bin/env bash
# On the GPU host (air-gapped): install the carried wheel bundles into /tmp/site and check
# the imports. The bundles come from ../shared/gpu-host/make-bundle.sh (vllm-0.24.0.txt) and
# benchmarks/gpu/control-min.txt; their parts are copied into /tmp/parts first.
set -euo pipefail
bash "${1:-.xfer}/unpack.sh" /tmp/parts /tmp/site
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import vllm, ray, optuna, sqlalchemy, alembic, torch; print('vllm', vllm.__version__, 'ray', ray.__version__, 'optuna', optuna.__version__, 'torch', torch.__version__)"
