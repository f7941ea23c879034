# Sourced by the GPU-host scripts (run-studies.sh, scale-out-x4.sh): the environment the
# tuner, its trials and the landscape recorders run with there, from the private copy of
# the code in /tmp/repo. NVLink multicast stays off (KINDS.md); flashinfer's sampler needs
# a cubin the bundle leaves out.
export PYTHONPATH=/tmp/site:/tmp/repo VLLM_USE_FLASHINFER_SAMPLER=0 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -d /tmp/site-sglang ]; then
  export AUTOTUNER_ENGINE_PYTHONPATH__SGLANG=/tmp/site-sglang
fi
