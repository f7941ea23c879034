# A GPU worker with one rollout engine (sglang), torch and transformers for the train
# phase; it joins the Ray cluster and runs trials. CUDA 13 as the engine's wheels expect.
FROM nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev build-essential && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . .
# The same install script CI runs, in its sglang mode.
RUN AUTOTUNER_ENGINE=sglang AUTOTUNER_DEV=0 PIP_CONSTRAINT=docker/constraints.txt bash scripts/setup.sh
ENV PATH=/app/.venv/bin:$PATH VLLM_USE_FLASHINFER_SAMPLER=0 \
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ENTRYPOINT ["docker/entrypoint.sh"]
CMD ["worker"]
