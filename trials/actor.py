"""The actor's model and the tensors of one micro-batch, as verl's FSDP actor sees them.

The model is built from ``model_config`` with random weights (transformers,
``attn_implementation="sdpa"``) and runs its forward under autocast in the trial's
dtype, as verl's dp actor does. How it is held (FSDP2 sharding, fp32 master weights,
AdamW state, offload) is ``trials.actor_state``'s business; the trial runs one
data-parallel rank on its share of the sequences.

A micro-batch is laid out like verl's: sequences left-padded to a common length, so the
responses end together and only the last ``max_response + 1`` positions' logits are
materialised (verl slices the same response window).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PPO_CLIP = 0.2


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


def without_cudnn_attention() -> None:
    """Turn PyTorch's cuDNN attention backend off, process-wide (set once, before a model
    runs; a flag, so gradient checkpointing's recomputation in the backward sees it too).

    verl's actor computes attention with flash-attn. PyTorch's SDPA on Hopper prefers
    cuDNN's fused attention, which builds an execution plan for every new sequence length
    (a micro-batch's padded width): over a batch of varied lengths the first pass ran 4-6x
    slower than the next on an H200 (old-log-prob 9.6k against 60k tokens/s, update 3.5k
    against 15k; ``benchmarks/gpu/engine_train_probe.py``). Importing vLLM turns that
    backend off, SGLang leaves it on, so SGLang's trials alone paid it. Off here, every
    trial trains on the same kernels whatever its engine: flash, or memory-efficient where
    a padding mask is given.
    """
    torch.backends.cuda.enable_cudnn_sdp(False)


def build_causal_lm(
    model_config: dict[str, Any],
    dtype: torch.dtype,
    device: torch.device,
    gradient_checkpointing: bool,
) -> torch.nn.Module:
    """A randomly initialised causal LM for ``model_config`` (an HF config.json dict), its
    attention on SDPA without cuDNN's backend (``without_cudnn_attention``)."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {k: v for k, v in model_config.items() if k not in ("torch_dtype", "dtype", "auto_map")}
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config.use_cache = False
    without_cudnn_attention()
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", **{dtype_kw: dtype})
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


@dataclass
class MicroBatchTensors:
    input_ids: torch.Tensor  # (B, L), left-padded
    attention_mask: torch.Tensor  # (B, L)
    position_ids: torch.Tensor  # (B, L)
    labels: torch.Tensor  # (B, R): the last R tokens
    response_mask: torch.Tensor  # (B, R): 1 on each row's real response tokens
    real_tokens: int  # prompt + response tokens, padding excluded

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())


def micro_batch(
    sequences: list[np.ndarray],
    response_lengths: list[int],
    indices: tuple[int, ...],
    device: torch.device,
) -> MicroBatchTensors:
    """Tensors for the sequences ``indices`` (each ``sequences[i]`` is prompt + response ids)."""
    width = max(len(sequences[i]) for i in indices)
    resp = max(response_lengths[i] for i in indices)
    ids = np.zeros((len(indices), width), dtype=np.int64)
    mask = np.zeros((len(indices), width), dtype=np.int64)
    response_mask = np.zeros((len(indices), resp), dtype=np.float32)
    for row, i in enumerate(indices):
        n = len(sequences[i])
        ids[row, width - n :] = sequences[i]
        mask[row, width - n :] = 1
        response_mask[row, resp - response_lengths[i] :] = 1.0
    input_ids = torch.from_numpy(ids).to(device)
    attention_mask = torch.from_numpy(mask).to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return MicroBatchTensors(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        labels=input_ids[:, width - resp :],
        response_mask=torch.from_numpy(response_mask).to(device),
        real_tokens=int(mask.sum()),
    )


def response_log_probs(
    model: torch.nn.Module, mb: MicroBatchTensors, autocast: torch.dtype | None
) -> torch.Tensor:
    """Log-probabilities (float32, ``(B, R)``) of each response token under ``model``."""
    resp = mb.labels.shape[1]
    context = (
        torch.autocast(mb.input_ids.device.type, dtype=autocast)
        if autocast is not None
        else contextlib.nullcontext()
    )
    with context:
        out = model(
            input_ids=mb.input_ids,
            attention_mask=mb.attention_mask,
            position_ids=mb.position_ids,
            use_cache=False,
            logits_to_keep=resp + 1,
        )
    logits = out.logits[:, :-1, :].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, mb.labels.unsqueeze(-1)).squeeze(-1)


def policy_loss(log_probs: torch.Tensor, mb: MicroBatchTensors, advantages: torch.Tensor) -> torch.Tensor:
    """PPO's clipped surrogate on the response tokens (old log-probs = detached current)."""
    ratio = torch.exp(log_probs - log_probs.detach())
    surrogate = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - PPO_CLIP, 1 + PPO_CLIP))
    return (surrogate * mb.response_mask).sum() / mb.response_mask.sum().clamp(min=1.0)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device, non_blocking=True)
