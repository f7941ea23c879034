# Sourced by verl-h200.sh and verl-lanes.sh on the GPU host: installs what a comparison of the
# trial and verl needs (once per host) from the wheels already carried there (vLLM 0.24.0 +
# the control bundle in /tmp/parts, verl's bundle and antlr4's wheel in /tmp/parts-verl,
# flash-attn 2.8.3.post2's four parts in /tmp/parts-fa; see setup-verl.sh and
# ../shared/gpu-host), copies the code to /tmp/repo, enters it and sets the environment.
mkdir -p /tmp/at/logs /tmp/at/probe-verl
echo $$ > /tmp/at/logs/plan.pid
log() { echo "[$(date +%T)] $*"; }
if [ ! -d /tmp/site/vllm ]; then
  log "installing"
  bash /tmp/parts/unpack.sh /tmp/parts /tmp/site
  cat /tmp/parts-fa/fa.part.* > /tmp/flash_attn-2.8.3.post2-cp312-cp312-linux_x86_64.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    /tmp/flash_attn-2.8.3.post2-cp312-cp312-linux_x86_64.whl
  cp /tmp/parts/unpack.sh /tmp/parts-verl/ 2>/dev/null || true
  bash benchmarks/gpu/setup-verl.sh /tmp/parts-verl
fi
rm -rf /tmp/repo && mkdir -p /tmp/repo && cp -r autotuner trials storage benchmarks pyproject.toml /tmp/repo/
cd /tmp/repo || exit 1
source benchmarks/gpu/env.sh
export AUTOTUNER_ENGINE_PYTHONPATH__VERL=/tmp/site-verl:/tmp/site
